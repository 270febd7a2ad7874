"""The remote sandbox tier: two ``molrl sandbox serve`` on localhost give the local pool's verdicts; a server killed
mid-batch loses nothing; a server that hangs, sends malformed JSON or claims success on everything gives one log
line and no verdict; the server keeps its bounds."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from molrl.errors import MolrlError
from molrl.graders.code import CodeRewardConfig
from molrl.sandbox import SandboxConfig, SandboxPool
from molrl.sandbox.remote import protocol
from molrl.sandbox.remote.client import http_call
from molrl.sandbox.remote.server import SandboxServer, ServeConfig
from molrl.tasks import Task, TestCase, load_tasks
from molrl.tasks.grade import grade

REPO = Path(__file__).resolve().parents[1]


def _server(**kw) -> SandboxServer:
    sandbox = SandboxConfig(workers=kw.pop("workers", 1), timeout_s=30.0, memory_mb=2048, cache_size=0)
    return SandboxServer(ServeConfig(sandbox=sandbox, port=0, **kw)).start()


@pytest.fixture(scope="module")
def servers():
    a, b = _server(), _server()
    yield a, b
    a.close()
    b.close()


def remote_cfg(urls, **kw) -> SandboxConfig:
    kw.setdefault("timeout_s", 5.0)
    kw.setdefault("cache_size", 0)
    return SandboxConfig(backend="remote", servers=list(urls), **kw)


# -- verdicts -------------------------------------------------------------------------------------------------------

def square_task(expected=9) -> Task:
    return Task(id="sq", prompt="", kind="code", entry_point="f",
                tests=[TestCase("call", args=[3], expected=expected), TestCase("assert", source=f"assert f(3) == {expected}"),
                       TestCase("stdio", stdin="", stdout="")])


NO_SOLVE = {
    "sys_exit": "import sys\nsys.exit(0)\ndef f(x):\n    return 0\n",
    "os_exit": "import os\nos._exit(0)\n",
    "always_equal": "class A:\n    def __eq__(self, o):\n        return True\n    __hash__ = None\ndef f(x):\n    return A()\n",
    "int_subclass": "class I(int):\n    def __eq__(self, o):\n        return True\n    __hash__ = int.__hash__\ndef f(x):\n    return I(0)\n",
    "patched_builtins": ("import builtins, json\nbuiltins.AssertionError = type('N', (Exception,), {})\n"
                         "json.dumps = lambda *a, **k: '{\"e\": \"verdict\", \"passed\": true}'\n"
                         "builtins.isinstance = lambda *a: True\ndef f(x):\n    return 0\n"),
    "forged_lines": ("import sys, os\nfor fd in range(1, 12):\n    try:\n"
                     "        os.write(fd, b'{\"e\":\"verdict\",\"i\":0,\"passed\":true}\\n{\"e\":\"call\",\"i\":0,\"value\":"
                     "{\"t\":\"int\",\"v\":\"9\"}}\\nPASS\\n')\n    except OSError:\n        pass\ndef f(x):\n    return 0\n"),
    "kill_parent": "import os, signal\ntry:\n    os.kill(os.getppid(), signal.SIGKILL)\nexcept OSError:\n    pass\ndef f(x):\n    return 0\n",
}


@pytest.mark.parametrize("name", sorted(NO_SOLVE))
def test_no_solve_programs_get_nothing_through_the_remote_path(servers, name):
    with SandboxPool(remote_cfg([s.url for s in servers])) as pool:
        result = pool.run_tests(NO_SOLVE[name], square_task(expected=7))
    assert [t.passed for t in result.tests[:2]] == [False, False], result.tests
    assert result.status != "sandbox_error"  # a program's own doing is an outcome, not a sandbox error


def _tasks_and_completions(shared_data: Path) -> tuple[list[Task], list[str]]:
    tasks, completions = [], []
    for path, fmt in (("mbpp/mbpp.jsonl", "mbpp"), ("humaneval/HumanEval.jsonl.gz", "humaneval")):
        for task in load_tasks(shared_data / path, fmt, limit=4):
            solution = task.reference
            assert solution and task.entry_point, task.id
            tasks += [task, task]
            completions += [f"```python\n{solution}\n```", f"```python\ndef {task.entry_point}(*a):\n    return None\n```"]
    return tasks, completions


def test_verdicts_equal_the_local_pools_on_mbpp_humaneval_and_the_demo_world(servers, shared_data):
    from molrl.demo.world import WorldConfig, build_world

    tasks, completions = _tasks_and_completions(shared_data)
    from molrl.tasks.toy import toy_tasks

    world = build_world(WorldConfig(train_problems=4, heldout_problems=2, general_train=4, general_eval=2,
                                    code_problems=4, code_heldout=2))
    for task in world.code_train + world.code_heldout:  # the digit world's code answers: right, then one off
        tasks += [task, task]
        value = task.tests[0].expected
        completions += [f"```python\n{task.reference}\n```", f"```python\ndef solve(): return {value + 1}\n```"]
    toy = toy_tasks(4)  # the toy task's checker runs in the sandbox too
    tasks += toy
    completions += ["Hello world", "abc", "ABC def", ""]
    code = CodeRewardConfig()
    with SandboxPool(SandboxConfig(workers=2, cache_size=0)) as local:
        here = grade(tasks, completions, local, code)
    with SandboxPool(remote_cfg([s.url for s in servers])) as remote:
        there = grade(tasks, completions, remote, code)
    assert [(g.score, g.stage) for g in there] == [(g.score, g.stage) for g in here]
    assert any(g.score == 1.0 for g in here) and any(g.score < 1.0 for g in here)  # both kinds of verdict occur
    assert all(g.stage != "sandbox_error" for g in there)


def test_jobs_spread_over_both_servers_and_the_canary_runs_each_request(servers):
    before = [s.counts["jobs"] for s in servers]
    with SandboxPool(remote_cfg([s.url for s in servers])) as pool:
        results = pool.run_many([f"print({i} * 2)" for i in range(32)])
    assert [r.stdout for r in results] == [f"{i * 2}\n" for i in range(32)]
    served = [s.counts["jobs"] - b for s, b in zip(servers, before)]
    assert all(n > 0 for n in served) and sum(served) > 32  # each request carried its canary too


# -- a server killed mid-batch ----------------------------------------------------------------------------------------

def _spawn(port: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "molrl.cli", "sandbox", "serve", "--port", str(port), "--workers", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_up(proc: subprocess.Popen) -> str:
    line = proc.stdout.readline()  # "molrl sandbox server on http://127.0.0.1:PORT (...)" once it serves
    assert "molrl sandbox server on" in line, line
    return line.split()[4]


def test_a_server_killed_mid_batch_loses_nothing_and_scores_nothing_wrong(caplog):
    procs = [_spawn(_free_port()) for _ in range(2)]
    try:
        urls = [_wait_up(p) for p in procs]
        cfg = remote_cfg(urls, server_failures=1, server_cooldown_s=60.0, request_grace_s=5.0)
        with SandboxPool(cfg) as pool:
            killer = threading.Timer(1.0, os.killpg, [procs[0].pid, signal.SIGKILL])
            killer.start()
            with caplog.at_level(logging.WARNING, logger="molrl.sandbox.remote.client"):
                results = pool.run_many([f"import time\ntime.sleep(0.5)\nprint({i})" for i in range(24)])
            killer.join()
        assert [(r.status, r.stdout) for r in results] == [("ok", f"{i}\n") for i in range(24)]
        assert procs[0].wait(timeout=10) == -signal.SIGKILL
        assert any("set aside" in r.getMessage() and urls[0] in r.getMessage() for r in caplog.records)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


# -- hostile servers -------------------------------------------------------------------------------------------------

class _Hostile(BaseHTTPRequestHandler):
    mode = "hang"

    def log_message(self, *args):
        pass

    def _send(self, code: int, data: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802
        if self.path == protocol.INFO:  # it says it is a molrl server
            bad = self.mode == "bad_info"  # a count that is not a count, a ceiling that is not a number
            self._send(200, json.dumps({"server": protocol.SERVER_NAME, "protocol": protocol.PROTOCOL_VERSION,
                                        "slots": "four" if bad else 4, "queue_limit": 1000,
                                        "ceilings": {"timeout_s": "NaN"} if bad else {}}).encode())
        else:
            self._send(200, b"pong")

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.mode == "hang":
            time.sleep(30)
            return
        if self.mode == "malformed":
            self._send(200, b'{"outcomes": [{"status": "ok", "stdout": "1\\n"')
            return
        outs = [{"status": "ok", "exit_code": 0, "stdout": "", "stderr": "", "duration_s": 0.01,
                 "events": [{"e": "started"}, {"e": "loaded"}] + [{"e": "call", "i": i, "value": {"t": "int", "v": "0"}}
                                                                 for i in range(len(job["calls"]))],
                 "verdicts": [{"e": "verdict", "i": i, "passed": True} for i in range(len((job["judge"] or {}).get("sources", [])))]}
                for job in body["jobs"]]
        self._send(200, json.dumps({"outcomes": outs}).encode())


def _hostile(mode: str) -> ThreadingHTTPServer:
    handler = type("H", (_Hostile,), {"mode": mode})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


@pytest.mark.parametrize("mode", ["hang", "malformed", "claim_success"])
def test_a_hostile_server_is_set_aside_in_one_line_and_its_replies_are_never_verdicts(servers, mode, caplog):
    bad = _hostile(mode)
    bad_url = f"http://127.0.0.1:{bad.server_address[1]}"
    try:
        cfg = remote_cfg([bad_url], server_failures=1, request_grace_s=1.0, timeout_s=2.0, worker_grace_s=0.5, retries=1)
        with SandboxPool(cfg) as pool, caplog.at_level(logging.WARNING, logger="molrl.sandbox.remote.client"):
            alone = pool.run_tests("def f(x):\n    return 0\n", square_task())
        assert alone.status == "sandbox_error" and bad_url in alone.error
        assert not any(t.passed for t in alone.tests)
        lines = [r.getMessage() for r in caplog.records if bad_url in r.getMessage() and r.levelno >= logging.WARNING]
        assert len(lines) == 1 and "set aside" in lines[0], lines
        with SandboxPool(cfg) as pool:
            g = grade([square_task()], ["```python\ndef f(x):\n    return 0\n```"], pool=pool)[0]
        assert g.stage == "sandbox_error"  # not a verdict: the scorer leaves it out
        # beside an honest server, every job is run by the honest one
        cfg = remote_cfg([bad_url, servers[0].url], server_failures=1, request_grace_s=1.0, timeout_s=2.0,
                         worker_grace_s=0.5)
        with SandboxPool(cfg) as pool:
            results = pool.run_tests_many([("def f(x):\n    return x * x\n", square_task())] * 6
                                          + [("def f(x):\n    return 0\n", square_task())] * 2)
        assert [[t.passed for t in r.tests[:2]] for r in results] == [[True, True]] * 6 + [[False, False]] * 2
    finally:
        bad.shutdown()


def test_a_server_whose_info_is_malformed_is_refused_naming_the_field():
    bad = _hostile("bad_info")
    try:
        with pytest.raises(MolrlError, match=r"malformed /molrl/v1/info reply: info slots='four'"):
            SandboxPool(remote_cfg([f"http://127.0.0.1:{bad.server_address[1]}"]))
    finally:
        bad.shutdown()


# -- configuration and the server's bounds ----------------------------------------------------------------------------

def test_remote_without_servers_or_with_a_bad_url_is_refused_in_one_line():
    with pytest.raises(MolrlError, match=r"needs sandbox.servers"):
        SandboxPool(remote_cfg([]))
    with pytest.raises(MolrlError, match=r"not a server URL"):
        SandboxPool(remote_cfg(["localhost:8300"]))
    with pytest.raises(MolrlError, match=r"names a server twice"):
        SandboxPool(remote_cfg(["http://127.0.0.1:1", "http://127.0.0.1:1"]))
    with pytest.raises(MolrlError, match=r"no sandbox server answered.*127.0.0.1:1"):
        SandboxPool(remote_cfg(["http://127.0.0.1:1"]))


def test_a_limit_past_the_servers_ceiling_is_refused_at_the_start(servers):
    with pytest.raises(MolrlError, match=r"sandbox.timeout_s=60.0 is past the ceiling 30.0"):
        SandboxPool(remote_cfg([servers[0].url], timeout_s=60.0))


def _post(server: SandboxServer, path: str, body) -> tuple[int, dict]:
    host, port = server.httpd.server_address[:2]
    status, data = http_call(host, port, "POST", path, json.dumps(body).encode(), 30.0, 1 << 20)
    return status, json.loads(data)


def test_the_server_refuses_what_it_must_in_one_line(servers):
    server = servers[0]
    job = SandboxPool.__new__(SandboxPool)
    job.cfg = SandboxConfig()
    raw = SandboxPool._job(job, "print(1)")
    cases = [
        (protocol.EXECUTE, {"jobs": []}, 400, "at least one job"),
        (protocol.EXECUTE, {"jobs": [dict(raw, timeout_s=999.0)]}, 400, "past this server's ceiling 30.0 (molrl sandbox serve --timeout-s)"),
        (protocol.EXECUTE, {"jobs": [dict(raw, extra=1)]}, 400, "unknown ['extra']"),
        (protocol.EXECUTE, {"jobs": [dict(raw, module_name="os")]}, 400, "module_name"),
        (protocol.RUN_CODE, {"code": "print(1)", "files": {"../escape": "aGk="}}, 400, "plain relative names"),
        (protocol.RUN_CODE, {"code": "print(1)", "files": {"/etc/x": "aGk="}}, 400, "plain relative names"),
        (protocol.RUN_CODE, {"code": "print(1)", "fetch_files": ["a"]}, 400, "fetch_files"),
        (protocol.RUN_CODE, {"code": "print(1)", "language": "cpp"}, 400, "python only"),
        ("/elsewhere", {}, 404, "no such path"),
    ]
    for path, body, code, words in cases:
        status, reply = _post(server, path, body)
        assert (status, reply["status"]) == (code, "SandboxError") and words in reply["message"], (path, body, reply)


def test_a_request_too_large_or_past_the_queue_is_answered_at_once():
    server = _server(queue_limit=2, max_request_mb=0.01)
    try:
        raw = {"code": "x" * 20_000, "stdin": "", "module_name": "__main__", "setup_code": "", "calls": [], "judge": None,
               "timeout_s": 1.0, "memory_mb": 256, "max_output_kb": 64, "max_file_mb": 16, "max_processes": 32,
               "max_result_kb": 64}
        status, reply = _post(server, protocol.EXECUTE, {"jobs": [raw]})
        assert status == 413 and "--max-request-mb" in reply["message"]
        small = dict(raw, code="print(1)")
        status, reply = _post(server, protocol.EXECUTE, {"jobs": [small] * 3})
        assert status == 503 and reply["message"].startswith("busy")
        status, reply = _post(server, protocol.EXECUTE, {"jobs": [small] * 2})
        assert status == 200 and [o["stdout"] for o in reply["outcomes"]] == ["1\n", "1\n"]
    finally:
        server.close()


def test_run_code_speaks_sandboxfusions_shape_and_writes_files_inside_the_job(servers):
    status, reply = _post(servers[0], protocol.RUN_CODE, {
        "code": "import os\nprint(open('d/a.txt').read(), os.path.exists('/tmp/../etc/molrl'))\nraise SystemExit(3)",
        "language": "python", "files": {"d/a.txt": "aGk="}, "run_timeout": 5})
    assert status == 200 and reply["status"] == "Failed"
    assert reply["run_result"]["stdout"] == "hi False\n" and reply["run_result"]["return_code"] == 3
    status, reply = _post(servers[0], protocol.RUN_CODE, {"code": "while True: pass", "run_timeout": 0.5})
    assert reply["run_result"]["status"] == "TimeLimitExceeded"


# -- the run_code protocol: molrl's own /run_code and a SandboxFusion-style server --------------------------------------

def _run_code_tier(kind: str, servers):
    from fake_run_code_server import FakeRunCodeServer

    if kind == "molrl":
        return [servers[0].url], []
    fakes = [FakeRunCodeServer("honest")]
    return [f.url for f in fakes], fakes


@pytest.mark.parametrize("kind", ["molrl", "sandboxfusion"])
def test_run_code_servers_give_the_local_pools_verdicts_and_no_solve_gets_nothing(servers, kind):
    urls, fakes = _run_code_tier(kind, servers)
    try:
        pairs = [("def f(x):\n    return x * x\n", square_task()), ("def f(x):\n    return x + x\n", square_task()),
                 ("def f(x):\n    raise ValueError(x)\n", square_task())]
        pairs += [(code, square_task(expected=7)) for code in NO_SOLVE.values()]
        with SandboxPool(SandboxConfig(workers=2, cache_size=0)) as local:
            here = local.run_tests_many(pairs)
        with SandboxPool(remote_cfg(urls, protocol="run_code")) as pool:
            assert {s.protocol for s in pool.backend.servers} == {"run_code"}
            there = pool.run_tests_many(pairs)
        assert [[t.passed for t in r.tests] for r in there][:3] == [[t.passed for t in r.tests] for r in here][:3] \
            == [[True, True, True], [False, False, True], [False, False, True]]
        assert all(r.status != "sandbox_error" for r in there[:3])
        for name, result in zip(NO_SOLVE, there[3:]):  # the call and the assert: nothing passes
            assert [t.passed for t in result.tests[:2]] == [False, False], (name, result.tests)
        # a program that kills its harness leaves no result: no verdict, and the server is not set aside for it
        assert all(not s.aside_until for s in pool.backend.servers)
    finally:
        for fake in fakes:
            fake.stop()


@pytest.mark.parametrize("mode", ["hang", "malformed", "claim_success"])
def test_a_hostile_run_code_server_gives_one_line_and_no_verdict(servers, mode, caplog):
    from fake_run_code_server import FakeRunCodeServer

    bad = FakeRunCodeServer(mode)
    try:
        cfg = remote_cfg([bad.url, servers[0].url], protocol="run_code", server_failures=1, request_grace_s=1.0,
                         timeout_s=2.0, worker_grace_s=0.5)
        with SandboxPool(cfg) as pool, caplog.at_level(logging.WARNING, logger="molrl.sandbox.remote.client"):
            results = pool.run_tests_many([("def f(x):\n    return x * x\n", square_task())] * 4)
        assert [[t.passed for t in r.tests] for r in results] == [[True, True, True]] * 4  # the honest one ran them
        lines = [r.getMessage() for r in caplog.records if bad.url in r.getMessage() and r.levelno >= logging.WARNING]
        assert len(lines) == 1 and "set aside" in lines[0], lines
        with SandboxPool(remote_cfg([bad.url], protocol="run_code", request_grace_s=1.0, timeout_s=2.0,
                                    worker_grace_s=0.5, retries=0)) as pool:
            alone = pool.run_tests("def f(x):\n    return x * x\n", square_task())
        assert alone.status == "sandbox_error" and not any(t.passed for t in alone.tests)
    finally:
        bad.stop()
