"""One vLLM server, spoken to over the subset of its OpenAI-compatible API molrl uses.

- ``POST /v1/completions``: the prompt as token ids, one completion (n=1) with its seed, streamed; each chunk holds
  the new token ids (``return_token_ids``) and their log-probs (``logprobs=0``: the sampled token's own, which a
  server started with ``--logprobs-mode processed_logprobs`` gives at the sampling temperature). A streamed request
  can be cancelled between chunks: the connection is closed, vLLM aborts it, and the tokens so far are kept.
- ``GET /v1/models``: the base the server holds and the adapters loaded on it.
- ``POST /v1/load_lora_adapter`` / ``/v1/unload_lora_adapter``: the trained adapter, by name and a path the server
  reads (the server needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, which ``molrl serve`` sets).
- ``GET /health``.

A server that cannot be reached, or whose connection drops, raises ``ServerDown``; one whose reply breaks the protocol
raises ``BadReply`` (the pool takes either out and resends the request elsewhere); one that answers with an error
status raises ``ServerRefused`` (a bad request goes nowhere else).

Every reply is checked here, where it arrives, before anything reads it (``check_chunk``, ``check_models``): each
chunk is a JSON object of the completions API's shape with one choice (n=1); token ids are integers inside the
tokenizer's vocabulary; log-probs are finite numbers no greater than 0, one per token; the finish reason is a string
or null; a completion holds no more tokens than its ``max_tokens`` and none after its finish reason. A server that sends
anything else is named with what it sent, in one line, and nothing it sent is kept.
"""

from __future__ import annotations

import http.client
import json
import math
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from molrl.engines.choice import server_address
from molrl.errors import MolrlError

CONNECT_TIMEOUT_S = 30.0
"""Seconds to wait for a server to accept a connection or answer a short call (models, adapters, health)."""
READ_TIMEOUT_S = 3600.0
"""Seconds a streamed completion may go without a chunk (a busy server queues requests) before it counts as down."""


LOGP_CEILING = 1e-4
"""The largest log-prob a reply may hold: a sampled token's is at most 0, and rounding may put a certain one a hair
above it."""
SHOWN_CHARS = 80
"""Characters of an offending value a refusal quotes."""


class ServerFailed(MolrlError):
    """A server the pool takes out: it could not be reached, or it sent a reply that is refused."""

    state = "failed"
    """What happened to the server, as its line says it (``is down``, ``sent a bad reply``)."""

    def __init__(self, url: str, reason: str):
        self.url, self.reason = url, reason
        super().__init__(f"engine server {url} {self.state}: {reason}")

    @property
    def why(self) -> str:
        """What happened and why, as the pool records it against the server."""
        return f"{self.state}: {self.reason}"


class ServerDown(ServerFailed):
    """The server could not be reached, or dropped the connection mid-request."""

    state = "is down"


class BadReply(ServerFailed):
    """The server's reply breaks the protocol: a malformed chunk, an id outside the vocabulary, a log-prob that is not
    a finite number at most 0, or more tokens than asked for."""

    state = "sent a bad reply"


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


def cut(text: str) -> str:
    """``text`` as a refusal quotes it: its first ``SHOWN_CHARS`` characters."""
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


def shown(value: Any) -> str:
    """A value a server sent, as a refusal quotes it: its JSON, cut (``cut``)."""
    return cut(json.dumps(value))


def token_id(value: Any, url: str, where: str, vocab_size: int, as_token: bool = False) -> int:
    """``value`` as a token id: an integer in [0, ``vocab_size``) (``as_token``: or a token ``"token_id:<id>"``);
    else ``BadReply`` naming it."""
    if as_token and isinstance(value, str) and value.startswith("token_id:"):
        digits = value.removeprefix("token_id:")
        value = int(digits) if digits.lstrip("-").isdigit() else value
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadReply(url, f"{where}={shown(value)}, not an integer token id")
    if not 0 <= value < vocab_size:
        raise BadReply(url, f"{where}={value}, outside the model's {vocab_size} ids (0..{vocab_size - 1}); is the "
                            "server on the run's model?")
    return value


def log_prob(value: Any, url: str, where: str) -> float:
    """``value`` as a sampled token's log-prob: a finite number at most 0 (``LOGP_CEILING``); else ``BadReply``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadReply(url, f"{where}={shown(value)}, not a number")
    if not math.isfinite(value) or value > LOGP_CEILING:
        raise BadReply(url, f"{where}={value}; a sampled token's log-prob is a finite number at most 0 (vLLM's "
                            "server with --logprobs-mode processed_logprobs, as molrl serve starts it, sends one)")
    return float(value)


def check_chunk(chunk: Any, url: str, vocab_size: int) -> tuple[list[int], list[float], str | None]:
    """A streamed chunk's new token ids, their log-probs and its finish reason (None while the request runs), once
    its shape, types and bounds are checked; ``BadReply`` naming the server and what it sent otherwise."""
    if not isinstance(chunk, dict):
        raise BadReply(url, f"a chunk that is not a JSON object: {shown(chunk)}")
    choices = chunk.get("choices")
    if choices == []:  # a usage-only chunk
        return [], [], None
    if not isinstance(choices, list) or len(choices) != 1:
        raise BadReply(url, f"choices={shown(choices)}; a chunk of a request for one completion holds one choice")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise BadReply(url, f"choices[0]={shown(choice)}, not an object")
    logprobs = {} if choice.get("logprobs") is None else choice["logprobs"]
    if not isinstance(logprobs, dict):
        raise BadReply(url, f"choices[0].logprobs={shown(logprobs)}, not an object")
    ids, ids_key = choice.get("token_ids"), "token_ids"
    if ids is None:  # a server that does not send token_ids: the tokens, as "token_id:<id>"
        ids, ids_key = logprobs.get("tokens"), "logprobs.tokens"
    ids = [] if ids is None else ids
    logps = [] if logprobs.get("token_logprobs") is None else logprobs["token_logprobs"]
    for key, value in ((ids_key, ids), ("logprobs.token_logprobs", logps)):
        if not isinstance(value, list):
            raise BadReply(url, f"choices[0].{key}={shown(value)}, not a list")
    if len(logps) != len(ids):
        raise BadReply(url, f"{len(logps)} log-probs for {len(ids)} tokens; start it with molrl serve (or vLLM's "
                            "server with --logprobs-mode processed_logprobs)")
    finish = choice.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        raise BadReply(url, f"choices[0].finish_reason={shown(finish)}, not a string or null")
    as_tokens = ids_key == "logprobs.tokens"
    return ([token_id(x, url, f"choices[0].{ids_key}[{i}]", vocab_size, as_tokens) for i, x in enumerate(ids)],
            [log_prob(x, url, f"choices[0].logprobs.token_logprobs[{i}]") for i, x in enumerate(logps)], finish)


def check_models(answer: Any, url: str) -> list[dict[str, Any]]:
    """The model cards of a ``/v1/models`` answer, once each is checked to be an object with a string ``id``."""
    cards = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(cards, list) or not all(isinstance(c, dict) and isinstance(c.get("id"), str) for c in cards):
        raise BadReply(url, f"/v1/models answered {shown(answer)}; vLLM's server lists its models as "
                            '{"data": [{"id": ...}, ...]}')
    return cards


class ServerClient:
    """Calls to one server at ``url``."""

    def __init__(self, url: str, vocab_size: int = 0):
        self.url = url.rstrip("/")
        self.host, self.port, self.prefix = server_address(self.url)
        self.vocab_size = vocab_size
        """The tokenizer's ids a completion may hold are below this (0: a client that asks for no completion)."""

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
        return check_models(self.call("GET", "/v1/models"), self.url)

    def load_adapter(self, name: str, path: str) -> None:
        """Load the adapter saved at ``path`` (a path the server reads) under ``name``."""
        self.call("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})

    def unload_adapter(self, name: str) -> None:
        """Unload the adapter ``name``."""
        self.call("POST", "/v1/unload_lora_adapter", {"lora_name": name})

    def complete(self, model: str, ids: Sequence[int], params: RequestParams,
                 cancel: threading.Event | None = None) -> Reply:
        """One streamed completion of ``ids``, every chunk checked (``check_chunk``); once ``cancel`` is set it stops
        reading, and the reply holds the tokens so far with no finish reason."""
        if self.vocab_size <= 0:
            raise MolrlError(f"engine server {self.url}: a completion needs the tokenizer's vocabulary size to check "
                             "the ids it sends (ServerClient(url, vocab_size))")
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
            for chunk in events(response, self.url):
                ids_, logps, finish = check_chunk(chunk, self.url, self.vocab_size)
                if ids_ and reply.finish_reason is not None:
                    raise BadReply(self.url, f"{len(ids_)} more token(s) after the completion finished "
                                             f"({reply.finish_reason})")
                reply.ids += ids_
                reply.logps += logps
                if len(reply.ids) > params.max_tokens:
                    raise BadReply(self.url, f"more tokens than the request's max_tokens={params.max_tokens} "
                                             f"({len(reply.ids)} so far)")
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


def events(response: http.client.HTTPResponse, url: str) -> Iterator[Any]:
    """The JSON payloads of ``url``'s server-sent event stream, up to ``data: [DONE]``; one that is not JSON is
    ``BadReply``."""
    for raw in response:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            return
        try:
            payload = json.loads(data)
        except ValueError:
            raise BadReply(url, f"a chunk that is not JSON: {cut(data)}") from None
        if isinstance(payload, dict) and "error" in payload:
            raise ServerRefused(f"engine server {url}: completion failed: {error_text(data)}")
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
