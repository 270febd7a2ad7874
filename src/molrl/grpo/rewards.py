"""Reward functions as GRPO sees them: task-routed, guarded, logged.

``TaskReward`` sends each completion to the grader of its task's kind (the shared code reward,
staged or binary, or the math reward of ``molrl.rewards``; the toy reward for toy tasks) and
reports per-stage fractions. ``GuardedReward`` wraps it for TRL: scoring never raises into the
training loop. When a batch fails (a reward function raises, the sandbox dies mid-batch), the
batch is scored again row by row; a row that still fails is scored ``failure_reward``, logged
with its task id and the error, and marked in ``completions.jsonl``; training continues.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any, Callable, Sequence

log = logging.getLogger(__name__)


class TaskReward:
    """Routes each completion to the reward function of its task's kind (code / math / toy)."""

    def __init__(self, by_kind: dict[str, Callable[..., list[float]]]):
        self.by_kind = by_kind
        self.__name__ = "correctness"
        self.last_stages: list[str] = []
        self.last_errors: list[str | None] = []

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], task_json: Sequence[str],
                 **kwargs: Any) -> list[float]:
        """One score per completion, from its task kind's reward function."""
        kinds = [task_kind(t) for t in task_json]
        n = len(completions)
        scores: list[float] = [math.nan] * n
        self.last_stages, self.last_errors = ["scored"] * n, [None] * n
        for kind in sorted(set(kinds)):
            func = self.by_kind.get(kind)
            if func is None:
                raise ValueError(f"no reward function for {kind!r} tasks; configured: {', '.join(self.by_kind)}")
            rows = [i for i, k in enumerate(kinds) if k == kind]
            part = func(prompts=[prompts[i] for i in rows], completions=[completions[i] for i in rows],
                        task_json=[task_json[i] for i in rows])
            if len(part) != len(rows):
                raise ValueError(f"{kind} reward returned {len(part)} scores for {len(rows)} completions")
            grades = list(getattr(func, "last_grades", None) or [])[-len(rows):]
            for j, (i, score) in enumerate(zip(rows, part)):
                scores[i] = score
                grade = grades[j] if len(grades) == len(rows) else None
                self.last_stages[i] = f"{kind}/{grade.stage}" if grade else kind
                if grade is not None and grade.stage in ("sandbox_error", "grader_error"):
                    self.last_errors[i] = str(grade.details.get("error", grade.stage))
        return scores


def task_kind(task_json: str) -> str:
    """``toy``, ``code`` or ``math`` for a dataset row's task."""
    data = json.loads(task_json)
    return "toy" if data.get("meta", {}).get("toy") else data["kind"]


def task_id(task_json: str) -> str:
    """The task id of a dataset row, or ``?`` when the row is not valid JSON."""
    try:
        return str(json.loads(task_json).get("id", "?"))
    except (ValueError, AttributeError):
        return "?"


class GuardedReward:
    """A TRL reward function that scores failures as ``failure_reward`` instead of raising."""

    def __init__(self, func: Callable[..., list[float]], failure_reward: float = 0.0):
        self.func = func
        self.failure_reward = failure_reward
        self.__name__ = getattr(func, "__name__", type(func).__name__)
        self.seen_stages: set[str] = set()

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], task_json: Sequence[str],
                 **kwargs: Any) -> list[float]:
        """Scores for the batch; failed rows get ``failure_reward`` and an error in completions.jsonl."""
        n = len(completions)
        try:
            scores, stages, errors = self._score(prompts, completions, task_json)
        except Exception as err:  # noqa: BLE001 - any failure is scored, logged and survived
            log.warning("reward %s failed on a batch of %d (%s: %s); scoring row by row",
                        self.__name__, n, type(err).__name__, err)
            scores, stages, errors = [], [], []
            for i in range(n):
                try:
                    row = self._score([prompts[i]], [completions[i]], [task_json[i]])
                except Exception as row_err:  # noqa: BLE001
                    row = ([math.nan], ["scoring_error"], [f"{type(row_err).__name__}: {row_err}"])
                scores += row[0]
                stages += row[1]
                errors += row[2]
        for i, score in enumerate(scores):
            if errors[i] is None and not (isinstance(score, (int, float)) and math.isfinite(score)):
                errors[i], stages[i] = f"non-finite reward {score!r}", "scoring_error"
            if errors[i] is not None:
                log.warning("reward %s: task %s (batch row %d) scored %s: %s",
                            self.__name__, task_id(task_json[i]), i, self.failure_reward, errors[i])
            if stages[i] == "scoring_error":
                scores[i] = self.failure_reward
        self._log(task_json, stages, errors, kwargs)
        return [float(s) for s in scores]

    def _log(self, task_json: Sequence[str], stages: list[str], errors: list[str | None], kwargs: dict) -> None:
        """Per-row columns for completions.jsonl and per-stage fractions for metrics.jsonl."""
        log_extra, log_metric = kwargs.get("log_extra"), kwargs.get("log_metric")
        if log_extra is not None:
            log_extra("task_id", [task_id(t) for t in task_json])
            log_extra("reward_stage", stages)
            log_extra("reward_error", errors)
        self.seen_stages.update(stages)
        if log_metric is not None:  # every stage seen so far, 0 when absent, so the curves have no gaps
            for stage in sorted(self.seen_stages):
                log_metric(f"reward_stage/{stage}", stages.count(stage) / len(stages))

    def _score(self, prompts: Sequence[str], completions: Sequence[str],
               task_json: Sequence[str]) -> tuple[list[float], list[str], list[str | None]]:
        """(scores, stage per row, error per row) from the wrapped function."""
        scores = list(self.func(prompts=list(prompts), completions=list(completions), task_json=list(task_json)))
        if len(scores) != len(completions):
            raise ValueError(f"returned {len(scores)} scores for {len(completions)} completions")
        n = len(scores)
        stages = list(getattr(self.func, "last_stages", None) or ["scored"] * n)
        errors = list(getattr(self.func, "last_errors", None) or [None] * n)
        return scores, stages, errors


def build_reward(cfg: Any, tasks: Sequence[Any]) -> tuple[GuardedReward, Any]:
    """The guarded reward for the kinds of ``tasks``, and the sandbox pool it uses (None for math only)."""
    from molrl.sandbox import SandboxConfig, SandboxPool

    kinds = {"toy" if t.meta.get("toy") else t.kind for t in tasks}
    pool = None
    if kinds & {"code", "toy"}:
        pool = SandboxPool(SandboxConfig(workers=cfg.reward.sandbox_workers, timeout_s=cfg.reward.timeout_s))
    by_kind: dict[str, Callable[..., list[float]]] = {}
    if "toy" in kinds:
        from molrl.grpo.toy import LowercaseReward

        by_kind["toy"] = LowercaseReward(pool)
    if "code" in kinds:
        from molrl.graders.code import CodeRewardConfig
        from molrl.rewards import CodeReward

        by_kind["code"] = CodeReward(pool, CodeRewardConfig(mode=cfg.reward.code_mode))
    if "math" in kinds:
        from molrl.rewards import MathReward

        by_kind["math"] = MathReward()
    return GuardedReward(TaskReward(by_kind), cfg.reward.failure_reward), pool
