"""A toy verifiable task a tiny randomly initialised model can learn in a few dozen RL steps.

The task asks for lowercase letters. Each completion is fed on stdin to a fixed checker program
that runs in the sandbox and prints how many of the characters it read are ASCII lowercase
letters, and how many it read; the score, ``letters / characters`` (0 for an empty answer), is
computed here from that output, outside the sandbox. A byte-level tiny model starts near the
base rate (26 of ~260 tokens) and RL pushes it towards 1, which makes the toy a quick check that
the whole loop (sampling, sandbox execution, advantages, update) moves the policy the right way.
"""

from __future__ import annotations

from typing import Any, Sequence

from molrl.graders.grade import Grade
from molrl.task_types import Task

CHECKER = "import sys\ns = sys.stdin.read()\nprint(sum('a' <= c <= 'z' for c in s), len(s))\n"
PROMPT = "Reply with lowercase letters only."


def toy_tasks(n: int) -> list[Task]:
    """``n`` copies of the toy task (distinct ids)."""
    return [Task(id=f"toy-{i}", prompt=PROMPT, kind="toy") for i in range(n)]


def parse_checker_output(stdout: str) -> float:
    """Score from the checker's ``"<letters> <characters>"`` line; ValueError when it is malformed."""
    letters, chars = (int(x) for x in stdout.split())
    if not 0 <= letters <= chars:
        raise ValueError(f"checker printed {stdout.strip()!r}: letters must be within 0..characters")
    return letters / chars if chars else 0.0


def grade_toy(completions: Sequence[str], pool: Any) -> list[Grade]:
    """One grade per completion: the fraction of lowercase letters, counted by the checker in the sandbox.

    A checker run that fails or prints something malformed is that completion's ``sandbox_error``.
    """
    from molrl.sandbox import ExecJob

    grades = []
    for result in pool.run_many([ExecJob(CHECKER, stdin=c) for c in completions]):
        try:
            if result.status != "ok":
                raise RuntimeError(f"checker {result.status}: {result.error or result.stderr[-200:]}")
            score = parse_checker_output(result.stdout)
        except (RuntimeError, ValueError) as err:
            grades.append(Grade(0.0, False, "sandbox_error", details={"error": str(err)}))
            continue
        grades.append(Grade(score, score == 1.0, "scored"))
    return grades
