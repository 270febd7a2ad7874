"""Scoring a rollout: grades through ``molrl.tasks.grade`` (the dispatch evaluation uses), rewards, and
what is logged of them (reward metrics, one ``completions.jsonl`` line per completion)."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from molrl.config import to_dict
from molrl.graders.code import CodeRewardConfig
from molrl.rl.batch import RolloutBatch
from molrl.records.run_inputs import model_fingerprints
from molrl.tasks.grade import FAILED, grade
from molrl.task_types import Task
from molrl.records.writes import append_text

log = logging.getLogger(__name__)


@dataclass
class Scores:
    """What grading said about each row of a batch."""

    rewards: list[float]
    """B rewards (``failure_reward`` where grading failed)."""
    stages: list[str]
    """B stages, ``<kind>/<stage>`` (``code/all_pass``, ``math/wrong``, ``toy/scored``, ``scoring_error``)."""
    errors: list[str | None]
    """B errors of rows whose grading failed, else None."""
    grades: list[Any]
    """B ``Grade`` records (None where grading raised): what a feedback teacher is told."""


def score(tasks: Sequence[Task], completions: Sequence[str], pool: Any = None,
          code: CodeRewardConfig | None = None, failure_reward: float = 0.0) -> Scores:
    """Grade each completion against its task; a failed grading never stops training.

    A batch whose grading raises is graded again row by row; a row that still raises, or whose
    grade failed (sandbox or grader error) or is not finite, scores ``failure_reward`` and keeps
    its error (logged with its task id).
    """
    try:
        grades: list[Any] = grade(tasks, completions, pool, code)
    except Exception as err:  # noqa: BLE001 - any failure is scored, logged and survived
        log.warning("grading a batch of %d failed (%s: %s); grading row by row", len(tasks), type(err).__name__, err)
        grades = []
        for task, completion in zip(tasks, completions):
            try:
                grades += grade([task], [completion], pool, code)
            except Exception as row_err:  # noqa: BLE001
                grades.append(f"{type(row_err).__name__}: {row_err}")
    rewards, stages, errors = [], [], []
    for task, g in zip(tasks, grades):
        error = g if isinstance(g, str) else None
        if error is None and g.stage in FAILED:
            error = str(g.details.get("error", g.stage))
        elif error is None and not (isinstance(g.score, (int, float)) and math.isfinite(g.score)):
            error = f"non-finite reward {g.score!r}"
        if isinstance(g, str) or (error is not None and g.stage not in FAILED):
            stages.append("scoring_error")
        else:
            stages.append(f"{task.kind}/{g.stage}")
        if error is not None:
            log.warning("task %s scored %s: %s", task.id, failure_reward, error)
        rewards.append(failure_reward if error is not None else float(g.score))
        errors.append(error)
    return Scores(rewards, stages, errors, [None if isinstance(g, str) else g for g in grades])


def zero_std_fraction(rewards: torch.Tensor, group_size: int) -> float:
    """Fraction of rows whose group's rewards are all equal (they carry no learning signal)."""
    grouped = rewards.view(-1, group_size)  # [N / G, G]
    std = grouped.std(dim=1) if group_size > 1 else torch.zeros(grouped.size(0))
    return torch.isclose(std, torch.zeros_like(std)).float().mean().item()


class Scorer:
    """The reward of the stage: ``score`` with its settings; also callable as a TRL reward function."""

    __name__ = "correctness"

    def __init__(self, pool: Any, code: CodeRewardConfig, failure_reward: float):
        self.pool, self.code, self.failure_reward = pool, code, failure_reward

    def score(self, tasks: Sequence[Task], completions: Sequence[str]) -> Scores:
        """``score`` of the batch with this stage's pool and settings."""
        return score(tasks, completions, self.pool, self.code, self.failure_reward)

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], task_json: Sequence[str],
                 **kwargs: Any) -> list[float]:
        """TRL's reward-function form: one reward per completion of a ``task_json`` dataset."""
        return self.score([Task.from_json(t) for t in task_json], list(completions)).rewards


def log_scores(metrics: dict[str, list[float]], seen_stages: set[str], name: str, batch: RolloutBatch, scores: Scores,
               rewards: torch.Tensor, per_completion: torch.Tensor, group: int, gather: Callable[[list], list],
               completions_path: Path | None, step: int, made_by: dict[str, Any] | None = None) -> None:
    """Reward metrics (every process) and, where ``completions_path`` is given (the main process in training),
    one line per completion of all processes, each with ``made_by`` (``completions_made_by``); ``per_completion``
    [N] is each completion's advantage."""
    mean, std = rewards.mean().item(), rewards.std().item() if rewards.numel() > 1 else 0.0
    metrics["reward"].append(mean)
    metrics["reward_std"].append(std)
    metrics[f"rewards/{name}/mean"].append(mean)
    metrics[f"rewards/{name}/std"].append(std)
    metrics["frac_reward_zero_std"].append(zero_std_fraction(rewards, group))
    stages = gather(scores.stages)
    seen_stages.update(stages)
    for stage in sorted(seen_stages):  # every stage seen so far, 0 when absent, so curves have no gaps
        metrics[f"reward_stage/{stage}"].append(stages.count(stage) / len(stages))
    prompts, completions = gather(batch.prompts), gather(batch.completions)
    task_ids, errors = gather([t.id for t in batch.tasks]), gather(scores.errors)
    ids = gather(batch.ids) if batch.ids is not None else None
    lengths = gather(batch.lengths) if batch.lengths is not None else None
    off = gather(batch.off_policy.sum(-1).tolist()) if batch.off_policy is not None else None
    extra = gather(batch.records) if batch.records is not None else None  # multi-turn episodes, token log-probs
    if completions_path is None:
        return
    lines = []
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        record = {"step": step, "prompt": prompt, "completion": completion,
                  "rewards": {name: rewards[i].item()}, "advantage": per_completion[i].item(),
                  "task_id": task_ids[i], "reward_stage": stages[i], "reward_error": errors[i], "made_by": made_by}
        if lengths is not None:
            record["tokens"] = lengths[i]
        if ids is not None:
            record.update(id=ids[i], off_policy_tokens=off[i])
        if extra is not None:
            record.update(extra[i])
        lines.append(json.dumps(record, default=str) + "\n")
    append_text(completions_path, "".join(lines))


def completions_made_by(cfg: Any, engine: str) -> dict[str, Any]:
    """What each ``completions.jsonl`` row records of its making: the ``engine`` that sampled it, the fingerprints of
    the model and adapter training started from (the row's ``step`` says how far it went) and the sampling."""
    return {"engine": engine, "model": model_fingerprints("rl", cfg), "sampling": to_dict(cfg.sampling)}
