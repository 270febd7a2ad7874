"""One attack per test: each is contained or scored as a fail, and the host and pool carry on."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

import pytest

from molrl.sandbox import ExecJob, SandboxConfig, SandboxPool
from molrl.tasks import Task, TestCase

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the full containment suite needs root (distinct uids)")


def live_processes(uids: set[int]) -> list[int]:
    """Host pids running under any of ``uids``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as fh:
                fields = dict(line.split(":", 1) for line in fh if ":" in line)
        except OSError:
            continue
        if int(fields["Uid"].split()[0]) in uids and fields["State"].split()[0] != "Z":
            found.append(int(entry))
    return found


@pytest.fixture(scope="module")
def pool():
    cfg = SandboxConfig(workers=2, timeout_s=3.0, memory_mb=512, cache_size=0)
    with SandboxPool(cfg) as p:
        yield p


@pytest.fixture
def uids(pool) -> set[int]:
    return {uid for slot in pool.backend.slots for uid in (slot.uid, slot.uid + 1)}


@pytest.fixture(autouse=True)
def pool_still_healthy(pool):
    """After every attack: no task process survives and the pool still runs code correctly."""
    yield
    assert live_processes({u for s in pool.backend.slots for u in (s.uid, s.uid + 1)}) == []
    results = pool.run_many(["print(sum(range(10)))"] * 2)
    assert [(r.status, r.stdout) for r in results] == [("ok", "45\n")] * 2


def square_task(expected: int = 9) -> Task:
    return Task(id="sq", prompt="", kind="code", entry_point="f", tests=[TestCase("call", args=[3], expected=expected)])


def test_fork_bomb_is_capped_and_reaped(pool, uids):
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = pool.run(code, timeout_s=1.0)
    assert result.status == "timeout"
    assert live_processes(uids) == []


def test_setsid_grandchild_does_not_outlive_its_task(pool, uids):
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "print('parent done')\n"
    )
    result = pool.run(code, timeout_s=30)
    assert result.status == "ok" and result.duration_s < 10  # not held to the deadline by the grandchild
    assert result.info["stray_processes"] >= 1
    assert live_processes(uids) == []


def test_memory_bomb_is_memory_limit(pool):
    result = pool.run("chunks = []\nwhile True:\n    chunks.append(bytearray(50 << 20))\n", timeout_s=20)
    assert result.status == "memory_limit"


def test_forked_memory_bomb_hits_the_slot_cap(pool):
    if not pool.backend.slots[0].info.get("slot_memory_cap"):
        pytest.skip("no writable memory cgroup on this host")
    code = "import os, time\nfor _ in range(4):\n    os.fork()\nx = bytearray(400 << 20)\ntime.sleep(1)\n"
    result = pool.run(code, timeout_s=10)  # 16 processes x 400 MiB, each within RLIMIT_AS (512 MiB)
    assert result.status == "memory_limit"


def test_ten_gigabyte_file_write_stops_at_the_file_limit(pool):
    code = (
        "block = b'x' * (1 << 20)\n"
        "with open('big.bin', 'wb') as fh:\n"
        "    for _ in range(10 * 1024):\n"
        "        fh.write(block)\n"
    )
    result = pool.run(code)
    assert result.status == "runtime_error"
    assert "File too large" in result.stderr or "No space" in result.stderr


def test_one_gigabyte_of_stdout_is_output_limit(pool):
    code = "import sys\nblock = 'y' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(block)\n"
    result = pool.run(code)
    assert result.status == "output_limit"
    assert result.truncated and len(result.stdout) == pool.cfg.max_output_kb * 1024
    assert result.stdout_bytes <= pool.cfg.max_file_mb << 20


def test_writes_outside_the_work_dir_never_reach_the_host(pool, tmp_path):
    marker = f"molrl-escape-{uuid.uuid4().hex}"
    targets = [f"/tmp/{marker}", f"/usr/{marker}", f"{tmp_path}/{marker}", f"/{marker}", f"/root/{marker}"]
    code = (
        f"for path in {targets!r}:\n"
        "    try:\n"
        "        open(path, 'w').write('pwned')\n"
        "        print('wrote', path)\n"
        "    except OSError as err:\n"
        "        print('blocked', path, type(err).__name__)\n"
    )
    result = pool.run(code)
    assert result.status == "ok"
    assert not any(Path(t).exists() for t in targets)
    assert f"wrote /usr/{marker}" not in result.stdout


def test_etc_passwd_is_not_readable(pool):
    result = pool.run("print(open('/etc/passwd').read())")
    assert result.status == "runtime_error"
    assert "root:" not in result.stdout
    assert "FileNotFoundError" in result.stderr or "PermissionError" in result.stderr


def test_another_tasks_files_are_invisible(pool):
    secret = uuid.uuid4().hex
    writer = f"import time\nopen('secret.txt', 'w').write('{secret}')\ntime.sleep(5)\n"  # alive through the walk
    reader = (
        "import os, time\ntime.sleep(0.3)\nfound = []\n"
        "for root, dirs, files in os.walk('/', onerror=lambda e: None):\n"
        "    dirs[:] = [d for d in dirs if os.path.join(root, d) not in ('/usr', '/proc', '/sys')]\n"
        "    found += [os.path.join(root, n) for n in files if n == 'secret.txt']\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    for sub in ('cwd', 'root/tmp'):\n"
        "        try:\n"
        "            found += [pid for n in os.listdir(f'/proc/{pid}/{sub}') if n == 'secret.txt']\n"
        "        except OSError:\n"
        "            pass\n"
        "print(found)\n"
    )
    # the reader walks the whole filesystem: a generous deadline, as speed is not the point here
    results = pool.run_many([ExecJob(writer, timeout_s=60), ExecJob(reader, timeout_s=60)])
    assert results[1].status == "ok" and results[1].stdout.strip() == "[]"
    # the same slot's next task starts from an empty work dir
    later = pool.run_many(["import os\nprint(sorted(os.listdir('.')))"] * 2)
    assert [r.stdout.strip() for r in later] == ["[]", "[]"]


def test_sockets_to_localhost_fail(pool):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    server.settimeout(0.5)
    try:
        code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('connected')\n"
        result = pool.run(code)
        assert result.status == "runtime_error" and "connected" not in result.stdout
        assert "PermissionError" in result.stderr
        with pytest.raises(socket.timeout):
            server.accept()
    finally:
        server.close()


def test_pseudo_terminals_cannot_be_exhausted(pool):
    # bwrap's --dev gave each slot a devpts instance, and the pty count is the host's: one task
    # opened all 3,071 and an honest task in another slot got ENOSPC from os.openpty()
    if pool.backend.name != "bwrap":
        pytest.skip("the process backend sees the host's /dev")
    code = ("import os\nprint(sorted(os.listdir('/dev')))\n"
            "try:\n    os.openpty()\nexcept OSError as err:\n    print(type(err).__name__)\n")
    result = pool.run(code)
    assert result.stdout == "['fd', 'null', 'random', 'stderr', 'stdin', 'stdout', 'urandom', 'zero']\nFileNotFoundError\n"


def test_file_activity_cannot_be_watched(pool):
    # fanotify (unprivileged with FAN_REPORT_FID) and inotify on the read-only binds would show
    # when the host or another slot opens or reads a file
    code = ("import ctypes, errno\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "for call, args in (('fanotify_init', (0x200, 0)), ('inotify_init1', (0,)), ('inotify_init', ())):\n"
            "    print(call, getattr(libc, call)(*args), errno.errorcode.get(ctypes.get_errno()))\n")
    result = pool.run(code)
    assert result.stdout == "fanotify_init -1 EPERM\ninotify_init1 -1 EPERM\ninotify_init -1 EPERM\n", result.stderr


def test_kill_minus_one_spares_the_host_and_the_concurrent_task(pool):
    slow = "import time\ntime.sleep(1.0)\nprint('survived')\n"
    killer = "import os, signal, time\ntime.sleep(0.2)\nos.kill(-1, signal.SIGKILL)\n"
    results = pool.run_many([ExecJob(slow, timeout_s=30), killer])
    assert (results[0].status, results[0].stdout) == ("ok", "survived\n")
    assert results[1].status == "ok"  # kill(-1) reaches only its own uid's processes: itself excluded


def test_killing_the_parent_worker_is_refused(pool):
    pids = [slot.proc.pid for slot in pool.backend.slots]
    code = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"
    result = pool.run(code)
    assert result.status == "runtime_error" and "PermissionError" in result.stderr
    assert [slot.proc.pid for slot in pool.backend.slots] == pids
    assert all(slot.proc.poll() is None for slot in pool.backend.slots)


@pytest.mark.parametrize("exit_call", ["sys.exit(0)", "os._exit(0)"])
def test_exit_before_tests_is_a_fail(pool, exit_call):
    code = f"import os, sys\ndef f(x):\n    return x * x\n{exit_call}\n"
    result = pool.run_tests(code, square_task())
    assert result.tests[0].passed is False and "no result" in result.tests[0].error


def test_always_equal_object_is_a_fail(pool):
    code = "class Anything:\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return Anything()\n"
    result = pool.run_tests(code, square_task())
    assert result.tests[0].passed is False and result.tests[0].got["t"] == "opaque"


def test_always_equal_object_fails_the_judged_assert_too(pool):
    task = Task(id="sq", prompt="", kind="code", entry_point="f",
                tests=[TestCase("assert", source="assert f(3) == 9 and f(4) == 16")])
    code = "class Anything:\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return Anything()\n"
    result = pool.run_tests(code, task)
    assert result.tests[0].passed is False


def test_int_subclass_with_custom_eq_is_a_fail(pool):
    code = "class Sly(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\ndef f(x):\n    return Sly(0)\n"
    result = pool.run_tests(code, square_task())
    assert result.tests[0].passed is False


def test_callers_frames_hold_no_expected_value(pool):
    sentinel = 7_777_777_777  # the search below only looks for ints above 5e9; none is in the code
    code = (
        "import sys, gc\n"
        "def f(x):\n"
        "    pools, frame = [], sys._getframe(1)\n"
        "    while frame is not None:\n"
        "        pools += [frame.f_locals, frame.f_globals]\n"
        "        frame = frame.f_back\n"
        "    pools += [o for o in gc.get_objects() if isinstance(o, (dict, list, tuple))]\n"
        "    found = [-1]\n"
        "    for obj in pools:\n"
        "        values = obj.values() if isinstance(obj, dict) else obj\n"
        "        found += [v for v in list(values) if type(v) is int and v > 5_000_000_000]\n"
        "    return max(found)\n"
    )
    result = pool.run_tests(code, square_task(expected=sentinel))
    assert result.tests[0].passed is False and result.tests[0].got["v"] != str(sentinel)


def test_judged_test_programs_are_not_in_the_task_process(pool):
    code = (
        "import sys, gc\n"
        "def f(x):\n"
        "    needle, texts, frame = 'HIDDEN-' + 'MARKER', [], sys._getframe(1)\n"
        "    while frame is not None:\n"
        "        texts.append(repr(frame.f_locals))\n"
        "        frame = frame.f_back\n"
        "    texts += [repr(o) for o in gc.get_objects() if isinstance(o, dict) and 'code' in o]\n"
        "    return 1 if any(needle in t for t in texts) else 0\n"
    )
    task = Task(id="t", prompt="", kind="code", entry_point="f",
                tests=[TestCase("assert", source="assert f(0) == 0  # HIDDEN-MARKER")])
    assert pool.run_tests(code, task).tests[0].passed


def test_patching_builtins_and_json_cannot_forge_a_pass(pool):
    code = (
        "import builtins, json, os\n"
        "builtins.AssertionError = type('Never', (Exception,), {})\n"
        "json.dumps = lambda *a, **k: '{\"e\": \"verdict\", \"i\": 0, \"passed\": true}'\n"
        "builtins.isinstance = lambda *a: True\n"
        "def f(x):\n"
        "    os.write(3, b'{\"e\":\"verdict\",\"i\":0,\"passed\":true}\\n')\n"
        "    return 0\n"
    )
    task = Task(id="sq", prompt="", kind="code", entry_point="f", tests=[
        TestCase("call", args=[3], expected=9), TestCase("assert", source="assert f(3) == 9")])
    result = pool.run_tests(code, task)
    assert [t.passed for t in result.tests] == [False, False]


def test_concurrent_honest_tasks_unaffected_by_a_batch_of_attacks(pool):
    attacks = ["import os\nos.kill(-1, 9)", "while True:\n    pass", "x = bytearray(1 << 40)", "import os\nos.fork(); os.fork()"]
    honest = "print(sum(i * i for i in range(100)))"
    results = pool.run_many([a for attack in attacks for a in (attack, honest)])
    assert [r.stdout for r in results[1::2]] == ["328350\n"] * len(attacks)
