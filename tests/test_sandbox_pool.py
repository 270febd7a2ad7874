"""SandboxPool basics: statuses, output bounds, limits, tests judged outside, cache, backends."""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys

import pytest

from molrl.sandbox import ExecJob, SandboxConfig, SandboxPool
from molrl.sandbox.compare import normalise_output, values_equal
from molrl.sandbox.runtime import cleanup, codec
from molrl.tasks import Task, TestCase


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(workers=2, timeout_s=3.0, max_output_kb=4)) as p:
        yield p


def test_stdout_stdin_and_exit_code(pool):
    result = pool.run("import sys\nprint(input()[::-1])\nsys.exit(3)", stdin="abc\n")
    assert (result.status, result.exit_code, result.stdout) == ("runtime_error", 3, "cba\n")


def test_code_naming_a_preimported_module_starts_where_it_is_loaded(pool):
    pytest.importorskip("numpy")
    probe = "import sys\nprint(('nu' + 'mpy') in sys.modules)"
    plain, naming = pool.run(probe), pool.run("# numpy\n" + probe)
    assert (plain.stdout, naming.stdout) == ("False\n", "True\n")  # lean zygote, then warm zygote


def test_exception_is_runtime_error_with_traceback(pool):
    result = pool.run("def f():\n    raise KeyError('boom')\nf()")
    assert result.status == "runtime_error" and "KeyError: 'boom'" in result.stderr


def test_numpy_is_preloaded_and_single_threaded(pool):
    result = pool.run("import numpy as np, os\nprint(np.arange(4).sum(), os.environ['OPENBLAS_NUM_THREADS'])")
    assert result.stdout == "6 1\n"


def test_timeout_is_enforced_and_reaped_well_before_the_cpu_backstop(pool):
    result = pool.run("while True:\n    pass", timeout_s=0.3)
    assert result.status == "timeout" and result.exit_code == -9
    # RLIMIT_CPU (timeout + 2 s) would end it later; margins allow for a loaded machine
    assert 0.3 <= result.duration_s < 1.5 and result.info["reap_ms"] < 500


def test_output_beyond_the_kept_head_is_counted_and_flagged(pool):
    result = pool.run("print('z' * 10000)")
    assert result.status == "ok" and result.truncated
    assert len(result.stdout) == 4 * 1024 and result.stdout_bytes == 10001


def test_run_many_keeps_order(pool):
    results = pool.run_many([f"print({i} * 2)" for i in range(12)] + [ExecJob("print(input())", stdin="x")])
    assert [r.stdout for r in results] == [f"{i * 2}\n" for i in range(12)] + ["x\n"]


def test_identical_jobs_run_once_then_come_from_cache(pool):
    code = "import random\nprint(random.random())"
    first, second = pool.run_many([code, code])
    third = pool.run(code)
    assert first.stdout == second.stdout == third.stdout
    assert (first.cached, second.cached, third.cached) == (False, False, True)


def test_call_tests_are_compared_outside(pool):
    task = Task(id="t", prompt="", kind="code", entry_point="f", tests=[
        TestCase("call", args=[[3, 1, 2]], expected=[1, 2, 3]),
        TestCase("call", args=[[1]], expected=(1,)),
        TestCase("call", args=[[]], expected=[]),
    ])
    result = pool.run_tests("def f(xs):\n    return sorted(xs)", task)
    assert [t.passed for t in result.tests] == [True, False, True]
    assert result.tests[1].got == {"t": "list", "v": [{"t": "int", "v": "1"}]}


def test_exception_in_one_call_leaves_the_others(pool):
    task = Task(id="t", prompt="", kind="code", entry_point="inv", tests=[
        TestCase("call", args=[0], expected=0.0), TestCase("call", args=[4], expected=0.25)])
    result = pool.run_tests("def inv(x):\n    return 1 / x", task)
    assert [t.passed for t in result.tests] == [False, True]
    assert result.tests[0].error.startswith("ZeroDivisionError")


def test_stdio_tests_compare_normalised_whole_output(pool):
    task = Task(id="t", prompt="", kind="code", tests=[
        TestCase("stdio", stdin="2 3\n", stdout="5\n"), TestCase("stdio", stdin="1 1\n", stdout="3")])
    result = pool.run_tests("a, b = map(int, input().split())\nprint(a + b, ' ')\n\n", task)
    assert [t.passed for t in result.tests] == [True, False]


def test_judged_assert_tests_see_only_plain_values(pool):
    task = Task(id="t", prompt="", kind="code", entry_point="f", tests=[
        TestCase("assert", source="assert math.isclose(f(2), 4.0)"),
        TestCase("assert", source="def check(candidate):\n    for i in range(5):\n        assert candidate(i) == i * i\ncheck(candidate)"),
        TestCase("assert", source="assert f(3) == 10"),
    ])
    result = pool.run_tests("def f(x):\n    return x * x", task)
    assert [t.passed for t in result.tests] == [True, True, False]


def test_setup_code_runs_after_the_solution(pool):
    task = Task(id="t", prompt="", kind="code", entry_point="size", setup_code="thing = Box(5)",
                tests=[TestCase("call", expected=5, args_source="(thing,)")])
    code = "class Box:\n    def __init__(self, n):\n        self.n = n\ndef size(b):\n    return b.n"
    assert pool.run_tests(code, task).tests[0].passed


def test_codec_keeps_exact_types():
    value = {1: (2.5, float("inf")), "s": {frozenset({b"x"})}, "n": None, "c": [True, 3j]}
    back = codec.decode(codec.encode(value))
    assert back == value and type(back[1]) is tuple and type(back["c"][0]) is bool


def test_float_tolerance_is_relative():
    assert values_equal(0.1 + 0.2, 0.3) and not values_equal(0.3, 0.31)
    assert values_equal([1.0, (2, 3.0)], [1, (2, 3.0 + 1e-12)]) and not values_equal([1], (1,))
    assert not values_equal(math.nan, math.nan)


def test_float_near_integer_fails_an_integer_expected_value():
    # the tolerance is the expected value's: an int is matched as exactly as the benchmark's own ==
    binet = ((1 + 5 ** 0.5) / 2) ** 10 / 5 ** 0.5 - ((1 - 5 ** 0.5) / 2) ** 10 / 5 ** 0.5
    assert binet != 55 and abs(binet - 55) < 1e-9 * 55  # within the float tolerance, yet not 55
    assert not values_equal(55, binet) and not values_equal(125411328000, 125411328050.16)
    assert not values_equal([1, 55], [1, binet]) and not values_equal({"n": 55}, {"n": binet})
    assert values_equal(55, 55.0) and values_equal(55.0, binet) and values_equal(55.0, 55)
    assert values_equal(1, True) and not values_equal(1.0, 2)


def test_normalised_output_ignores_trailing_space_only():
    assert normalise_output("a  \r\nb\n\n") == "a\nb" and normalise_output(" a") != normalise_output("a")


def test_process_backend_warns_and_still_confines_time(caplog):
    caplog.set_level(logging.WARNING)
    with SandboxPool(SandboxConfig(workers=1, backend="process", timeout_s=2.0)) as pool:
        ok = pool.run("print(2 + 2)")
        looping = pool.run("import os\nif os.fork() == 0:\n    os.setsid()\nwhile True:\n    pass")
    assert "WITHOUT network, pid or mount isolation" in caplog.text
    assert (ok.status, ok.stdout) == ("ok", "4\n")
    assert looping.status == "timeout" and looping.info["stray_processes"] == 1


def test_strays_are_looked_for_only_once_what_was_killed_has_died(monkeypatch):
    """A dying parent hands its children to the subreaper, and the children files are read one
    process at a time: a look during the hand-over can find the child in neither list and leave it
    running (it did, once, on a loaded machine). A process with half a gigabyte to unmap dies slowly,
    so a look straight after its kill sees it still dying."""
    big = "b = b'x' * (1 << 29); print(1, flush=True); import time; time.sleep(60)"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        f"big = subprocess.Popen([sys.executable, '-c', {big!r}], stdout=subprocess.PIPE)\n"
        "big.stdout.readline(); print(big.pid, flush=True); time.sleep(60)")], stdout=subprocess.PIPE)
    try:
        big_pid = int(holder.stdout.readline())
        killed, looked_while_dying = set(), []
        real_kill, real_killpg, real_look = os.kill, os.killpg, cleanup._task_processes

        def kill(pid, sig, real=real_kill):
            killed.add(pid)
            real(pid, sig)

        def look(*args):
            looked_while_dying.extend(p for p in killed if not cleanup._is_zombie(p))
            return real_look(*args)

        monkeypatch.setattr(os, "kill", kill)
        monkeypatch.setattr(os, "killpg", lambda pid, sig: kill(pid, sig, real_killpg))
        monkeypatch.setattr(cleanup, "_task_processes", look)
        assert cleanup.kill_all([big_pid], (None,), False, root=holder.pid) == 0
        assert big_pid in killed and looked_while_dying == [] and cleanup._is_zombie(big_pid)
    finally:
        holder.kill()
        holder.wait()


def worker_pid(slot) -> int:
    """Host pid of the worker.py process under a slot's bwrap (or the slot's process itself)."""
    todo = [slot.proc.pid]
    while todo:
        pid = todo.pop()
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
        if b"python" in argv[0] and any(a.endswith(b"worker.py") for a in argv):
            return pid
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            todo += [int(k) for k in fh.read().split()]
    raise LookupError("no worker process")


def freeze(slot) -> int:
    """SIGSTOP the slot's worker, then the job server it forked for the next job; the worker's pid."""
    import signal

    pid = worker_pid(slot)
    os.kill(pid, signal.SIGSTOP)
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        for child in fh.read().split():
            os.kill(int(child), signal.SIGSTOP)
    return pid


def test_dead_or_hung_worker_is_replaced_and_never_scores():
    import signal

    with SandboxPool(SandboxConfig(workers=1, timeout_s=0.5, worker_grace_s=2.0, cache_size=0)) as pool:
        slot = pool.backend.slots[0]
        os.kill(worker_pid(slot), signal.SIGKILL)  # the worker dies between jobs
        dead = pool.run("print(1)")
        freeze(slot)  # its replacement hangs
        hung = pool.run("print(2)")
        after = pool.run("print(3)")
        stopped = freeze(slot)
        pool.run("print(4)")
    assert dead.status == hung.status == "sandbox_error" and slot.restarts == 3
    assert (after.status, after.stdout) == ("ok", "3\n")
    assert not os.path.exists(f"/proc/{stopped}")  # a replaced worker leaves nothing running


def test_two_pools_in_one_process_use_distinct_uids():
    with SandboxPool(SandboxConfig(workers=2)) as a, SandboxPool(SandboxConfig(workers=2)) as b:
        uids_a = {u for s in a.backend.slots for u in (s.uid, s.uid + 1)}
        uids_b = {u for s in b.backend.slots for u in (s.uid, s.uid + 1)}
        outs = [a.run("print('a')"), b.run("print('b')")]
    assert len(uids_a) == len(uids_b) == 4 and not uids_a & uids_b
    assert [o.stdout for o in outs] == ["a\n", "b\n"]


def test_a_slot_failing_to_start_stops_the_others(monkeypatch):
    from molrl.errors import MolrlError
    from molrl.sandbox import slot as slot_module

    started = []
    real_start = slot_module.WorkerSlot.start

    def start(self):
        if self.index == 1:
            raise RuntimeError("cannot start")
        real_start(self)
        started.append(self)

    monkeypatch.setattr(slot_module.WorkerSlot, "start", start)
    with pytest.raises(MolrlError, match="cannot start"):
        SandboxPool(SandboxConfig(workers=3))
    assert len(started) == 2 and all(s.proc is None and s.cgroup.path is None for s in started)


def test_a_python_started_by_a_path_through_its_cwd_still_starts_workers(tmp_path):
    # `cd benchmarks && ../.venv/bin/python ...`: sys.executable then runs through the cwd, which the sandbox
    # does not mount
    import subprocess
    import sys

    here = tmp_path / "cwd"
    here.mkdir()
    python = os.path.relpath(sys.executable, here)
    code = ("import sys; from molrl.sandbox import SandboxConfig, SandboxPool\n"
            "assert '..' in sys.executable, sys.executable\n"
            "with SandboxPool(SandboxConfig(workers=1)) as pool:\n    print(pool.run('print(6 * 7)').stdout.strip())")
    done = subprocess.run([python, "-c", code], cwd=here, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "42"
