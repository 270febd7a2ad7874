"""Reward functions for training with TRL directly, on ``molrl.tasks.grade`` like molrl's own RL stage.

molrl's RL stage scores in ``molrl.rl.score``; these are for users who build their own TRL trainer.

Each is called as ``reward(prompts, completions, task_json=[...], **other_columns)`` and returns
one float per completion. Completions may be strings or chat message lists. A completion the grader
cannot grade (it raises on it, or the sandbox fails) scores as a failure of its own (logged); the
other completions of the batch keep their scores. When TRL passes ``log_metric``, the per-stage
fractions of the batch are logged with it.

>>> from molrl.tasks import Task
>>> task = Task(id="t", prompt="What is 6*7?", kind="math", answer="42")
>>> MathReward()(["q"], ["So the answer is \\\\boxed{42}."], task_json=[task.to_json()])
[1.0]
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

from molrl.graders.code import CodeRewardConfig
from molrl.graders.grade import Grade
from molrl.sandbox import SandboxPool
from molrl.tasks.grade import grade
from molrl.task_types import Task


def completion_text(completion: Any) -> str:
    """The text of a completion: a string, or the assistant content of a chat message list."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    parts = []
    for message in completion or []:
        if message.get("role", "assistant") != "assistant":
            continue
        content = message.get("content") or ""
        if isinstance(content, list):  # multimodal-style parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(content)
    return "\n".join(parts)


class _Reward:
    """Shared bookkeeping: the last batch's grades and their stage breakdown."""

    __name__ = "reward"

    def __init__(self) -> None:
        self.last_grades: list[Grade] = []

    def stage_breakdown(self) -> dict[str, float]:
        """Fraction of the last batch at each stage, plus the mean score (``<name>/<stage>`` keys)."""
        n = len(self.last_grades) or 1
        counts = Counter(g.stage for g in self.last_grades)
        out = {f"{self.__name__}/{stage}": count / n for stage, count in sorted(counts.items())}
        out[f"{self.__name__}/mean"] = sum(g.score for g in self.last_grades) / n
        return out

    def _finish(self, grades: list[Grade], kwargs: dict) -> list[float]:
        self.last_grades = grades
        log_metric = kwargs.get("log_metric")
        if callable(log_metric):
            for name, value in self.stage_breakdown().items():
                log_metric(name, value)
        return [g.score for g in grades]


def _tasks(task_json: list[str] | None, n: int) -> list[Task]:
    if task_json is None or len(task_json) != n:
        from molrl.errors import MolrlError

        raise MolrlError(f"reward needs a 'task_json' dataset column with one Task.to_json() per completion (got {None if task_json is None else len(task_json)} for {n} completions)")
    return [_parse_task(t) if isinstance(t, str) else t for t in task_json]


_parse_task = functools.lru_cache(maxsize=4096)(Task.from_json)
"""Task.from_json, remembered: a GRPO group repeats the same task for each of its completions."""


class CodeReward(_Reward):
    """Code reward: the task's tests run in the sandbox pool, the whole batch in parallel.

    >>> from molrl.sandbox import SandboxConfig, SandboxPool
    >>> from molrl.tasks import Task, TestCase
    >>> task = Task(id="sq", prompt="square x", kind="code", entry_point="sq",
    ...             tests=[TestCase("call", args=[3], expected=9)])
    >>> with SandboxPool(SandboxConfig(workers=1)) as pool:
    ...     reward = CodeReward(pool)
    ...     reward(["p", "p"], ["```python\\ndef sq(x):\\n    return x * x\\n```", "no code"],
    ...            task_json=[task.to_json()] * 2)
    [1.0, 0.0]
    """

    __name__ = "code_reward"

    def __init__(self, pool: SandboxPool, cfg: CodeRewardConfig | None = None):
        super().__init__()
        self.pool = pool
        self.cfg = cfg or CodeRewardConfig()

    def __call__(self, prompts: list, completions: list, task_json: list[str] | None = None, **kwargs) -> list[float]:
        """One reward per completion."""
        texts = [completion_text(c) for c in completions]
        tasks = _tasks(task_json, len(texts))
        # grading fails only the rows that fail, so one bad row never costs the others their scores
        return self._finish(grade(tasks, texts, self.pool, self.cfg), kwargs)


class MathReward(_Reward):
    """Math reward: 1.0 when the final answer is equivalent to the task's answer (math-verify).

    Graded in a worker process within a time budget per batch, so any thread may call it
    (``molrl.graders.math_worker``).
    """

    __name__ = "math_reward"

    def __call__(self, prompts: list, completions: list, task_json: list[str] | None = None, **kwargs) -> list[float]:
        """One reward per completion."""
        texts = [completion_text(c) for c in completions]
        tasks = _tasks(task_json, len(texts))
        # math grading never raises: a completion it cannot grade is its own grader_error
        return self._finish(grade(tasks, texts), kwargs)
