"""A toy verifiable task a tiny randomly initialised model can learn in a few dozen GRPO steps.

The task asks for lowercase letters. Each completion is fed on stdin to a fixed checker program
that runs in the sandbox and prints how many of the characters it read are ASCII lowercase
letters, and how many it read; the reward, ``letters / characters`` (0 for an empty answer), is
computed here from that output, outside the sandbox. A byte-level tiny model starts near the
base rate (26 of ~260 tokens) and GRPO pushes it towards 1, which makes the toy a quick check that
the whole loop (sampling, sandbox execution, advantages, update) moves the policy the right way.
"""

from __future__ import annotations

from typing import Any, Sequence

from molrl.tasks import Task

CHECKER = "import sys\ns = sys.stdin.read()\nprint(sum('a' <= c <= 'z' for c in s), len(s))\n"
PROMPT = "Reply with lowercase letters only."


def toy_tasks(n: int) -> list[Task]:
    """``n`` copies of the toy task (distinct ids)."""
    return [Task(id=f"toy-{i}", prompt=PROMPT, kind="code", meta={"toy": "lowercase"}) for i in range(n)]


def parse_checker_output(stdout: str) -> float:
    """Reward from the checker's ``"<letters> <characters>"`` line; ValueError when it is malformed."""
    letters, chars = (int(x) for x in stdout.split())
    if not 0 <= letters <= chars:
        raise ValueError(f"checker printed {stdout.strip()!r}: letters must be within 0..characters")
    return letters / chars if chars else 0.0


class LowercaseReward:
    """TRL batch reward for the toy task: the sandboxed checker counts, this process scores."""

    def __init__(self, pool: Any):
        self.pool = pool
        self.__name__ = "lowercase"

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **kwargs: Any) -> list[float]:
        """Fraction of lowercase letters in each completion, counted by the checker in the sandbox."""
        from molrl.sandbox import ExecJob

        results = self.pool.run_many([ExecJob(CHECKER, stdin=c) for c in completions])
        scores = []
        for result in results:
            if result.status != "ok":
                raise RuntimeError(f"checker {result.status}: {result.error or result.stderr[-200:]}")
            scores.append(parse_checker_output(result.stdout))
        return scores
