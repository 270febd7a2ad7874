"""One vLLM server, spoken to over the subset of its OpenAI-compatible API molrl uses.

- ``POST /v1/completions``: the prompt as token ids, one completion (n=1) with its seed, streamed; each chunk holds
  the new token ids (``return_token_ids``) and their log-probs (``logprobs=0``: the sampled token's own, which a
  server started with ``--logprobs-mode processed_logprobs`` gives at the sampling temperature). A streamed request
  can be cancelled between chunks: the connection is closed, vLLM aborts it, and the tokens so far are kept.
- ``GET /v1/models``: the base the server holds and the adapters loaded on it.
- ``POST /v1/load_lora_adapter`` / ``/v1/unload_lora_adapter``: the trained adapter, by name and a path the server
  reads (the server needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, which ``molrl serve`` sets).
- ``GET /health``.

A server that cannot be reached, or whose connection drops, raises ``ServerDown`` (the pool resends the request
elsewhere); one that answers with an error status raises ``ServerRefused`` (a bad request goes nowhere else).
"""

from __future__ import annotations

import http.client
import json
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from molrl.engines import server_address
from molrl.errors import MolrlError

CONNECT_TIMEOUT_S = 30.0
"""Seconds to wait for a server to accept a connection or answer a short call (models, adapters, health)."""
READ_TIMEOUT_S = 3600.0
"""Seconds a streamed completion may go without a chunk (a busy server queues requests) before it counts as down."""


class ServerDown(MolrlError):
    """The server could not be reached, or dropped the connection mid-request."""

    def __init__(self, url: str, reason: str):
        self.url, self.reason = url, reason
        super().__init__(f"engine server {url} is down: {reason}")


class ServerRefused(MolrlError):
    """The server answered a request with an error status."""


@dataclass(frozen=True)
class RequestParams:
    """What one completion request samples with."""

    max_tokens: int
    """Most new tokens."""
    temperature: float
    """Sampling temperature (the engine's log-probs are taken at it)."""
    top_p: float = 1.0
    """Nucleus sampling's mass."""
    top_k: int = 0
    """Top-k sampling's k; 0: off."""
    stop: tuple[str, ...] = ()
    """Stop strings, kept in the output."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end a completion (kept in the output)."""
    seed: int | None = None
    """The request's own seed; None: the server's."""


@dataclass
class Reply:
    """One request's result."""

    ids: list[int]
    """The sampled token ids (an end token that ended the completion included)."""
    logps: list[float]
    """The engine's log-prob of each sampled id, at the sampling temperature."""
    finish_reason: str | None
    """``stop`` or ``length`` as the server said; None: cancelled before it finished."""

    @property
    def finished(self) -> bool:
        """The server ended the completion (at an end token, a stop string or ``max_tokens``)."""
        return self.finish_reason is not None


def completion_body(model: str, ids: Sequence[int], params: RequestParams) -> dict[str, Any]:
    """The JSON body of a streamed completion request for the token ids ``ids`` on ``model`` (a base or adapter name)."""
    body: dict[str, Any] = {
        "model": model, "prompt": [int(i) for i in ids], "n": 1, "stream": True,
        "max_tokens": params.max_tokens, "temperature": params.temperature, "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True,
        "stop": list(params.stop), "include_stop_str_in_output": True,
        "stop_token_ids": [int(i) for i in params.stop_token_ids], "skip_special_tokens": False,
    }
    if params.seed is not None:
        body["seed"] = params.seed
    return body


def chunk_tokens(chunk: dict[str, Any], url: str = "") -> tuple[list[int], list[float], str | None]:
    """A streamed chunk's new token ids, their log-probs and its finish reason (None while the request runs)."""
    choices = chunk.get("choices") or []
    if not choices:  # a usage-only chunk
        return [], [], None
    choice = choices[0]
    logprobs = choice.get("logprobs") or {}
    ids = choice.get("token_ids")
    if ids is None:  # a server that does not send token_ids: the tokens, as "token_id:<id>"
        ids = [int(str(t).removeprefix("token_id:")) for t in logprobs.get("tokens") or []]
    logps = [float(x) for x in logprobs.get("token_logprobs") or []]
    if len(logps) != len(ids):
        raise ServerRefused(f"engine server {url} sent {len(logps)} log-probs for {len(ids)} tokens; start it with "
                            "molrl serve (or vLLM's server with --logprobs-mode processed_logprobs)")
    return list(ids), logps, choice.get("finish_reason")


class ServerClient:
    """Calls to one server at ``url``."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.host, self.port, self.prefix = server_address(self.url)

    def connect(self, timeout: float) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """A short call's answer (JSON, or text where the server answers text)."""
        conn = self.connect(CONNECT_TIMEOUT_S)
        try:
            conn.request(method, self.prefix + path, body=None if body is None else json.dumps(body),
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            text = response.read().decode("utf-8", "replace")
        except (OSError, http.client.HTTPException) as err:
            raise ServerDown(self.url, f"{path}: {err or type(err).__name__}") from None
        finally:
            conn.close()
        if response.status >= 400:
            raise ServerRefused(f"engine server {self.url}: {path} answered {response.status}: {error_text(text)}")
        try:
            return json.loads(text)
        except ValueError:
            return text

    def healthy(self) -> bool:
        """The server answers ``/health`` with success."""
        try:
            self.call("GET", "/health")
        except MolrlError:
            return False
        return True

    def models(self) -> list[dict[str, Any]]:
        """The model cards of ``/v1/models``: the base first, then the adapters loaded."""
        answer = self.call("GET", "/v1/models")
        return list(answer.get("data") or []) if isinstance(answer, dict) else []

    def load_adapter(self, name: str, path: str) -> None:
        """Load the adapter saved at ``path`` (a path the server reads) under ``name``."""
        self.call("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})

    def unload_adapter(self, name: str) -> None:
        """Unload the adapter ``name``."""
        self.call("POST", "/v1/unload_lora_adapter", {"lora_name": name})

    def complete(self, model: str, ids: Sequence[int], params: RequestParams,
                 cancel: threading.Event | None = None) -> Reply:
        """One streamed completion of ``ids``; once ``cancel`` is set it stops reading, and the reply holds the tokens
        so far with no finish reason."""
        reply = Reply([], [], None)
        conn = self.connect(CONNECT_TIMEOUT_S)
        try:
            conn.request("POST", self.prefix + "/v1/completions", body=json.dumps(completion_body(model, ids, params)),
                         headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
            response = conn.getresponse()
            if response.status >= 400:
                text = response.read().decode("utf-8", "replace")
                raise ServerRefused(f"engine server {self.url}: /v1/completions answered {response.status}: "
                                    f"{error_text(text)}")
            if conn.sock is not None:
                conn.sock.settimeout(READ_TIMEOUT_S)
            for chunk in events(response):
                ids_, logps, finish = chunk_tokens(chunk, self.url)
                reply.ids += ids_
                reply.logps += logps
                if finish is not None:
                    reply.finish_reason = finish
                if cancel is not None and cancel.is_set() and reply.finish_reason is None:
                    break
            else:
                if reply.finish_reason is None:
                    raise ServerDown(self.url, "the completion's stream ended before it finished")
        except (OSError, http.client.HTTPException) as err:
            raise ServerDown(self.url, f"/v1/completions: {err or type(err).__name__}") from None
        finally:
            conn.close()  # mid-stream, this is what makes vLLM abort the request
        return reply


def events(response: http.client.HTTPResponse) -> Iterator[dict[str, Any]]:
    """The JSON payloads of a server-sent event stream, up to ``data: [DONE]``."""
    for raw in response:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            return
        payload = json.loads(data)
        if isinstance(payload, dict) and "error" in payload:
            raise ServerRefused(f"engine server: completion failed: {error_text(data)}")
        yield payload


def error_text(text: str) -> str:
    """The message of a server's error answer (vLLM's ``{"error": {"message": ...}}``), else the text."""
    try:
        answer = json.loads(text)
    except ValueError:
        return text.strip()[:500]
    error = answer.get("error", answer) if isinstance(answer, dict) else answer
    if isinstance(error, dict):
        return str(error.get("message") or error.get("detail") or error)[:500]
    return str(error)[:500]
