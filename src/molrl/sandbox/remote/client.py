"""``RemoteBackend``: the pool's jobs run on sandbox servers (``sandbox.backend: remote``).

Jobs are cut into requests and each request goes to the server with the fewest outstanding jobs per slot. A request
has a hard deadline here (its jobs' time limit, the worker's grace, and ``request_grace_s``), whatever the server
does. A request that fails for the sandbox's sake (a refused or dropped connection, a deadline, a 5xx or busy
answer, a reply that breaks the protocol, a failed canary, or a job the server itself could not run) is sent again
to another server, up to ``retries`` times; a program's own failure is an outcome, never retried. A server that
fails ``server_failures`` times in a row is set aside, in one log line, and probed again after
``server_cooldown_s``. A job that no server could run comes back as ``sandbox_error``, which is never a verdict.

The verdict stays here: molrl's servers get raw jobs (only inputs) and return raw outcomes (values), which
``SandboxPool`` judges; over SandboxFusion's ``run_code`` each job travels inside a harness
(``molrl.sandbox.remote.harness``) whose envelope the model's program cannot write.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import random
import secrets
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from molrl.errors import MolrlError
from molrl.sandbox.backend import Backend
from molrl.sandbox.remote import protocol
from molrl.sandbox.remote.protocol import check_servers
from molrl.sandbox.types import SandboxConfig

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 5.0
"""Deadline of one health probe."""
MAX_CHUNK = 16
"""Most jobs in one molrl request (each request also carries one canary job)."""
CANARY_TIMEOUT_S = 5.0
"""The canary's shortest time limit."""
MIN_CHUNK = 4
"""Fewest jobs in one molrl request when there are that many, so the canary costs at most a fifth."""


class ServerError(Exception):
    """A request that failed for the sandbox's sake (never the program's): its text is the one line logged."""

    def __init__(self, message: str, counts: bool = True, busy: bool = False):
        super().__init__(message)
        self.counts = counts
        """Whether it counts toward setting the server aside (a refusal of one job does not)."""
        self.busy = busy
        """The server's queue was full: the request is sent again after a pause, without using a retry."""


@dataclass
class Server:
    """One sandbox server as the client sees it."""

    url: str
    host: str
    port: int
    protocol: str = "run_code"
    """molrl or run_code."""
    slots: int = 1
    """Jobs it runs at once (its info; 1 for run_code servers, which do not say)."""
    ceilings: dict = field(default_factory=dict)
    """The limits it lets a job ask for (molrl servers)."""
    queue_limit: int = MAX_CHUNK + 1
    """Jobs it queues before answering busy (molrl servers)."""
    outstanding: int = 0
    """Jobs sent to it and not yet answered."""
    requests: int = 0
    """Requests sent to it so far (breaks ties of load, so a tier takes turns)."""
    failures: int = 0
    """Failures in a row."""
    aside_until: float = 0.0
    """When a set-aside server is next probed (0: in rotation)."""
    last_error: str = ""

    def load(self) -> tuple[float, int]:
        """What the least-outstanding choice compares: jobs outstanding per slot, then requests sent."""
        return self.outstanding / max(self.slots, 1), self.requests


def http_call(host: str, port: int, method: str, path: str, body: bytes | None, deadline_s: float,
              max_bytes: int) -> tuple[int, bytes]:
    """(status, body) of one HTTP request that ends by ``deadline_s`` whatever the server does."""
    conn = http.client.HTTPConnection(host, port, timeout=deadline_s)
    fired = threading.Event()

    def abort() -> None:
        fired.set()
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(deadline_s, abort)
    timer.daemon = True
    timer.start()
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise ServerError(f"reply longer than {max_bytes} bytes")
        return resp.status, data
    except (OSError, http.client.HTTPException) as err:
        if fired.is_set():
            raise ServerError(f"no reply within {deadline_s:.0f} s") from None
        raise ServerError(f"{type(err).__name__}: {err}") from None
    finally:
        timer.cancel()
        conn.close()


class RemoteBackend(Backend):
    """Runs the pool's raw jobs on the servers of ``cfg.servers``."""

    name = "remote"

    def __init__(self, cfg: SandboxConfig):
        self.cfg = cfg
        self.servers = [Server(url, host, port) for url, host, port in check_servers(list(cfg.servers))]
        self.retries, self.server_failures, self.cooldown_s = cfg.retries, cfg.server_failures, cfg.server_cooldown_s
        self.request_grace_s = cfg.request_grace_s
        self._lock = threading.Lock()
        self._rng = random.Random(secrets.randbits(64))
        problems = []
        for server in self.servers:
            try:
                self._probe(server)
            except ServerError as err:
                problems.append(f"{server.url}: {err}")
                self._set_aside(server, str(err))
        if len(problems) == len(self.servers):
            raise MolrlError("sandbox: no sandbox server answered: " + "; ".join(problems)
                             + " (start each with molrl sandbox serve --port PORT, or fix sandbox.servers)")
        for server in self.servers:
            self._check_ceilings(server)
        threads = cfg.workers or 8 * len(self.servers)
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sandbox-remote")
        self._stop = threading.Event()
        self._prober = threading.Thread(target=self._probe_loop, name="sandbox-probe", daemon=True)
        self._prober.start()
        log.info("sandbox: remote tier of %d server(s): %s", len(self.servers),
                 ", ".join(f"{s.url} ({s.protocol}, {s.slots} slots)" for s in self.servers if not s.aside_until))

    # -- health ----------------------------------------------------------------------------------------------------

    def _probe(self, server: Server) -> None:
        """Ask the server what it is; ``ServerError`` when it does not answer as a sandbox server."""
        status, data = http_call(server.host, server.port, "GET", protocol.INFO, None, PROBE_TIMEOUT_S, 1 << 16)
        info = None
        if status == 200:
            try:
                info = json.loads(data)
            except ValueError:
                info = None
        if isinstance(info, dict) and info.get("server") == protocol.SERVER_NAME:
            if info.get("protocol") != protocol.PROTOCOL_VERSION:
                raise ServerError(f"molrl sandbox protocol {info.get('protocol')}, this client speaks "
                                  f"{protocol.PROTOCOL_VERSION}: run the same molrl version on both")
            if self.cfg.protocol != "run_code":
                try:
                    server.slots, server.queue_limit, server.ceilings = protocol.read_info(info)
                except protocol.ProtocolError as err:
                    raise ServerError(f"malformed {protocol.INFO} reply: {err}") from None
                server.protocol = "molrl"
                return
        elif self.cfg.protocol == "molrl":
            raise ServerError(f"not a molrl sandbox server (GET {protocol.INFO} answered {status}); set "
                              "sandbox.protocol=run_code for a SandboxFusion-style server")
        status, data = http_call(server.host, server.port, "GET", protocol.PING, None, PROBE_TIMEOUT_S, 1 << 16)
        if status != 200:
            raise ServerError(f"GET {protocol.PING} answered {status}")
        server.protocol = "run_code"

    def _check_ceilings(self, server: Server) -> None:
        """Refuse a config whose limits a molrl server would refuse on every job."""
        for key in protocol.LIMIT_KEYS:
            ceiling = server.ceilings.get(key)
            if ceiling is not None and getattr(self.cfg, key) > ceiling:
                raise MolrlError(f"sandbox.{key}={getattr(self.cfg, key)} is past the ceiling {ceiling} of sandbox "
                                 f"server {server.url}; raise it there (molrl sandbox serve) or lower sandbox.{key}")

    def _probe_loop(self) -> None:
        while not self._stop.wait(min(self.cooldown_s, 5.0)):
            for server in self.servers:
                if server.aside_until and time.monotonic() >= server.aside_until:
                    try:
                        self._probe(server)
                    except ServerError as err:
                        with self._lock:
                            server.aside_until = time.monotonic() + self.cooldown_s
                            server.last_error = str(err)
                        continue
                    with self._lock:
                        server.aside_until, server.failures = 0.0, 0
                    log.warning("sandbox: server %s answers again; back in rotation", server.url)

    def _set_aside(self, server: Server, why: str) -> None:
        server.aside_until = time.monotonic() + self.cooldown_s
        server.last_error = why
        log.warning("sandbox: server %s set aside after %d failure(s) in a row (last: %s); probing it again every "
                    "%.0f s", server.url, max(server.failures, 1), why, self.cooldown_s)

    def _failed(self, server: Server, err: ServerError) -> None:
        with self._lock:
            server.last_error = str(err)
            if not err.counts:
                return
            server.failures += 1
            if server.failures >= self.server_failures and not server.aside_until:
                self._set_aside(server, str(err))
            elif server.failures == 1:
                log.warning("sandbox: server %s failed a request: %s", server.url, err)

    # -- running jobs ----------------------------------------------------------------------------------------------

    def _pick(self, tried: set[str], size: int) -> Server | None:
        """The server in rotation with the fewest outstanding jobs per slot, preferring one not yet tried."""
        with self._lock:
            live = [s for s in self.servers if not s.aside_until]
            fresh = [s for s in live if s.url not in tried] or live
            if not fresh:
                return None
            server = min(fresh, key=Server.load)
            server.outstanding += size
            server.requests += 1
            return server

    def _chunks(self, n: int) -> list[range]:
        live = [s for s in self.servers if not s.aside_until] or self.servers
        if any(s.protocol != "molrl" for s in live):
            size = 1
        else:
            size = min(MAX_CHUNK, max(MIN_CHUNK, math.ceil(n / (2 * len(live)))), *(s.queue_limit - 1 for s in live))
        return [range(i, min(i + size, n)) for i in range(0, n, size)]

    def execute(self, jobs: list[dict]) -> list[dict]:
        outs: list[dict | None] = [None] * len(jobs)
        chunks = self._chunks(len(jobs))
        for chunk, results in zip(chunks, self.executor.map(lambda c: self._run([jobs[i] for i in c]), chunks)):
            for i, out in zip(chunk, results):
                outs[i] = out
        return outs  # type: ignore[return-value]

    def _run(self, jobs: list[dict]) -> list[dict]:
        """Outcomes of ``jobs``, each from a server that ran it or a sandbox_error naming why none did."""
        outs: list[dict | None] = [None] * len(jobs)
        todo, tried, why = list(range(len(jobs))), set(), ""
        attempts, busy_until = 0, time.monotonic() + self.request_grace_s
        while attempts <= self.retries:
            server = self._pick(tried, len(todo))
            if server is None:
                why = why or "every sandbox server is set aside"
                break
            tried.add(server.url)
            try:
                results = self._send(server, [jobs[i] for i in todo])
            except ServerError as err:
                self._failed(server, err)
                why = f"{server.url}: {err}"
                if err.busy and time.monotonic() < busy_until:
                    tried.discard(server.url)
                    time.sleep(0.05 + 0.2 * self._rng.random())
                else:
                    attempts += 1
                continue
            finally:
                with self._lock:
                    server.outstanding -= len(todo)
            with self._lock:
                server.failures = 0
            left = []
            for i, out in zip(todo, results):
                if out.get("status") == "sandbox_error":
                    left.append(i)
                    why = f"{server.url}: {out.get('error')}"
                else:
                    outs[i] = out
            todo = left
            attempts += 1
            if not todo:
                break
        for i in todo:
            outs[i] = {"status": "sandbox_error", "error": f"remote sandbox: no server ran the job ({why}; tried "
                                                           f"{', '.join(sorted(tried)) or 'none'})"}
        return outs  # type: ignore[return-value]

    @staticmethod
    def _canary_timeout(server: Server, jobs: list[dict]) -> float:
        """The canary's time limit: the longest job's, at least CANARY_TIMEOUT_S (so a loaded server runs it in time)
        where the server allows that long."""
        longest = max(float(job["timeout_s"]) for job in jobs)
        return max(longest, min(CANARY_TIMEOUT_S, float(server.ceilings.get("timeout_s", CANARY_TIMEOUT_S))))

    def _deadline(self, server: Server, jobs: list[dict]) -> float:
        longest = max(float(job["timeout_s"]) for job in jobs) + self.cfg.worker_grace_s
        rounds = math.ceil((len(jobs) + 1) / max(server.slots, 1))
        return rounds * longest + self.request_grace_s

    def _reply_bytes(self, jobs: list[dict]) -> int:
        per_job = (2 * max(int(j["max_output_kb"]) for j in jobs) + max(int(j["max_result_kb"]) for j in jobs) + 256) << 10
        return 4 * per_job * (len(jobs) + 1) + (1 << 20)

    def _send(self, server: Server, jobs: list[dict]) -> list[dict]:
        if server.protocol == "molrl":
            return self._send_molrl(server, jobs)
        return [self._send_run_code(server, job) for job in jobs]

    def _send_molrl(self, server: Server, jobs: list[dict]) -> list[dict]:
        canary, expect = protocol.canary_job(self._rng, jobs[0], judged=any(job["judge"] for job in jobs),
                                             timeout_s=self._canary_timeout(server, jobs))
        at = self._rng.randrange(len(jobs) + 1)
        batch = jobs[:at] + [canary] + jobs[at:]
        body = json.dumps({"jobs": batch}).encode()
        status, data = http_call(server.host, server.port, "POST", protocol.EXECUTE, body,
                                 self._deadline(server, batch), self._reply_bytes(batch))
        reply = _json_reply(status, data)
        try:
            outs = protocol.check_outcomes(batch, reply)
        except protocol.ProtocolError as err:
            raise ServerError(f"malformed reply: {err}") from None
        error = protocol.canary_error(expect, outs[at])
        if error:
            raise ServerError(error)
        return outs[:at] + outs[at + 1:]

    def _send_run_code(self, server: Server, job: dict) -> dict:
        try:
            return self._run_code_once(server, job)
        except ValueError as err:
            # a program that kills its own harness leaves no result either: the server is at fault only when a canary
            # through it fails too, so one program cannot set a healthy server aside
            raise ServerError(f"malformed reply: {err}", counts=not self._canary_runs(server, job)) from None

    def _run_code_once(self, server: Server, job: dict) -> dict:
        """``job``'s raw outcome from one run_code request in the harness; ``ServerError`` for a failed request,
        ``HarnessError`` (a ValueError) for a reply that is not the harness's report."""
        from molrl.sandbox.remote import harness

        nonce = secrets.token_hex(16)
        body = json.dumps(harness.run_code_request(job, nonce)).encode()
        status, data = http_call(server.host, server.port, "POST", protocol.RUN_CODE, body,
                                 self._deadline(server, [job]), self._reply_bytes([job]))
        return harness.outcome_from_reply(job, nonce, _json_reply(status, data))

    def _canary_runs(self, server: Server, job: dict) -> bool:
        """Whether a canary job through ``server``'s run_code comes back as running it gives."""
        canary, expect = protocol.canary_job(self._rng, job, judged=False, timeout_s=self._canary_timeout(server, [job]))
        try:
            out = self._run_code_once(server, canary)
        except (ServerError, ValueError):
            return False
        return protocol.canary_error(expect, out) is None

    def close(self) -> None:
        self._stop.set()
        self.executor.shutdown(wait=True)


def _json_reply(status: int, data: bytes):
    """The JSON body of a 200 reply; ``ServerError`` for anything else (a 4xx refusal does not count as a failure)."""
    if status != 200:
        try:
            message = json.loads(data).get("message")
        except (ValueError, AttributeError):
            message = None
        text = message or data[:200].decode("utf-8", "replace")
        busy = status == 503 and str(text).startswith("busy")
        raise ServerError(f"HTTP {status}: {text}", counts=status >= 500 and not busy, busy=busy)
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as err:
        raise ServerError(f"malformed reply: not JSON ({err})") from None
