"""Requests spread over the engine servers: each to the live server with the fewest outstanding.

``submit`` returns a future, so a caller can send a batch and collect it later (``gather``), or stop reading once it
has what it needs (``gather_until``: partial rollouts). A server that drops a request, or sends a reply the client
refuses (``molrl.engines.server.client.BadReply``: nothing of it is kept), is named in one log line and taken out of
the pool, and the request is sent again, from its start, to a live one; when none is left, the request fails with one
line saying the step stopped and how to resume. The pool also counts the requests outstanding on each
model name (an adapter), so that an adapter is unloaded only once nothing samples from it (``when_unused``).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Callable, Sequence

from molrl.engines.server.client import Reply, RequestParams, ServerClient, ServerFailed
from molrl.errors import MolrlError

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 256
"""Requests in flight at once over all servers (one thread each: they wait on the network)."""


def least_loaded(outstanding: Sequence[int], alive: Sequence[bool]) -> int | None:
    """The index of the live server with the fewest outstanding requests (the first of equals); None: none is alive."""
    live = [i for i, up in enumerate(alive) if up]
    return min(live, key=lambda i: (outstanding[i], i)) if live else None


class NoServerLeft(MolrlError):
    """Every engine server is out of the pool: down, or it sent a bad reply."""


class ServerPool:
    """Clients to ``urls`` for a model an engine samples ``vocab_size`` ids of, with the outstanding requests of each
    and the servers still alive."""

    def __init__(self, urls: Sequence[str], vocab_size: int, max_in_flight: int = MAX_IN_FLIGHT):
        if not urls:
            raise MolrlError("engine=vllm_server needs engine_servers: [http://HOST:PORT, ...] (start each with "
                             "molrl serve --model MODEL --port PORT)")
        self.clients = [ServerClient(url, vocab_size) for url in urls]
        self.outstanding = [0] * len(self.clients)
        self.alive = [True] * len(self.clients)
        self.down: dict[str, str] = {}
        """url -> what happened to it and why (``ServerFailed.why``)."""
        self.in_use: Counter[str] = Counter()
        """Model name -> requests submitted on it and not yet done."""
        self.on_unused: dict[str, list[Callable[[], None]]] = {}
        self.lock = threading.Lock()
        self.executor = ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="molrl-engine")

    def live(self) -> list[ServerClient]:
        """The servers still in the pool."""
        with self.lock:
            return [c for c, up in zip(self.clients, self.alive) if up]

    def mark_down(self, client: ServerClient, why: str) -> None:
        """Take ``client``'s server out of the pool, with one log line naming it and ``why`` (``ServerFailed.why``)."""
        with self.lock:
            i = self.clients.index(client)
            if not self.alive[i]:
                return
            self.alive[i] = False
            self.down[client.url] = why
            left = sum(self.alive)
        log.warning("engine server %s %s; it is out of the pool and its requests go to the %d left", client.url, why,
                    left)

    def no_server_left(self) -> NoServerLeft:
        """The error of a request that finds no server left."""
        why = "; ".join(f"{url} {what}" for url, what in self.down.items())
        return NoServerLeft(f"every engine server is out of the pool ({why}); the step stopped: start the servers "
                            "again (molrl serve: vLLM's own server) and re-run the same command, which resumes from "
                            "the last checkpoint")

    def submit(self, model: str, ids: Sequence[int], params: RequestParams,
               cancel: threading.Event | None = None) -> "Future[Reply]":
        """Send one completion request on ``model`` (a base or adapter name); its future holds the reply."""
        with self.lock:
            self.in_use[model] += 1
        try:
            return self.executor.submit(self.run, model, list(ids), params, cancel)
        except RuntimeError:  # the pool was closed
            self.release(model)
            raise

    def run(self, model: str, ids: list[int], params: RequestParams, cancel: threading.Event | None) -> Reply:
        """The request on ``model``, counted as outstanding on it until its reply is ready."""
        try:
            return self.send(model, ids, params, cancel)
        finally:
            self.release(model)

    def send(self, model: str, ids: list[int], params: RequestParams, cancel: threading.Event | None) -> Reply:
        """The request on the least-loaded live server, sent again to another while servers drop it."""
        while True:
            if cancel is not None and cancel.is_set():
                return Reply([], [], None)
            with self.lock:
                i = least_loaded(self.outstanding, self.alive)
                if i is None:
                    raise self.no_server_left()
                self.outstanding[i] += 1
            client = self.clients[i]
            try:
                return client.complete(model, ids, params, cancel)
            except ServerFailed as err:
                self.mark_down(client, err.why)
            finally:
                with self.lock:
                    self.outstanding[i] -= 1

    def release(self, model: str) -> None:
        with self.lock:
            self.in_use[model] -= 1
            hooks = self.on_unused.pop(model, []) if self.in_use[model] <= 0 else []
            if self.in_use[model] <= 0:
                del self.in_use[model]
        for hook in hooks:
            hook()

    def when_unused(self, model: str, hook: Callable[[], None]) -> None:
        """Call ``hook`` once no request on ``model`` is outstanding: now, or when the last one is done."""
        with self.lock:
            if self.in_use[model] > 0:
                self.on_unused.setdefault(model, []).append(hook)
                return
            self.in_use.pop(model, None)
        hook()

    def gather(self, futures: Sequence["Future[Reply]"]) -> list[Reply]:
        """The replies of ``futures``, in order (the first failure raised)."""
        return [f.result() for f in futures]

    def gather_until(self, futures: Sequence["Future[Reply]"], cancel: threading.Event,
                     finished: Callable[[list[int]], bool]) -> list[Reply]:
        """The replies of ``futures`` (sent with ``cancel``), reporting the indices of those that finish to
        ``finished`` as they do; once it answers True the rest are cancelled and keep the tokens they had."""
        index = {f: i for i, f in enumerate(futures)}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            ended = sorted(index[f] for f in done if f.result().finished)
            if finished(ended):
                cancel.set()
        return self.gather(futures)

    def call_everywhere(self, what: str, call: Callable[[ServerClient], None]) -> None:
        """``call`` on every live server; a server that cannot be reached, or answers what the client refuses, is taken
        out of the pool."""
        for client in self.live():
            try:
                call(client)
            except ServerFailed as err:
                self.mark_down(client, f"{err.state} ({what}): {err.reason}")
        if not any(self.alive):
            raise self.no_server_left()

    def close(self) -> None:
        """Stop taking requests; those in flight are cancelled by their callers or finish."""
        self.executor.shutdown(wait=False, cancel_futures=True)
