"""Code grading: take the program out of a completion (``molrl.graders.extract``), run the task's tests in the sandbox,
score.

Staged reward (values in ``CodeRewardConfig``): no code block < code does not compile < code runs
but errors (nothing passes: it crashed, timed out, or every test raised) < a fraction of the tests
pass < all tests pass. ``mode='binary'`` gives 1 for all tests passing and 0 otherwise.

Model-written code is never compiled here (extraction only tokenizes it, ``molrl.graders.toplevel``): a program that
nests a few thousand brackets makes the compiler raise RecursionError or MemoryError, so compile errors are read
from the sandbox's run.
Rows are graded independently: a row whose run or judgement raises is graded ``grader_error``
(logged, never a pass) and every other row of the batch keeps its own grade.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Literal

from molrl.graders.extract import extract_code
from molrl.graders.grade import Grade
from molrl.sandbox import ExecResult, SandboxPool
from molrl.task_types import Task

log = logging.getLogger(__name__)


@dataclass
class CodeRewardConfig:
    """Values of the staged code reward."""

    mode: Literal["staged", "binary"] = "staged"
    """staged: one value per stage, partial credit by fraction passed; binary: 1 if all pass else 0."""
    no_code: float = 0.0
    """No code block in the completion."""
    compile_error: float = 0.1
    """The code does not compile."""
    runtime_error: float = 0.2
    """The code runs but nothing passes because it errors (crash, timeout, limit, every test raising)."""
    partial_min: float = 0.3
    """Runs without crashing but passes no test; partial credit rises linearly from here..."""
    partial_max: float = 0.9
    """...towards this value as the fraction of tests passed approaches 1."""
    all_pass: float = 1.0
    """Every test passes."""
    sandbox_error: float = 0.0
    """The sandbox itself failed (logged; never a pass)."""
    grader_error: float = 0.0
    """Running or judging this row raised in the grader (logged; never a pass)."""


def program_for(code: str, task: Task) -> str:
    """The program that runs: the task's preamble (prompt imports and helpers) then the code."""
    return f"{task.preamble}\n{code}" if task.preamble else code


def _stage_score(stage: str, fraction: float, cfg: CodeRewardConfig) -> float:
    if cfg.mode == "binary":
        return 1.0 if stage == "all_pass" else 0.0
    if stage == "partial":
        return cfg.partial_min + (cfg.partial_max - cfg.partial_min) * fraction
    return float(getattr(cfg, stage))


def _clip(value, limit: int = 2000):
    """A returned value for the grade's details, replaced by a short note when it is large."""
    text = json.dumps(value)
    return value if len(text) <= limit else {"t": "clipped", "json_prefix": text[:limit]}


_COMPILE_ERROR_LINE = re.compile(
    r"(?:SyntaxError|IndentationError|TabError|RecursionError|MemoryError|ValueError|OverflowError)\b.*")
"""The last stderr line of a program the sandbox could not compile: what ``compile()`` can raise."""
_SYNTAX_ERROR_AT = re.compile(r'File "solution\.py", line (\d+)\n')
"""How a SyntaxError's display starts: the line of the program the compiler stopped at."""


def compile_error_of(result: ExecResult) -> str | None:
    """The compiler's complaint when the sandbox could not compile the program, else None.

    The task process prints a load error with a ``Traceback`` header only when a frame of the
    program was running; a compile failure has no such frame, so its stderr is the bare exception
    (a SyntaxError's display starts at ``File "solution.py"``). Code that did run can only fake this
    by printing it, which scores it compile_error, below the runtime_error it would otherwise get.
    """
    if result.passed or result.status not in ("runtime_error", "memory_limit"):
        return None
    stderr = result.stderr.strip()
    if not stderr or "Traceback (most recent call last):" in stderr:
        return None
    where = _SYNTAX_ERROR_AT.match(stderr)
    at = f" (solution.py, line {where.group(1)})" if where else ""
    last = stderr.rsplit("\n", 1)[-1].strip()
    if _COMPILE_ERROR_LINE.fullmatch(last):
        return last[:1000] + at
    if where:  # a SyntaxError display whose long source line filled stderr before the message
        return "SyntaxError (message cut off with the output)" + at
    return None


def grade_result(code: str, result: ExecResult, cfg: CodeRewardConfig) -> Grade:
    """The grade of a finished run (pure: no sandbox involved)."""
    n = len(result.tests)
    passed = result.passed
    tests = [{"index": t.index, "kind": t.kind, "passed": t.passed, "got": _clip(t.got), "error": t.error} for t in result.tests]
    details = {"status": result.status, "passed": passed, "total": n, "tests": tests,
               "stderr_tail": result.stderr[-500:], "error": result.error}
    compile_error = compile_error_of(result)
    if result.status == "sandbox_error":  # some of its tests have no verdict: the task has none
        stage = "sandbox_error"
        log.error("sandbox error while grading: %s", result.error)
    elif n and passed == n:
        stage = "all_pass"
    elif compile_error is not None:
        stage = "compile_error"
        details["error"] = compile_error
    elif passed == 0 and (result.status != "ok" or all(t.error not in (None, "wrong answer", "wrong output") for t in result.tests)):
        stage = "runtime_error"
    else:
        stage = "partial"
    fraction = passed / n if n else 0.0
    details["fraction"] = fraction
    return Grade(_stage_score(stage, fraction, cfg), stage == "all_pass", stage, code, details)


def grade_code(completions: list[str], tasks: list[Task], pool: SandboxPool,
               cfg: CodeRewardConfig | None = None) -> list[Grade]:
    """Grade each completion against its task; every sandbox run of the batch goes out at once.

    Never raises for one row's sake: a row whose run or judgement fails is graded grader_error.
    """
    cfg = cfg or CodeRewardConfig()
    grades: list[Grade | None] = [None] * len(completions)
    to_run: list[tuple[int, str, Task]] = []
    for i, (text, task) in enumerate(zip(completions, tasks, strict=True)):
        code = extract_code(text, task.entry_point)
        if code is None:
            grades[i] = Grade(_stage_score("no_code", 0.0, cfg), False, "no_code", None, {"reason": "no code block found"})
            continue
        to_run.append((i, code, task))
    results = run_isolated(pool, [(program_for(code, task), task) for _, code, task in to_run])
    for (i, code, task), result in zip(to_run, results):
        try:
            if isinstance(result, Exception):
                raise result
            grades[i] = grade_result(code, result, cfg)
        except Exception as err:  # noqa: BLE001 - one row's failure must not fail the batch
            log.error("grading task %s failed, scored grader_error: %s: %s", task.id, type(err).__name__, err)
            grades[i] = Grade(_stage_score("grader_error", 0.0, cfg), False, "grader_error", code,
                              {"error": f"{type(err).__name__}: {err}"[:1000]})
    return grades


def run_isolated(pool: SandboxPool, pairs: list[tuple[str, Task]]) -> list[ExecResult | Exception]:
    """``pool.run_tests_many(pairs)``, with the exception in place of the result of each pair that raises.

    A failing batch is split in halves until the failing pairs stand alone: one bad row costs about
    log2(n) more batches, each still parallel, and the pool's cache answers the runs already made.
    """
    if not pairs:
        return []
    try:
        return list(pool.run_tests_many(pairs))
    except Exception as err:  # noqa: BLE001 - kept for the row it belongs to
        if len(pairs) == 1:
            return [err]
        mid = len(pairs) // 2
        return run_isolated(pool, pairs[:mid]) + run_isolated(pool, pairs[mid:])
