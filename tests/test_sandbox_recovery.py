"""A defect in one row fails that row with a reason; the job's other rows and the slot carry on."""

from __future__ import annotations

import json
import logging
import os
import time

import pytest

from molrl.sandbox import SandboxConfig, SandboxPool
from molrl.sandbox.runtime import codec
from molrl.sandbox.runtime.cleanup import remove_tree
from molrl.tasks import Task, TestCase

MERSENNE_61 = 2**61 - 1
"""Every multiple of it hashes to 0: a set of them puts all its items in one hash chain."""


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(workers=1, timeout_s=30.0, cache_size=0)) as p:
        yield p


def three_squares() -> Task:
    return Task(id="sq", prompt="", kind="code", entry_point="f",
                tests=[TestCase("call", args=[n], expected=n * n) for n in (2, 3, 4)])


FIND_RESULT_PIPE = (
    "import os, stat\n"
    "def _is_pipe(fd):\n"
    "    try:\n"
    "        return stat.S_ISFIFO(os.fstat(fd).st_mode)\n"
    "    except OSError:\n"
    "        return False\n"
    "RESULTS = next(fd for fd in range(3, 64) if _is_pipe(fd))\n"
)
"""Finds the task's result pipe: its only descriptor past stdio in a job of call tests."""


def test_a_json_depth_bomb_fails_only_its_own_row(pool, caplog):
    # the second call writes a record nested 100k deep on the result pipe in place of its own
    code = FIND_RESULT_PIPE + (
        "def f(x):\n"
        "    if x == 3:\n"
        "        os.write(RESULTS, b'{\"e\":\"call\",\"i\":1,\"value\":' + b'[' * 100_000 + b']' * 100_000 + b'}\\n')\n"
        "        os._exit(0)\n"
        "    return x * x\n"
    )
    caplog.set_level(logging.WARNING)
    result = pool.run_tests(code, three_squares())
    assert [t.passed for t in result.tests] == [True, False, False]
    assert "unreadable record" in result.tests[1].error and result.status == "ok"
    assert "unreadable record" in caplog.text


def test_a_record_nested_just_under_the_json_limit_fails_only_its_row(pool):
    deep = "[" * 985 + "]" * 985  # parses, but not once wrapped in the outcome message
    code = FIND_RESULT_PIPE + (
        "def f(x):\n"
        "    if x == 3:\n"
        f"        os.write(RESULTS, b'{{\"e\":\"call\",\"i\":1,\"value\":{{\"t\":\"list\",\"v\":{deep}}}}}\\n')\n"
        "        return 0\n"
        "    return x * x\n"
    )
    result = pool.run_tests(code, three_squares())
    assert [t.passed for t in result.tests] == [True, False, True]
    assert pool.backend.slots[0].restarts == 0


def encoded_ints(kind: str, ints) -> dict:
    """The encoded form of a set (or dict of int keys) built without building it: building a
    colliding one here would itself take quadratic time."""
    items = [{"t": "int", "v": str(i)} for i in ints]
    return {"t": kind, "v": [[k, {"t": "none"}] for k in items] if kind == "dict" else items}


def test_decoding_a_hash_colliding_set_is_refused_in_linear_time():
    n = 90_000
    ordinary = encoded_ints("set", (MERSENNE_61 + k for k in range(1, n + 1)))
    colliding = encoded_ints("set", (MERSENNE_61 * k for k in range(1, n + 1)))
    start = time.perf_counter()
    assert len(codec.decode(ordinary)) == n
    plain_s = time.perf_counter() - start
    start = time.perf_counter()
    with pytest.raises(ValueError, match="hash collisions"):
        codec.decode(colliding)
    colliding_s = time.perf_counter() - start
    assert colliding_s < 10 * plain_s + 0.5  # quadratic decoding took 133 s here


def test_a_dict_with_colliding_keys_is_refused_too():
    with pytest.raises(ValueError, match="hash collisions"):
        codec.decode(encoded_ints("dict", (MERSENNE_61 * k for k in range(1, 5_001))))
    ordinary = {-1: "a", -2: "b", (1, 2): "c"}  # -1 and -2 share a hash: a few collisions are fine
    assert codec.decode(codec.encode(ordinary)) == ordinary


def test_a_hash_colliding_set_fails_only_its_row(pool):
    # the task writes the colliding set's record itself: cheap for it, quadratic for a naive decoder
    record = json.dumps({"e": "call", "i": 1, "value": encoded_ints("set", (MERSENNE_61 * k for k in range(1, 90_001)))})
    code = FIND_RESULT_PIPE + (
        f"RECORD = {record!r}.encode() + b'\\n'\n"
        "def f(k):\n"
        "    if k == 0:\n"
        "        os.write(RESULTS, RECORD)\n"
        "        os._exit(0)\n"
        "    return {1}\n"
    )
    task = Task(id="c", prompt="", kind="code", entry_point="f", tests=[
        TestCase("call", args=[1], expected={1}), TestCase("call", args=[0], expected=set())])
    start = time.perf_counter()
    result = pool.run_tests(code, task)
    assert [t.passed for t in result.tests] == [True, False]
    assert "hash collisions" in result.tests[1].error
    assert time.perf_counter() - start < 20  # a quadratic decode of 90k items took 133 s


DEEP_TREE = "import os\nfor _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\nopen('leaf', 'w').write('x')\nprint('deep')\n"


def test_a_three_thousand_level_tree_is_removed_and_the_slot_carries_on(pool):
    assert pool.run(DEEP_TREE).stdout == "deep\n"
    later = [pool.run("import os\nprint(os.listdir('.'))") for _ in range(3)]
    assert [(r.status, r.stdout) for r in later] == [("ok", "[]\n")] * 3
    assert pool.backend.slots[0].restarts == 0


def test_the_process_backend_removes_a_deep_tree_too():
    with SandboxPool(SandboxConfig(workers=1, backend="process", cache_size=0)) as pool:
        host_dir = pool.backend.slots[0].host_dir
        assert pool.run(DEEP_TREE).stdout == "deep\n"
        assert pool.run("import os\nprint(os.listdir('.'))").stdout == "[]\n"
    assert not os.path.exists(host_dir)


def test_remove_tree_handles_depth_beyond_the_path_limit(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for _ in range(3000):  # 6,000 characters of path: more than PATH_MAX
        os.mkdir("d")
        os.chdir("d")
    os.mkdir("locked", 0)
    open("f", "w").close()
    os.symlink("/", "root-link")
    assert remove_tree(str(tmp_path / "d")) is None
    assert os.listdir(tmp_path) == []


def test_remove_tree_reports_what_it_could_not_remove(tmp_path, monkeypatch):
    (tmp_path / "w" / "sub").mkdir(parents=True)

    def refuse(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "rmdir", refuse)
    error = remove_tree(str(tmp_path / "w"))
    assert "Operation not permitted" in error and str(tmp_path / "w") in error


def test_a_worker_that_cannot_clean_up_is_replaced_and_its_job_keeps_its_result(monkeypatch):
    from molrl.sandbox import slot as slot_module

    real_read = slot_module.WorkerSlot._read

    def read_with_failed_cleanup(self, deadline):
        out = real_read(self, deadline)
        if isinstance(out, dict) and "status" in out and self.seq == 1:
            out["cleanup_error"] = "work dir /tmp/slot/work: Operation not permitted"
        return out

    monkeypatch.setattr(slot_module.WorkerSlot, "_read", read_with_failed_cleanup)
    with SandboxPool(SandboxConfig(workers=1, cache_size=0)) as pool:
        slot = pool.backend.slots[0]
        first_worker = slot.proc.pid
        first = pool.run("print('kept')")
        second = pool.run("print('next')")
        assert slot.proc.pid != first_worker and slot.restarts == 1
    assert (first.status, first.stdout) == ("ok", "kept\n")
    assert (second.status, second.stdout) == ("ok", "next\n")
