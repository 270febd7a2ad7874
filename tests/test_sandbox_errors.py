"""The stop rule for a sandbox that keeps failing, in closed form: past sandbox.max_error_rate of graded rows, once
32 rows have been graded."""

from __future__ import annotations

import pytest

from molrl.errors import MolrlError
from molrl.sandbox.errors import MIN_ROWS, ErrorCount, check_error_rate


def test_the_line_names_the_count_the_share_the_key_and_what_to_check():
    with pytest.raises(MolrlError) as caught:
        check_error_rate(41, 200, 0.1, "rl")  # 41 / 200 = 20.5% > 10%
    assert str(caught.value) == (
        "rl: 41 of 200 graded rows (20.5%) were sandbox errors, past sandbox.max_error_rate=0.1; check the sandbox "
        "(the servers' `molrl sandbox serve` logs, or the workers' lines above) or raise sandbox.max_error_rate")


def test_nothing_is_checked_before_32_rows():
    assert MIN_ROWS == 32
    check_error_rate(31, 31, 0.1, "eval")  # every row failed, but too few to judge the sandbox by
    with pytest.raises(MolrlError, match="32 of 32 graded rows"):
        check_error_rate(32, 32, 0.1, "eval")


@pytest.mark.parametrize("errors, total, limit, stops", [
    (3, 32, 0.1, False),  # 9.4%
    (4, 32, 0.1, True),  # 12.5%
    (10, 100, 0.1, False),  # exactly at the limit is not past it
    (29, 100, 0.29, False),  # 0.29 * 100 rounds below 29 in floating point; the share does not
    (11, 100, 0.1, True),
    (1, 32, 0.0, True),  # a limit of 0: any sandbox error stops the run
    (0, 32, 0.0, False),
    (500, 500, 1.0, False),  # a limit of 1: never
])
def test_a_run_stops_only_past_the_limit(errors, total, limit, stops):
    if stops:
        with pytest.raises(MolrlError, match="past sandbox.max_error_rate"):
            check_error_rate(errors, total, limit, "collect")
    else:
        check_error_rate(errors, total, limit, "collect")


def test_the_count_adds_up_its_batches_and_stops_when_the_run_passes_the_limit():
    count = ErrorCount(0.25, "rl")
    count.add(8, 16)  # 50%, but 16 rows: not checked yet
    count.add(0, 15)  # 8 of 31
    assert (count.errors, count.total) == (8, 31)
    with pytest.raises(MolrlError, match=r"rl: 9 of 32 graded rows \(28.1%\)"):
        count.add(1, 1)


def test_a_task_with_one_job_the_sandbox_could_not_run_has_no_verdict():
    """Its call test ran and passed, its stdio test's job was lost: the task is a sandbox_error, never partial."""
    from failing_sandbox import FailingBackend

    from molrl.graders.code import grade_code
    from molrl.sandbox import LocalBackend, SandboxConfig, SandboxPool
    from molrl.tasks import Task, TestCase

    task = Task(id="sq", prompt="", kind="code", entry_point="f",
                tests=[TestCase("call", args=[3], expected=9), TestCase("stdio", stdin="", stdout="")])
    cfg = SandboxConfig(workers=1, cache_size=0)
    completion = "```python\ndef f(x):\n    return x * x\n```"
    with SandboxPool(cfg) as pool:
        (whole,) = grade_code([completion], [task], pool)
    with SandboxPool(cfg, backend=FailingBackend(LocalBackend(cfg), every=2)) as pool:
        result = pool.run_tests("def f(x):\n    return x * x\n", task)
        (lost,) = grade_code([completion], [task], pool)
    assert whole.stage == "all_pass"
    assert [t.passed for t in result.tests] == [True, False] and result.status == "sandbox_error"
    assert lost.stage == "sandbox_error"
