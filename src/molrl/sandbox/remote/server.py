"""``molrl sandbox serve``: the local sandbox pool behind an HTTP port, for trainers on other machines.

It answers ``GET /v1/ping``, ``GET /molrl/v1/info``, ``POST /molrl/v1/execute`` (a batch of raw jobs) and
``POST /run_code`` (SandboxFusion's protocol), all run by one ``LocalBackend``: the same slots, uids, seccomp and
clean-up as a local pool. It is bounded:

* a request larger than ``max_request_mb`` is refused (413) before it is read;
* a job past the server's own limits (its ``SandboxConfig``'s time, memory, output, file, process and result limits,
  which are ceilings) is refused (400) with the limit named;
* when more than ``queue_limit`` jobs are waiting or running, a request is answered 503 ``busy`` at once, and the
  client sends it elsewhere;
* ``run_code``'s ``files`` are written only as plain relative names inside the job's own scratch directory.

It binds to 127.0.0.1 unless told otherwise: anyone who can reach the port can run code in its sandbox.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from molrl.sandbox.backend import LocalBackend
from molrl.sandbox.remote import protocol
from molrl.sandbox.types import SandboxConfig

log = logging.getLogger(__name__)

FILE_NAME = re.compile(r"^(?!.*(^|/)\.\.?(/|$))[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
"""A ``run_code`` file name: plain relative path parts, no ``.`` or ``..``, nothing absolute."""


@dataclass
class ServeConfig:
    """One sandbox server: its pool and its bounds."""

    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """The pool's settings; its limits are the ceilings a job may ask for."""
    host: str = "127.0.0.1"
    """Address to bind (0.0.0.0 exposes the sandbox to the network)."""
    port: int = 8300
    """Port to listen on (0: any free port)."""
    queue_limit: int = 0
    """Jobs waiting or running at once before a request is answered busy (0: 8 per slot, at least 64)."""
    max_request_mb: float = 16.0
    """Largest request body."""


class SandboxServer:
    """A running server: ``url``, ``close()``; use ``serve_forever()`` in the foreground or ``start()`` a thread."""

    def __init__(self, cfg: ServeConfig):
        if cfg.sandbox.backend == "remote":
            raise ValueError("a sandbox server runs its own slots: its sandbox.backend is auto, bwrap or process")
        self.cfg = cfg
        self.backend = LocalBackend(cfg.sandbox)
        slots = len(self.backend.slots)
        self.queue_limit = cfg.queue_limit or max(8 * slots, 64)
        self.ceilings = {key: getattr(cfg.sandbox, key) for key in protocol.LIMIT_KEYS}
        self._outstanding = 0
        self._lock = threading.Lock()
        self.counts = {"requests": 0, "jobs": 0, "busy": 0, "refused": 0}
        handler = type("Handler", (_Handler,), {"server_state": self})
        try:
            self.httpd = ThreadingHTTPServer((cfg.host, cfg.port), handler)
        except BaseException:
            self.backend.close()
            raise
        self.httpd.daemon_threads = True
        self.url = f"http://{cfg.host}:{self.httpd.server_address[1]}"
        self._thread: threading.Thread | None = None

    def info(self) -> dict[str, Any]:
        """What ``GET /molrl/v1/info`` answers."""
        return {"server": protocol.SERVER_NAME, "protocol": protocol.PROTOCOL_VERSION,
                "backend": self.backend.name, "slots": len(self.backend.slots), "queue_limit": self.queue_limit,
                "max_request_mb": self.cfg.max_request_mb, "ceilings": self.ceilings}

    def count(self, what: str) -> None:
        """One more of ``what`` in ``counts`` (handler threads count at once)."""
        with self._lock:
            self.counts[what] += 1

    def execute(self, jobs: list[dict]) -> list[dict] | None:
        """Run ``jobs`` on the pool; None when the queue is full (the request is answered busy)."""
        with self._lock:
            if self._outstanding + len(jobs) > self.queue_limit:
                self.counts["busy"] += 1
                return None
            self._outstanding += len(jobs)
            self.counts["jobs"] += len(jobs)
        try:
            return self.backend.execute(jobs)
        finally:
            with self._lock:
                self._outstanding -= len(jobs)

    def start(self) -> SandboxServer:
        """Serve on a daemon thread (tests, benchmarks); returns self."""
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="sandbox-server", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve until interrupted, then close."""
        try:
            self.httpd.serve_forever()
        finally:
            self.close()

    def close(self) -> None:
        """Stop listening and stop the pool's workers; say what was served."""
        c = self.counts
        log.info("sandbox server %s: %d requests, %d jobs run, %d answered busy, %d refused", self.url,
                 c["requests"], c["jobs"], c["busy"], c["refused"])
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread = None
        self.httpd.server_close()
        self.backend.close()

    def __enter__(self) -> SandboxServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Handler(BaseHTTPRequestHandler):
    server_state: SandboxServer
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: Any) -> None:  # the server logs its own lines
        log.debug("%s %s", self.address_string(), fmt % args)

    def _send(self, code: int, body: Any) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _refuse(self, code: int, message: str) -> None:
        self.server_state.count("refused")
        log.warning("sandbox server: %s %s refused (%d): %s", self.command, self.path, code, message)
        self._send(code, {"status": "SandboxError", "message": message})

    def do_GET(self) -> None:  # noqa: N802 - the http.server hook
        if self.path == protocol.PING:
            self._send(200, "pong")
        elif self.path == protocol.INFO:
            self._send(200, self.server_state.info())
        else:
            self._refuse(404, f"no such path {self.path}; this server has {protocol.PING}, {protocol.INFO}, "
                         f"{protocol.EXECUTE} and {protocol.RUN_CODE}")

    def do_POST(self) -> None:  # noqa: N802 - the http.server hook
        state = self.server_state
        state.count("requests")
        body = self._body()
        if body is None:
            return
        if self.path == protocol.EXECUTE:
            self._execute(body)
        elif self.path == protocol.RUN_CODE:
            self._run_code(body)
        else:
            self._refuse(404, f"no such path {self.path}")

    def _body(self) -> Any:
        limit = int(self.server_state.cfg.max_request_mb * (1 << 20))
        try:
            size = int(self.headers.get("Content-Length", ""))
        except ValueError:
            size = -1
        if size < 0:
            self._refuse(411, "a request needs its Content-Length")
            return None
        if size > limit:
            self.close_connection = True
            self._refuse(413, f"request of {size} bytes, past this server's {limit} (molrl sandbox serve --max-request-mb)")
            return None
        try:
            return json.loads(self.rfile.read(size))
        except (ValueError, UnicodeDecodeError) as err:
            self._refuse(400, f"the request is not JSON: {err}")
            return None

    def _execute(self, body: Any) -> None:
        jobs = body.get("jobs") if isinstance(body, dict) else None
        if not isinstance(jobs, list) or not jobs:
            self._refuse(400, "expected {\"jobs\": [job, ...]} with at least one job")
            return
        outcomes = self._run_checked(jobs, numbered=True)
        if outcomes is not None:
            self._send(200, {"outcomes": outcomes})

    def _run_code(self, body: Any) -> None:
        try:
            job = run_code_job(body, self.server_state.cfg.sandbox)
        except protocol.ProtocolError as err:
            self._refuse(400, str(err))
            return
        outcomes = self._run_checked([job], numbered=False)
        if outcomes is not None:
            self._send(200, run_code_reply(outcomes[0]))

    def _run_checked(self, jobs: list, numbered: bool) -> list[dict] | None:
        """The outcomes of ``jobs`` once each is within this server's ceilings and the queue has room for them; None
        once the refusal (400, naming the job when ``numbered``) or the busy answer (503) is sent."""
        state = self.server_state
        for i, job in enumerate(jobs):
            error = protocol.job_error(job, state.ceilings)
            if error:
                self._refuse(400, f"job {i}: {error}" if numbered else error)
                return None
        outcomes = state.execute(jobs)
        if outcomes is None:
            self._send(503, {"status": "SandboxError", "message": f"busy: over {state.queue_limit} jobs queued"})
        return outcomes


def run_code_job(body: Any, cfg: SandboxConfig) -> dict:
    """The raw job of a SandboxFusion ``run_code`` request (python only; files written into the job's scratch)."""
    if not isinstance(body, dict) or not isinstance(body.get("code"), str):
        raise protocol.ProtocolError("run_code needs {\"code\": str, ...}")
    if body.get("language", "python") not in ("python", "python3"):
        raise protocol.ProtocolError(f"language {body.get('language')!r}: this server runs python only")
    if body.get("fetch_files"):
        raise protocol.ProtocolError("fetch_files is not served here: print what you need")
    files = body.get("files") or {}
    if not isinstance(files, dict):
        raise protocol.ProtocolError("files is {name: base64 content}")
    prologue = []
    for name, content in files.items():
        if not (isinstance(name, str) and FILE_NAME.match(name) and isinstance(content, str)):
            raise protocol.ProtocolError(f"file name {name!r}: plain relative names only, inside the job's directory")
        try:
            base64.b64decode(content, validate=True)
        except ValueError:
            raise protocol.ProtocolError(f"file {name}: its content is not base64") from None
        prologue.append(f"_molrl_put({name!r}, {content!r})")
    code = body["code"]
    if prologue:
        code = _FILES_PROLOGUE + "\n".join(prologue) + "\ndel _molrl_put\n" + code
    timeout = body.get("run_timeout", cfg.timeout_s)
    memory = body.get("memory_limit_MB", -1)
    stdin = body.get("stdin") or ""
    if not isinstance(timeout, (int, float)) or not isinstance(memory, int) or not isinstance(stdin, str):
        raise protocol.ProtocolError("run_timeout is a number, memory_limit_MB an int, stdin a string")
    return {"code": code, "stdin": stdin, "module_name": "__main__", "setup_code": "", "calls": [], "judge": None,
            "timeout_s": float(timeout), "memory_mb": memory if memory > 0 else cfg.memory_mb,
            "max_output_kb": cfg.max_output_kb, "max_file_mb": cfg.max_file_mb,
            "max_processes": cfg.max_processes, "max_result_kb": cfg.max_result_kb}


_FILES_PROLOGUE = '''def _molrl_put(name, content):
    import base64, os
    head = os.path.dirname(name)
    if head:
        os.makedirs(head, exist_ok=True)
    with open(name, "wb") as f:
        f.write(base64.b64decode(content))
'''


def run_code_reply(out: dict) -> dict:
    """A raw outcome in SandboxFusion's reply shape."""
    status = out.get("status")
    if status == "sandbox_error":
        return {"status": "SandboxError", "message": out.get("error") or "sandbox error", "compile_result": None,
                "run_result": None, "files": {}}
    run = {"status": "TimeLimitExceeded" if status == "timeout" else "Finished",
           "execution_time": out.get("duration_s", 0.0), "return_code": out.get("exit_code"),
           "stdout": out.get("stdout", ""), "stderr": out.get("stderr", "")}
    ok = status == "ok" and out.get("exit_code") == 0
    return {"status": "Success" if ok else "Failed", "message": "" if ok else status, "compile_result": None,
            "run_result": run, "files": {}}
