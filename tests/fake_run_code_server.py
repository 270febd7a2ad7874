"""A stand-in for a SandboxFusion-style sandbox server: ``POST /run_code`` and ``GET /v1/ping`` (stdlib, in a thread).

Honest, it runs each request's ``code`` as SandboxFusion does without isolation: written to ``main.py`` in a fresh
temporary folder, run as ``PYTHON main.py`` there with the request's ``stdin`` on a pipe, killed (with its process
group) at ``run_timeout``, and answered in SandboxFusion's shape: ``{"status": "Success"|"Failed"|"SandboxError",
"message", "compile_result": null, "run_result": {"status": "Finished"|"TimeLimitExceeded"|"Error", "execution_time",
"return_code", "stdout", "stderr"}, "files": {}}``. ``PYTHON`` is the interpreter given (default: the one running this),
started with only PATH in its environment, so no molrl is importable there, and as ``user`` where one is given (as
SandboxFusion's ``set_uid``).

The other modes break the protocol in one way each (``MODES``): ``hang`` never answers a run_code request,
``malformed`` answers with broken JSON, ``claim_success`` answers "Success" without running anything.

Run alone: ``python tests/fake_run_code_server.py --port P [--mode honest|hang|malformed|claim_success] [--python PATH]
[--user UID]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODES = {
    "honest": "runs the code and reports what it did",
    "hang": "never answers a run_code request",
    "malformed": "answers a run_code request with broken JSON",
    "claim_success": "answers Success with an empty run_result, running nothing",
}
"""What the server does with a run_code request, by mode."""

CLAIMED_SUCCESS = {"status": "Success", "run_result": {"status": "Finished", "return_code": 0, "stdout": "", "stderr": ""}}
"""The reply of a ``claim_success`` server."""


def run_code(body: dict[str, Any], python: str, user: int | None = None) -> dict[str, Any]:
    """Run one run_code request's Python program as an unisolated SandboxFusion server does; its reply.

    ``user``: the uid (and gid) to run it as, in a folder every uid may write, as SandboxFusion's ``set_uid`` does.
    """
    if body.get("language") != "python":
        return {"status": "SandboxError", "message": f"language {body.get('language')!r} not supported",
                "compile_result": None, "run_result": None, "files": {}}
    folder = tempfile.mkdtemp(prefix="fake-run-code-")
    try:
        path = os.path.join(folder, "main.py")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(body["code"])
        if user is not None:
            os.chmod(folder, 0o777)
        started = time.monotonic()
        proc = subprocess.Popen([python, path], cwd=folder, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                                start_new_session=True, user=user, group=user, extra_groups=[] if user else None)
        try:
            out, err = proc.communicate((body.get("stdin") or "").encode(), timeout=float(body.get("run_timeout", 10)))
            status = "Finished"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            status = "TimeLimitExceeded"
        run = {"status": status, "execution_time": time.monotonic() - started, "return_code": proc.returncode,
               "stdout": out.decode(errors="replace"), "stderr": err.decode(errors="replace")}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    ok = status == "Finished" and proc.returncode == 0
    return {"status": "Success" if ok else "Failed", "message": "", "compile_result": None, "run_result": run,
            "files": {}}


class FakeRunCodeServer:
    """One fake server on 127.0.0.1 and ``port`` (default a free one); ``url`` is its address."""

    def __init__(self, mode: str = "honest", python: str = sys.executable, port: int = 0, user: int | None = None):
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}; expected one of {', '.join(MODES)}")
        self.mode, self.python, self.user = mode, python, user
        self.requests: list[dict[str, Any]] = []
        self.stopping = threading.Event()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), self.handler())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Stop serving (a hanging request is let go)."""
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def handler(self) -> type:
        """The request handler class bound to this server."""
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def send_body(self, status: int, data: bytes, kind: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/v1/ping":
                    self.send_body(200, b"pong", "text/plain")
                else:
                    self.send_body(404, json.dumps({"detail": "Not Found"}).encode())

            def do_POST(self) -> None:
                if self.path != "/run_code":
                    self.send_body(404, json.dumps({"detail": "Not Found"}).encode())
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                if server.mode == "hang":
                    server.stopping.wait()
                    return
                if server.mode == "malformed":
                    self.send_body(200, b'{"status": "Success", "run_result": {"stdout": "MOLRL')
                elif server.mode == "claim_success":
                    self.send_body(200, json.dumps(CLAIMED_SUCCESS).encode())
                else:
                    self.send_body(200, json.dumps(run_code(body, server.python, server.user)).encode())

        return Handler


def main(argv: list[str]) -> None:
    """Serve until interrupted."""
    parser = argparse.ArgumentParser(description="A fake SandboxFusion run_code server.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", choices=sorted(MODES), default="honest")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs the code")
    parser.add_argument("--user", type=int, help="the uid to run the code as (the server must be root)")
    args = parser.parse_args(argv)
    server = FakeRunCodeServer(args.mode, args.python, args.port, args.user)
    print(f"fake run_code server ({args.mode}) on {server.url}", flush=True)
    try:
        server.thread.join()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
