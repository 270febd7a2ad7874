"""Code grading: take the program out of a completion, run the task's tests in the sandbox, score.

Staged reward (values in ``CodeRewardConfig``): no code block < code does not compile < code runs
but errors (nothing passes: it crashed, timed out, or every test raised) < a fraction of the tests
pass < all tests pass. ``mode='binary'`` gives 1 for all tests passing and 0 otherwise.
"""

from __future__ import annotations

import json
import logging
import re
import warnings
from dataclasses import dataclass
from typing import Literal

from molrl.graders.grade import Grade
from molrl.sandbox import ExecResult, SandboxPool
from molrl.tasks import Task

log = logging.getLogger(__name__)

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\r?\n(.*?)```", re.S | re.I)
_TAG = re.compile(r"<(execute|solution)>(.*?)</\1>", re.S)


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


def extract_code(text: str) -> str | None:
    """The last code block of ``text``: a ```python (or bare ```) fence, or an <execute>/<solution> block.

    The last block wins because models draft and then correct themselves; a fence inside a tag
    block starts later than the tag, so the fence (the code itself) is taken.
    """
    blocks = [(m.start(), m.group(1)) for m in _FENCE.finditer(text)]
    blocks += [(m.start(2), m.group(2)) for m in _TAG.finditer(text)]
    for _, block in sorted(blocks, reverse=True):
        inner = _FENCE.search(block)
        code = (inner.group(1) if inner else block).strip("\n")
        if code.strip():
            return code
    return None


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


def grade_result(code: str, result: ExecResult, cfg: CodeRewardConfig) -> Grade:
    """The grade of a finished run (pure: no sandbox involved)."""
    n = len(result.tests)
    passed = result.passed
    tests = [{"index": t.index, "kind": t.kind, "passed": t.passed, "got": _clip(t.got), "error": t.error} for t in result.tests]
    details = {"status": result.status, "passed": passed, "total": n, "tests": tests,
               "stderr_tail": result.stderr[-500:], "error": result.error}
    if result.status == "sandbox_error" and passed == 0:
        stage = "sandbox_error"
        log.error("sandbox error while grading: %s", result.error)
    elif n and passed == n:
        stage = "all_pass"
    elif passed == 0 and (result.status != "ok" or all(t.error not in (None, "wrong answer", "wrong output") for t in result.tests)):
        stage = "runtime_error"
    else:
        stage = "partial"
    fraction = passed / n if n else 0.0
    details["fraction"] = fraction
    return Grade(_stage_score(stage, fraction, cfg), stage == "all_pass", stage, code, details)


def grade_code(completions: list[str], tasks: list[Task], pool: SandboxPool,
               cfg: CodeRewardConfig | None = None) -> list[Grade]:
    """Grade each completion against its task; every sandbox run of the batch goes out at once."""
    cfg = cfg or CodeRewardConfig()
    grades: list[Grade | None] = [None] * len(completions)
    to_run: list[tuple[int, str, str, Task]] = []
    for i, (text, task) in enumerate(zip(completions, tasks, strict=True)):
        code = extract_code(text)
        if code is None:
            grades[i] = Grade(_stage_score("no_code", 0.0, cfg), False, "no_code", None, {"reason": "no code block found"})
            continue
        program = program_for(code, task)
        try:
            with warnings.catch_warnings():  # e.g. invalid escape sequences: the sandbox shows them
                warnings.simplefilter("ignore")
                compile(program, "solution.py", "exec")
        except (SyntaxError, ValueError) as err:
            grades[i] = Grade(_stage_score("compile_error", 0.0, cfg), False, "compile_error", code, {"error": f"{type(err).__name__}: {err}"})
            continue
        to_run.append((i, code, program, task))
    results = pool.run_tests_many([(program, task) for _, _, program, task in to_run]) if to_run else []
    for (i, code, _, _), result in zip(to_run, results):
        grades[i] = grade_result(code, result, cfg)
    return grades
