"""molrl jobs carried over a run_code server in the harness: the local pool's verdicts, none forged, bad replies refused.

Each job goes ``run_code_request`` -> ``fake_run_code_server`` (SandboxFusion's ``POST /run_code`` without isolation:
``python main.py``) -> ``outcome_from_reply``, and ``SandboxPool`` judges the outcome as it judges a local worker's.
Each runs in every mode the host can put the harness in (``RUNNERS``): as root with an interpreter no other uid can read
(the child shares uid 0, without capabilities), as root with one every uid can read (the child gets a uid of its own),
and as an unprivileged uid, as SandboxFusion's ``set_uid`` runs code (harness and child share that uid).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fake_run_code_server import CLAIMED_SUCCESS, FakeRunCodeServer

from molrl.sandbox import SandboxConfig, SandboxPool
from molrl.sandbox.backend import Backend
from molrl.sandbox.remote.harness import (
    MARK, TAG, TIME_MARGIN_S, HarnessError, harness_program, new_nonce, outcome_from_reply, run_code_request,
)
from molrl.tasks import Task, TestCase

CFG = SandboxConfig(workers=2, timeout_s=5.0, memory_mb=512, cache_size=0, max_output_kb=8, max_file_mb=64)


def post(url: str, body: dict, timeout: float) -> object:
    """The JSON reply to ``POST url/run_code``."""
    request = urllib.request.Request(f"{url}/run_code", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.loads(reply.read())


class RunCodeBackend(Backend):
    """Each job through run_code_request -> the server -> outcome_from_reply; a HarnessError is a sandbox error."""

    name = "run_code"

    def __init__(self, url: str):
        self.url = url
        self.nonces: list[str] = []
        self.errors: list[str] = []

    def one(self, job: dict) -> dict:
        """One job's raw outcome."""
        nonce = new_nonce()
        self.nonces.append(nonce)
        body = run_code_request(job, nonce)
        try:
            return outcome_from_reply(job, nonce, post(self.url, body, body["run_timeout"] + 30))
        except HarnessError as err:
            self.errors.append(str(err))
            return {"status": "sandbox_error", "error": str(err)}

    def execute(self, jobs: list[dict]) -> list[dict]:
        """The jobs' outcomes, two requests at a time."""
        with ThreadPoolExecutor(max_workers=2) as ex:
            return list(ex.map(self.one, jobs))

    def close(self) -> None:
        """Nothing to stop: the server belongs to the fixture."""


def _readable_by_all(python: str) -> bool:
    """Whether every directory down to ``python``'s real file can be entered by any uid."""
    path = Path(os.path.realpath(python))
    return all(os.stat(p).st_mode & 0o001 for p in [path.parent, *path.parents])


NOBODY = 65534
RUNNERS = {"shared-uid": (sys.executable, None)}
"""How the fake server runs the harness, by the mode that puts it in: (interpreter, uid to run as)."""
if os.geteuid() == 0 and os.path.exists("/usr/bin/python3") and _readable_by_all("/usr/bin/python3"):
    RUNNERS["own-uid"] = ("/usr/bin/python3", None)  # root, an interpreter any uid can read: the child gets a uid
    RUNNERS["unprivileged"] = ("/usr/bin/python3", NOBODY)  # SandboxFusion's set_uid: harness and child share it
if _readable_by_all(sys.executable) and os.geteuid() == 0:  # this interpreter already gives the child a uid of its own
    del RUNNERS["shared-uid"]


@pytest.fixture(scope="module")
def local():
    """The local pool the remote one is compared with."""
    with SandboxPool(CFG) as pool:
        yield pool


@pytest.fixture(scope="module", params=sorted(RUNNERS))
def remote(request):
    """A pool whose jobs run in the harness on a fake run_code server, in one of the ``RUNNERS`` modes."""
    python, user = RUNNERS[request.param]
    server = FakeRunCodeServer(python=python, user=user)
    pool = SandboxPool(CFG, backend=RunCodeBackend(server.url))
    pool.mode = request.param
    yield pool
    server.stop()


def task(*tests: TestCase, entry: str | None = "f", timeout_s: float | None = None) -> Task:
    """A code task of ``tests`` on the function ``entry``, with its own deadline where one is given."""
    return Task(id="t", prompt="", kind="code", entry_point=entry, tests=list(tests),
                meta={"timeout_s": timeout_s} if timeout_s else {})


def square() -> Task:
    """f(x) = x * x: one call test, one assert test."""
    return task(TestCase("call", args=[3], expected=9), TestCase("assert", source="assert f(4) == 16"))


def seen(result) -> tuple:
    """What a pool decided and reported of one run: per-test (passed, got, error), then the run's own fields.

    An assert test's error is left out: when the task dies before a judged call, the local pool reports either the
    judge's "no reply" or "no result", by which of its processes it reads first.
    """
    return ([(t.passed, t.got, None if t.kind == "assert" else t.error) for t in result.tests],
            (result.status, result.exit_code, result.stdout, result.stdout_bytes, result.truncated))


# ------------------------------------------------------------------------------ the local pool's verdicts

CASES = {
    "calls": ("def f(xs):\n    return sorted(xs)", task(
        TestCase("call", args=[[3, 1, 2]], expected=[1, 2, 3]), TestCase("call", args=[[1]], expected=(1,)),
        TestCase("call", args=[[]], expected=[]))),
    "a call raises": ("def f(x):\n    return 1 / x", task(
        TestCase("call", args=[0], expected=0.0), TestCase("call", args=[4], expected=0.25))),
    "stdio": ("a, b = map(int, input().split())\nprint(a + b, ' ')\n", task(
        TestCase("stdio", stdin="2 3\n", stdout="5\n"), TestCase("stdio", stdin="1 1\n", stdout="3"), entry=None)),
    "asserts": ("def f(x):\n    return x * x", task(
        TestCase("assert", source="assert math.isclose(f(2), 4.0)"),
        TestCase("assert", source="def check(candidate):\n    for i in range(5):\n        assert candidate(i) == i * i\ncheck(candidate)"),
        TestCase("assert", source="assert f(3) == 10"))),
    "calls and asserts": ("def f(x):\n    return x + 1 if x else 'zero'", task(
        TestCase("call", args=[1], expected=2), TestCase("call", args=[0], expected=1),
        TestCase("assert", source="assert f(0) == 'zero'"), TestCase("assert", source="assert f(2) == 4"))),
    "setup code": ("class Box:\n    def __init__(self, n):\n        self.n = n\ndef size(b):\n    return b.n",
                   Task(id="t", prompt="", kind="code", entry_point="size", setup_code="thing = Box(5)",
                        tests=[TestCase("call", expected=5, args_source="(thing,)")])),
    "float near an int": ("def f(n):\n    return ((1 + 5 ** 0.5) / 2) ** n / 5 ** 0.5", task(
        TestCase("call", args=[10], expected=55), TestCase("call", args=[10], expected=55.0))),
    "syntax error": ("def f(x) return x", square()),
    "timeout": ("def f(x):\n    while True:\n        pass", task(
        TestCase("call", args=[1], expected=1), TestCase("assert", source="assert f(2) == 2"), timeout_s=1.0)),
    "memory bomb": ("x = bytearray(1 << 40)\ndef f(x):\n    return x", square()),
    "long output": ("print('y' * 20000)\ndef f(x):\n    return x * x", square()),
    "a file by its absolute path": ("import os\npath = os.path.abspath('out.txt')\nwith open(path, 'w') as fh:\n"
                                    "    fh.write('kept')\nprint(open(path).read())\ndef f(x):\n    return x * x", square()),
    "stdin read by a call task": ("import sys\nDATA = sys.stdin.read()\ndef f(x):\n    return len(DATA) + x * x", square()),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_verdicts_and_outcomes_are_the_local_pools(local, remote, case):
    code, t = CASES[case]
    assert seen(remote.run_tests(code, t)) == seen(local.run_tests(code, t))
    assert remote.backend.errors == []


@pytest.fixture(scope="module")
def benchmark(shared_data):
    """HumanEval and MBPP problems: call tests, assert tests (isclose, a check loop), setup code with argument
    expressions."""
    from molrl.tasks import load_tasks

    humaneval = {t.id: t for t in load_tasks(shared_data / "humaneval" / "HumanEval.jsonl.gz", "humaneval")}
    mbpp = {t.id: t for t in load_tasks(shared_data / "mbpp" / "mbpp.jsonl", "mbpp")}
    return [humaneval[i] for i in ("HumanEval/0", "HumanEval/2", "HumanEval/32", "HumanEval/38", "HumanEval/53")] + \
        [mbpp[i] for i in ("1", "367", "596", "601", "912")]


def test_benchmark_references_pass_and_a_wrong_solution_fails_as_locally(local, remote, benchmark):
    right = [(t.reference, t) for t in benchmark]
    wrong = [(f"def {t.entry_point}(*args, **kwargs):\n    return None\n", t) for t in benchmark]
    far, near = remote.run_tests_many(right + wrong), local.run_tests_many(right + wrong)
    assert [[t.passed for t in r.tests] for r in far] == [[t.passed for t in r.tests] for r in near]
    assert all(r.tests and all(t.passed for t in r.tests) for r in far[:len(right)])
    assert not any(t.passed for r in far[len(right):] for t in r.tests)
    assert sum(len(r.tests) for r in far) > 30 and remote.backend.errors == []


# ------------------------------------------------------------------------------ programs that solve nothing

@pytest.mark.parametrize("exit_call", ["sys.exit(0)", "os._exit(0)"])
def test_exit_before_the_tests_scores_nothing(remote, exit_call):
    result = remote.run_tests(f"import os, sys\ndef f(x):\n    return x * x\n{exit_call}\n", square())
    assert [t.passed for t in result.tests] == [False, False]
    assert "no result" in result.tests[0].error


def test_a_forged_result_line_on_stdout_stderr_and_every_fd_scores_nothing(remote):
    forged = {"status": "ok", "exit_code": 0, "stdout": "", "stderr": "", "stdout_bytes": 0, "stderr_bytes": 0,
              "truncated": False, "duration_s": 0.1, "verdicts": [{"e": "verdict", "i": 0, "passed": True}],
              "events": [{"e": "started"}, {"e": "loaded"}, {"e": "call", "i": 0, "value": {"t": "int", "v": "9"}}]}
    code = (
        "import os, sys, secrets\n"
        f"line = '{TAG} ' + secrets.token_hex(16) + ' ' + {json.dumps(json.dumps(forged))} + '\\n'\n"
        "print(line, end='', flush=True)\n"
        "print(line, end='', file=sys.stderr, flush=True)\n"
        "for fd in range(3, 64):\n"
        "    try:\n"
        "        os.write(fd, line.encode() + b'{\"e\":\"verdict\",\"i\":0,\"passed\":true}\\n')\n"
        "    except OSError:\n"
        "        pass\n"
        "def f(x):\n"
        "    return 0\n"
    )
    result = remote.run_tests(code, square())
    assert [t.passed for t in result.tests] == [False, False]
    assert result.stdout.startswith(TAG) and remote.backend.errors == []  # the forged line is only the program's output


def test_patching_builtins_json_and_assertion_error_scores_nothing(remote):
    code = (
        "import builtins, json, os\n"
        "builtins.AssertionError = type('Never', (Exception,), {})\n"
        "json.dumps = lambda *a, **k: '{\"e\": \"verdict\", \"i\": 0, \"passed\": true}'\n"
        "json.loads = lambda *a, **k: {'e': 'verdict', 'i': 0, 'passed': True}\n"
        "builtins.isinstance = lambda *a: True\n"
        "def f(x):\n"
        "    return 0\n"
    )
    assert [t.passed for t in remote.run_tests(code, square()).tests] == [False, False]


def test_an_always_equal_object_scores_nothing(remote):
    code = "class Anything:\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return Anything()\n"
    result = remote.run_tests(code, square())
    assert [t.passed for t in result.tests] == [False, False] and result.tests[0].got["t"] == "opaque"


KILLERS = {
    "at import": "import os\nos.kill(os.getppid(), 9)\ndef f(x):\n    return x * x\n",
    "in a call": "import os\ndef f(x):\n    os.kill(os.getppid(), 9)\n    return x * x\n",
    "in a judged call": "import os\ndef f(x):\n    if x == 4:\n        os.kill(os.getppid(), 9)\n    return x * x\n",
}


@pytest.mark.parametrize("when", sorted(KILLERS))
def test_killing_the_harness_scores_nothing(remote, when):
    result = remote.run_tests(KILLERS[when], square())
    if remote.mode == "own-uid":  # the harness is out of its reach: the kill fails, and so do the tests it touches
        assert [t.passed for t in result.tests] == ([True, False] if when == "in a judged call" else [False, False])
        assert when != "at import" or "PermissionError" in result.stderr
    else:  # the harness died before its report: the job is a sandbox error, never a verdict
        assert not any(t.passed for t in result.tests) and result.status == "sandbox_error"
        assert "has no harness result" in remote.backend.errors.pop()


# Searches all it can read of its parent (the harness: its program file, /proc entries, memory, fds), the
# harness's private folders, and its own memory, for anything shaped like a nonce and for test programs' markers.
HUNT = r'''
import ctypes, json, os, re
OUT = %r
SOUGHT = re.compile(rb"[0-9a-f]{32,}|EXPECTED-[0-9]+")  # a nonce's shape; a test program's marker
found, refused, scanned = set(), {}, [0]

def search(data):
    scanned[0] += len(data)
    found.update(m.decode() for m in SOUGHT.findall(data))

def grab(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a pipe: what it holds now, without waiting for more
    except OSError as err:
        refused[path] = err.strerror
        return
    try:
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            search(chunk)
    except OSError:
        pass
    finally:
        os.close(fd)

def writable_regions(maps):
    for line in maps.splitlines():
        fields = line.split()
        if fields[1].startswith("rw") and (len(fields) < 6 or fields[5] in ("[heap]", "[stack]")):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            yield start, min(end - start, 1 << 26)

def save():
    with open(os.path.join(OUT, "hunt"), "w") as fh:
        json.dump({"found": sorted(found), "refused": refused, "scanned": scanned[0]}, fh)

parent = os.getppid()
grab(f"/proc/{parent}/cmdline")
grab(open(f"/proc/{parent}/cmdline", "rb").read().split(b"\0")[1].decode())  # its program file
for name in ("environ", "maps", "stat", "status", "io", "stack", "syscall"):
    grab(f"/proc/{parent}/{name}")
try:
    mem = open(f"/proc/{parent}/mem", "rb")
except OSError as err:
    refused[f"/proc/{parent}/mem"] = err.strerror
else:
    with mem:
        for start, size in writable_regions(open(f"/proc/{parent}/maps").read()):
            mem.seek(start)
            search(mem.read(size))
save()  # reading the parent's pipes below could take the judge's messages and stall the job
try:
    fds = os.listdir(f"/proc/{parent}/fd")
except OSError as err:
    fds, refused[f"/proc/{parent}/fd"] = [], err.strerror
for fd in fds:
    grab(f"/proc/{parent}/fd/{fd}")
for folder in os.listdir("/tmp"):
    if folder.startswith("molrl-harness-"):
        for root, dirs, files in os.walk(os.path.join("/tmp", folder)):
            for name in files:
                grab(os.path.join(root, name))
for start, size in writable_regions(open("/proc/self/maps").read()):
    search(ctypes.string_at(start, size))
grab("/proc/self/environ")
grab("/proc/self/cmdline")
save()

def f(x):
    return x
'''


def test_the_program_finds_neither_the_nonce_nor_a_test_program(remote):
    marker = "EXPECTED-" + "7310924"  # spelt apart: only the test program itself holds it whole
    out = tempfile.mkdtemp(prefix="harness-hunt-")
    os.chmod(out, 0o1777)  # a child under another uid writes here too
    try:
        result = remote.run_tests(HUNT % out, task(TestCase("assert", source=f"assert f(1) == 1  # {marker}"),
                                                   TestCase("call", args=[2], expected=2), timeout_s=30.0))
        hunt = json.loads((Path(out) / "hunt").read_text())
    finally:
        shutil.rmtree(out)
    assert remote.backend.nonces[-1] not in hunt["found"] and marker not in hunt["found"]
    assert result.status == "ok" and [t.passed for t in result.tests] == [True, True], result.stderr
    assert hunt["scanned"] > 1 << 20  # its own memory at least: the search had something to search
    # the harness deleted its file (which a uid of its own could not have opened anyway)
    gone = ["Permission denied" if remote.mode == "own-uid" else "No such file or directory"]
    assert [why for path, why in hunt["refused"].items() if path.endswith("/main.py")] == gone
    parent = [p.rsplit("/", 1)[1] for p in hunt["refused"] if not p.startswith("/proc/self")]
    assert {"mem", "environ"} <= set(parent)  # its memory and environment were refused


def test_the_child_has_a_uid_of_its_own_or_no_capability(remote):
    code = ("import os\n"
            "def field(pid, name):\n"
            "    return next(l.split()[1] for l in open(f'/proc/{pid}/status') if l.startswith(name + ':'))\n"
            "print(os.getuid(), field(os.getppid(), 'Uid'), field('self', 'CapEff'), field('self', 'CapPrm'),\n"
            "      field('self', 'NoNewPrivs'))\n")
    uid, harness_uid, effective, permitted, no_new_privileges = remote.run(code).stdout.split()
    assert int(effective, 16) == int(permitted, 16) == 0 and no_new_privileges == "1"  # none now, none by any exec
    assert (uid != harness_uid) == (remote.mode == "own-uid")


def test_nothing_the_job_started_outlives_it(remote):
    code = ("import os, time\n"
            "r, w = os.pipe()\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    pid = os.fork()\n"
            "    if pid == 0:\n"
            "        time.sleep(60)\n"  # holding the result pipe, stdout and stderr open
            "    os.write(w, str(pid).encode())\n"
            "    os._exit(0)\n"
            "os.close(w)\n"
            "print(os.read(r, 100).decode())\n")
    started = time.monotonic()
    result = remote.run(code, timeout_s=20)
    assert result.status == "ok" and time.monotonic() - started < 10  # not held to the deadline by the grandchild
    pid = int(result.stdout)
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_fork_bomb_under_a_uid_of_its_own_is_capped_and_reaped(remote):
    if remote.mode != "own-uid":
        pytest.skip("a shared uid 0 has no process limit: the kernel exempts root from RLIMIT_NPROC")
    code = "import os\nprint(os.getuid(), flush=True)\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    for timeout_s in (3.0, 10.0, 30.0):  # longer only where a loaded machine kept it from forking at all
        result = remote.run(code, timeout_s=timeout_s)
        if result.info.get("stray_processes", 0) > 0:
            break
    assert result.status == "timeout" and result.info["stray_processes"] > 0
    uid = result.stdout.split()[0]
    assert [p for p in os.listdir("/proc") if p.isdigit() and _uid_of(p) == uid] == []


def _uid_of(pid: str) -> str | None:
    """The real uid of a live process, or None when it is gone or a zombie."""
    try:
        fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status") if ":" in line)
    except OSError:
        return None
    return None if fields["State"].split()[0] == "Z" else fields["Uid"].split()[0]


# ------------------------------------------------------------------------------ the request and the program

def _embedded(program: str) -> dict:
    """The runtime the harness program carries."""
    literal = re.search(r'^RUNTIME = "([A-Za-z0-9+/=]+)"$', program, re.M).group(1)
    return json.loads(zlib.decompress(base64.b64decode(literal)))


def test_the_request_carries_the_job_on_stdin_and_nothing_of_it_in_the_code():
    job = SandboxPool(CFG, backend=RunCodeBackend("http://127.0.0.1:9"))._job(
        "def f(x):\n    return 'CODE-MARK'", module_name="solution", timeout_s=7.0,
        judge={"entry_point": "f", "sources": ["assert f(1) == 'TEST-MARK'"]})
    nonce = new_nonce()
    body = run_code_request(job, nonce)
    assert set(body) == {"code", "language", "stdin", "run_timeout", "compile_timeout", "memory_limit_MB", "files",
                         "fetch_files"}
    assert (body["language"], body["run_timeout"], body["memory_limit_MB"]) == ("python", 7.0 + TIME_MARGIN_S, 512 + 256)
    assert body["code"] == harness_program() and MARK not in body["code"]
    assert not any(mark in body["code"] for mark in ("CODE-MARK", "TEST-MARK", nonce))
    assert json.loads(zlib.decompress(base64.b64decode(body["stdin"]))) == {"nonce": nonce, "job": job}
    with pytest.raises(ValueError, match="is not 32 to 128 lower-case hex digits"):
        run_code_request(job, "guessable")


def test_the_harness_program_needs_nothing_but_the_standard_library():
    import ast

    program = harness_program()
    runtime = _embedded(program)
    texts = {"harness_program": program, "harness_child": runtime["child"], **runtime["modules"]}
    for name, text in texts.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [] if node.level else [node.module]
            else:
                continue
            assert all(m.split(".")[0] in sys.stdlib_module_names for m in modules), (name, modules)
    assert set(runtime["order"]) == set(runtime["modules"]) and runtime["order"][0] == "codec"


# ------------------------------------------------------------------------------ replies that are not the harness's

@pytest.fixture(scope="module")
def honest():
    """A judged job, its nonce, and the reply an honest server gave to it."""
    server = FakeRunCodeServer()
    pool = SandboxPool(CFG, backend=RunCodeBackend(server.url))
    (job, _), = pool._plan("def f(x):\n    return x", task(TestCase("call", args=[1], expected=1),
                                                          TestCase("assert", source="assert f(2) == 2")))
    nonce = new_nonce()
    reply = post(server.url, run_code_request(job, nonce), 60)
    server.stop()
    return job, nonce, reply


def _line(reply: dict) -> tuple[str, str, dict]:
    """The tag, nonce and outcome of a reply's result line."""
    tag, nonce, outcome = reply["run_result"]["stdout"].strip().split(" ", 2)
    return tag, nonce, json.loads(outcome)


def _with_outcome(reply: dict, change) -> dict:
    """``reply`` with its outcome changed in place by ``change``."""
    tag, nonce, outcome = _line(reply)
    change(outcome)
    return _with_stdout(reply, f"{tag} {nonce} {json.dumps(outcome)}\n")


def _with_stdout(reply: dict, stdout: str) -> dict:
    """``reply`` with ``stdout`` as its run's stdout."""
    return dict(reply, run_result=dict(reply["run_result"], stdout=stdout))


BAD_REPLIES = {
    "a list": (lambda r: [r], "run_code reply is a JSON list, not an object"),
    "a string": (lambda r: "Internal Server Error", "run_code reply is a JSON str, not an object"),
    "no run_result": (lambda r: {k: v for k, v in r.items() if k != "run_result"}, "has no run_result"),
    "a sandbox error": (lambda r: {"status": "SandboxError", "message": "no runner", "run_result": None},
                        r"has no run_result \(status 'SandboxError': 'no runner'\)"),
    "stdout not a string": (lambda r: _with_stdout(r, None), "run_result.stdout is a JSON NoneType, not a string"),
    "success claimed, nothing run": (lambda r: CLAIMED_SUCCESS, r"has no harness result \(status Success, stdout 0 bytes"),
    "the server's time limit": (lambda r: dict(r, status="Failed", run_result=dict(
        r["run_result"], status="TimeLimitExceeded", stdout="")), "stopped the harness at its time limit"),
    "two result lines": (lambda r: _with_stdout(r, r["run_result"]["stdout"] * 2), "has 2 harness result lines"),
    "another nonce": (lambda r: _with_stdout(r, r["run_result"]["stdout"].replace(_line(r)[1], new_nonce())),
                      "carries nonce '[0-9a-f]+', not this request's"),
    "no outcome on the line": (lambda r: _with_stdout(r, f"{TAG} {_line(r)[1]}\n"), "does not read"),
    "broken JSON": (lambda r: _with_stdout(r, r["run_result"]["stdout"][:-20] + "\n"), "result is not JSON"),
    "outcome not an object": (lambda r: _with_stdout(r, f"{TAG} {_line(r)[1]} [1]\n"), "a JSON list, not an object"),
    "status not known": (lambda r: _with_outcome(r, lambda o: o.update(status="passed")), "status \"passed\" is not one of"),
    "events missing": (lambda r: _with_outcome(r, lambda o: o.pop("events")), "missing events"),
    "an unknown field": (lambda r: _with_outcome(r, lambda o: o.update(passed=True)), "unknown passed"),
    "events not a list": (lambda r: _with_outcome(r, lambda o: o.update(events={})), r"events \{\} is not a list"),
    "an event not an object": (lambda r: _with_outcome(r, lambda o: o["events"].append(3)), "is not a list of objects"),
    "exit code a bool": (lambda r: _with_outcome(r, lambda o: o.update(exit_code=False)), "exit_code false"),
    "byte count negative": (lambda r: _with_outcome(r, lambda o: o.update(stdout_bytes=-1)), "stdout_bytes -1"),
    "duration NaN": (lambda r: _with_outcome(r, lambda o: o.update(duration_s=float("nan"))), "duration_s NaN"),
    "stdout past max_output_kb": (lambda r: _with_outcome(r, lambda o: o.update(stdout="x" * (9 << 10))),
                                  "is not a string of at most 8192 characters"),
    "a verdict out of range": (lambda r: _with_outcome(r, lambda o: o["verdicts"][0].update(i=1)), "out of range"),
    "a verdict twice": (lambda r: _with_outcome(r, lambda o: o["verdicts"].append(o["verdicts"][0])), "given twice"),
    "a verdict without passed": (lambda r: _with_outcome(r, lambda o: o["verdicts"][0].pop("passed")),
                                 r"is not \{e: verdict"),
    "verdicts missing": (lambda r: _with_outcome(r, lambda o: o.pop("verdicts")), "missing verdicts"),
}


def test_the_honest_reply_is_read(honest):
    job, nonce, reply = honest
    outcome = outcome_from_reply(job, nonce, reply)
    assert outcome["status"] == "ok" and [v["passed"] for v in outcome["verdicts"]] == [True]


@pytest.mark.parametrize("bad", sorted(BAD_REPLIES))
def test_a_reply_that_is_not_the_harnesss_own_report_is_refused_in_one_line(honest, bad):
    job, nonce, reply = honest
    make, message = BAD_REPLIES[bad]
    with pytest.raises(HarnessError, match=message) as err:
        outcome_from_reply(job, nonce, make(json.loads(json.dumps(reply))))
    assert "\n" not in str(err.value)


def test_verdicts_for_a_job_without_assert_tests_are_refused(honest):
    job, nonce, reply = honest
    with pytest.raises(HarnessError, match=r"1 verdict\(s\) for a job without assert tests"):
        outcome_from_reply(dict(job, judge=None), nonce, reply)


# ------------------------------------------------------------------------------ the fake server itself

def test_the_fake_server_answers_ping_and_each_broken_mode_breaks_as_named():
    honest_server = FakeRunCodeServer()
    try:
        with urllib.request.urlopen(f"{honest_server.url}/v1/ping", timeout=5) as reply:
            assert reply.read() == b"pong"
    finally:
        honest_server.stop()
    job = SandboxPool(CFG, backend=RunCodeBackend("http://127.0.0.1:9"))._job("print(1)")
    nonce = new_nonce()
    for mode, fails in (("hang", (TimeoutError, urllib.error.URLError)), ("malformed", ValueError),
                        ("claim_success", HarnessError)):
        server = FakeRunCodeServer(mode)
        try:
            with pytest.raises(fails):
                outcome_from_reply(job, nonce, post(server.url, run_code_request(job, nonce), timeout=0.5))
        finally:
            server.stop()
