"""A stand-in for vLLM's OpenAI-compatible server, speaking the subset molrl's client uses (stdlib, in a thread).

``answer(model, ids, body)`` gives the (token id, log-prob) pairs a completion samples, one by one (``model``: the
base's name, or the path an adapter was loaded from); the default is a scripted table: each token is the previous one plus a step (1 on the base, 2 on an adapter, plus the seed mod 5), with
log-prob -0.1 per position, so tests can tell which model and seed made a completion. ``die_after_tokens`` makes the
server drop every connection and stop once it has streamed that many tokens in all; ``token_delay_s`` slows it.
``hostile`` (one of ``HOSTILE``) makes it a lying server: every completion it streams after its first
``honest_requests`` breaks the protocol in that one way, from its first chunk, while the rest of the API answers as an
honest server's does.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

Answer = Callable[[str, list[int], dict[str, Any]], Iterator[tuple[int, float]]]

HOSTILE = {
    "not_json": "a chunk that is not JSON",
    "not_an_object": "a chunk that is a JSON list, not an object",
    "choice_not_an_object": "choices[0] a string",
    "ids_not_integers": "token ids sent as strings",
    "logprobs_not_a_list": "token_logprobs a number, not a list",
    "fewer_logprobs": "one log-prob fewer than tokens",
    "finish_not_a_string": "a finish reason that is a number",
    "nan_logprob": "NaN log-probs",
    "minus_infinity_logprob": "-Infinity log-probs",
    "positive_logprob": "log-probs above 0",
    "id_past_vocabulary": "token ids past any tokenizer's vocabulary",
    "negative_id": "negative token ids",
    "past_max_tokens": "50,000 tokens whatever max_tokens asks",
}
"""The ways a hostile server breaks the protocol, each with what it sends."""

FLOOD_TOKENS = 50_000
"""Tokens a ``past_max_tokens`` server streams for any request."""


def hostile_choice(mode: str | None, token: int, logp: float, finish: str | None) -> Any:
    """The ``choices[0]`` a server in ``mode`` (None: honest) streams for one sampled token."""
    ids: list[Any] = [token]
    logps: Any = [logp]
    if mode == "choice_not_an_object":
        return f"token_id:{token}"
    if mode == "ids_not_integers":
        ids = [str(token)]
    elif mode == "logprobs_not_a_list":
        logps = logp
    elif mode == "fewer_logprobs":
        ids = [token, token]
    elif mode == "finish_not_a_string":
        finish = 7  # type: ignore[assignment]
    elif mode == "nan_logprob":
        logps = [float("nan")]
    elif mode == "minus_infinity_logprob":
        logps = [float("-inf")]
    elif mode == "positive_logprob":
        logps = [0.7]
    elif mode == "id_past_vocabulary":
        ids = [10**6 + token]
    elif mode == "negative_id":
        ids = [-1 - token]
    return {"index": 0, "text": "", "token_ids": ids, "finish_reason": finish,
            "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": logps}}


SCRIPTED_VOCAB = 1000
"""The scripted answer's ids are below this: the vocabulary size a client to a scripted server checks them against."""


def scripted(model: str, ids: list[int], body: dict[str, Any]) -> Iterator[tuple[int, float]]:
    """The default answer: a table a test can compute by hand."""
    step = (1 if model.startswith("base") else 2) + (body.get("seed") or 0) % 5
    last = ids[-1] if ids else 0
    position = 0
    while True:
        last = (last + step) % SCRIPTED_VOCAB
        position += 1
        yield last, -0.1 * position


class Listener(ThreadingHTTPServer):
    """A threading HTTP server whose listen queue holds a step's requests (the standard library's holds 5; a step
    opens one connection per row at once, 64 in the demo world, and the kernel resets those past the queue, as
    vLLM's server, with a queue of 2048, does not)."""

    request_queue_size = 1024

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that closed its connection after its reply is no error (the standard library prints each)."""
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


class FakeEngineServer:
    """One fake server on 127.0.0.1 and ``port`` (default a free one); ``url`` is its address."""

    def __init__(self, base: str = "base-model", answer: Answer = scripted, token_delay_s: float = 0.0,
                 die_after_tokens: int | None = None, port: int = 0, hostile: str | None = None,
                 honest_requests: int = 0):
        if hostile is not None and hostile not in HOSTILE:
            raise ValueError(f"hostile={hostile!r}; expected one of {', '.join(HOSTILE)}")
        self.base, self.answer, self.token_delay_s = base, answer, token_delay_s
        self.die_after_tokens = die_after_tokens
        self.hostile, self.honest_requests = hostile, honest_requests
        self.adapters: dict[str, str] = {}
        self.requests: list[dict[str, Any]] = []
        self.adapter_log: list[tuple[str, str]] = []
        self.streamed = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self.cancelled = 0
        self.lock = threading.Lock()
        self.dead = False
        self.httpd = Listener(("127.0.0.1", port), self.handler())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        # polled often, so that stopping it (which waits for a poll) takes milliseconds, not the default half second
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.dead = True
        self.httpd.shutdown()
        self.httpd.server_close()

    def handler(self) -> type:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def send_json(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/health":
                    self.send_json(200, {})
                elif self.path == "/v1/models":
                    cards = [{"id": server.base, "root": server.base, "parent": None}]
                    cards += [{"id": n, "root": p, "parent": server.base} for n, p in server.adapters.items()]
                    self.send_json(200, {"object": "list", "data": cards})
                else:
                    self.send_json(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/v1/load_lora_adapter":
                    name = body["lora_name"]
                    if name in server.adapters:
                        return self.send_json(400, {"error": {"message": f"The lora adapter '{name}' has already "
                                                                         "been loaded."}})
                    server.adapters[name] = body["lora_path"]
                    server.adapter_log.append(("load", name))
                    return self.send_json(200, f"Success: LoRA adapter '{name}' added successfully.")
                if self.path == "/v1/unload_lora_adapter":
                    name = body["lora_name"]
                    if server.adapters.pop(name, None) is None:
                        return self.send_json(404, {"error": {"message": f"The lora adapter '{name}' cannot be found."}})
                    server.adapter_log.append(("unload", name))
                    return self.send_json(200, f"Success: LoRA adapter '{name}' removed successfully.")
                if self.path == "/v1/completions":
                    return self.complete(body)
                self.send_json(404, {"error": {"message": f"no route {self.path}"}})

            def complete(self, body: dict[str, Any]) -> None:
                model = body["model"]
                if model != server.base and model not in server.adapters:
                    return self.send_json(404, {"error": {"message": f"The model `{model}` does not exist."}})
                with server.lock:
                    server.requests.append(body)
                    hostile = server.hostile if len(server.requests) > server.honest_requests else None
                    server.in_flight += 1
                    server.most_in_flight = max(server.most_in_flight, server.in_flight)
                try:
                    self.stream(model, body, hostile)
                except (BrokenPipeError, ConnectionResetError):
                    with server.lock:
                        server.cancelled += 1
                finally:
                    with server.lock:
                        server.in_flight -= 1

            def stream(self, model: str, body: dict[str, Any], hostile: str | None) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                stops = set(body.get("stop_token_ids") or [])
                tokens = server.answer(server.adapters.get(model, model), list(body["prompt"]), body)
                if hostile in ("not_json", "not_an_object"):
                    self.write_chunk(b'data: {"choices": [{"token_ids": [1\n\n' if hostile == "not_json"
                                     else b"data: [1, 2, 3]\n\n")
                limit = FLOOD_TOKENS if hostile == "past_max_tokens" else body["max_tokens"]
                for count in range(1, limit + 1):
                    if count <= body["max_tokens"]:  # a flood past it repeats the last token: no model to run
                        token, logp = next(tokens)
                    time.sleep(server.token_delay_s)
                    with server.lock:
                        server.streamed += 1
                        dying = server.die_after_tokens is not None and server.streamed > server.die_after_tokens
                    if dying or server.dead:
                        self.close_connection = True
                        self.connection.close()
                        if not server.dead:
                            threading.Thread(target=server.stop, daemon=True).start()
                        return
                    ended = token in stops and hostile != "past_max_tokens"
                    finish = "stop" if ended else "length" if count == limit else None
                    self.chunk({"choices": [hostile_choice(hostile, token, logp, finish)]})
                    if finish is not None:
                        break
                self.write_chunk(b"data: [DONE]\n\n")
                self.write_chunk(b"")

            def chunk(self, payload: dict[str, Any]) -> None:
                self.write_chunk(f"data: {json.dumps(payload)}\n\n".encode())

            def write_chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

        return Handler


class ModelAnswer:
    """Answers from a small model saved at ``base`` and the adapters loaded on the server (PEFT folders), sampled at
    the request's temperature with its seed; the log-prob of each token is the sampling distribution's (vLLM's
    ``processed_logprobs`` without top-p or top-k). ``stale``: every request samples from the base (a server whose
    adapter loads do nothing)."""

    lock = threading.Lock()
    """One for every instance: transformers' loading is not thread-safe (a model loaded while another loads can come
    out with its tied head untied)."""

    def __init__(self, base: str, stale: bool = False):
        import torch

        from molrl.models import load_model

        self.torch, self.base, self.stale, self.load = torch, str(base), stale, load_model
        with ModelAnswer.lock:
            self.models: dict[str, Any] = {self.base: load_model(self.base).eval()}

    def net(self, model: str) -> Any:
        if self.stale or model not in self.models and model == self.base:
            return self.models[self.base]
        if model not in self.models:
            self.models[model] = self.load(self.base, adapter=model).eval()
        return self.models[model]

    def __call__(self, model: str, ids: list[int], body: dict[str, Any]) -> Iterator[tuple[int, float]]:
        torch = self.torch
        with self.lock:
            net = self.net(model)
        generator = torch.Generator().manual_seed(int(body.get("seed") or 0))
        feed, past = list(ids), None  # the tokens not yet in the cache, and the cache (keys and values)
        while True:
            with self.lock, torch.no_grad():
                out = net(torch.tensor([feed]), past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[0, -1].float()
            logps = torch.log_softmax(logits / body["temperature"], -1)
            token = int(torch.multinomial(logps.exp(), 1, generator=generator).item())
            feed = [token]
            yield token, float(logps[token])


def main(argv: list[str]) -> None:
    """Stand in for ``python -m vllm.entrypoints.openai.api_server`` as ``molrl serve`` starts it: serve the scripted
    answer for ``--model`` on ``--port`` until told to stop, and write what it was started with (its arguments and
    ``CUDA_VISIBLE_DEVICES``) as JSON to the file ``FAKE_SERVER_RECORD`` names."""
    import argparse
    import os
    import signal

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    args, _ = parser.parse_known_args(argv)
    record = os.environ.get("FAKE_SERVER_RECORD")
    if record:
        with open(record, "w") as fh:
            json.dump({"argv": argv, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}, fh)
    server = FakeEngineServer(base=args.model, port=args.port)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    server.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
