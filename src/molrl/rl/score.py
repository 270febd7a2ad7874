"""Scoring a rollout: grades through ``molrl.tasks.grade`` (the dispatch evaluation uses), rewards, and
what is logged of them (reward metrics, one ``completions.jsonl`` line per completion).

A sandbox error is never a verdict: a row whose grading failed (the sandbox or the grader could not judge it) or
whose episode the sandbox stopped has no reward (``exclusion``, the one rule); the trainer leaves it out of the loss
and of its group's statistics, and its ``completions.jsonl`` line says ``excluded`` and why."""

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
from molrl.rl.groups import zero_std_fraction
from molrl.records.run_inputs import model_fingerprints
from molrl.tasks.grade import FAILED, grade
from molrl.task_types import Task
from molrl.records.writes import append_text

log = logging.getLogger(__name__)


NO_VERDICT_STOPS = ("sandbox_error",)
"""Why a multi-turn episode may end that makes its reward no verdict, whatever its final answer's grade: the sandbox
stopped it, so the answer it left is not the one it would have given."""


@dataclass
class Scores:
    """What grading said about each row of a batch."""

    rewards: list[float]
    """B rewards (0 where ``excluded``: such a row's reward is never read)."""
    stages: list[str]
    """B stages, ``<kind>/<stage>`` (``code/all_pass``, ``math/wrong``, ``toy/scored``, ``scoring_error``)."""
    errors: list[str | None]
    """B errors of rows whose grading failed, else None."""
    grades: list[Any]
    """B ``Grade`` records (None where grading raised): what a feedback teacher is told."""
    excluded: list[str | None] | None = None
    """B: why a row's reward is no verdict on its completion (``sandbox_error``, ``grader_error``, ``scoring_error``),
    else None; such a row is left out of the loss and of its group's statistics. None: every row is a verdict."""

    def verdicts(self) -> list[bool]:
        """B: whether each row's reward is a verdict (the rows the step trains on)."""
        return [True] * len(self.rewards) if self.excluded is None else [why is None for why in self.excluded]


def exclusion(grade_stage: str | None, error: str | None, stop_reason: str | None) -> str | None:
    """Why a row's reward is no verdict, or None when it is one: the rule RL trains by, in one place.

    A grading that failed is no judgement of the completion (not its fault): a grade of a ``FAILED`` stage (the
    sandbox or the grader failed) is excluded under its stage, any other failure (grading raised, a score that is not
    finite, ``error``) as ``scoring_error``; a multi-turn episode the sandbox stopped (``stop_reason`` in
    ``NO_VERDICT_STOPS``) is excluded as ``sandbox_error`` whatever its final answer's grade.
    """
    if grade_stage in FAILED:
        return grade_stage
    if error is not None:
        return "scoring_error"
    return "sandbox_error" if stop_reason in NO_VERDICT_STOPS else None


def score(tasks: Sequence[Task], completions: Sequence[str], pool: Any = None,
          code: CodeRewardConfig | None = None, stop_reasons: Sequence[str | None] | None = None) -> Scores:
    """Grade each completion against its task; a failed grading never stops training.

    A batch whose grading raises is graded again row by row; a row that still raises, or whose grade failed (sandbox
    or grader error) or is not finite, keeps its error (logged with its task id). ``exclusion`` says which rows are
    no verdict (``stop_reasons``: multi-turn episodes' ``Episode.stop_reason``, None for single-turn rows).
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
    stops = list(stop_reasons) if stop_reasons is not None else [None] * len(tasks)
    rewards, stages, errors, excluded = [], [], [], []
    for task, g, stop in zip(tasks, grades, stops):
        error = g if isinstance(g, str) else None
        if error is None and g.stage in FAILED:
            error = str(g.details.get("error", g.stage))
        elif error is None and not (isinstance(g.score, (int, float)) and math.isfinite(g.score)):
            error = f"non-finite reward {g.score!r}"
        stage = None if isinstance(g, str) else g.stage
        stages.append("scoring_error" if isinstance(g, str) or (error is not None and stage not in FAILED)
                      else f"{task.kind}/{g.stage}")
        why = exclusion(stage, error, stop)
        if why is not None:
            log.warning("task %s is no verdict, left out of the loss (%s): %s", task.id, why,
                        error or f"its episode stopped at a {stop}")
        rewards.append(0.0 if why is not None else float(g.score))
        errors.append(error)
        excluded.append(why)
    return Scores(rewards, stages, errors, [None if isinstance(g, str) else g for g in grades], excluded)


class Scorer:
    """The reward of the stage: ``score`` with its settings; also callable as a TRL reward function."""

    __name__ = "correctness"

    def __init__(self, pool: Any, code: CodeRewardConfig | None):
        self.pool, self.code = pool, code

    def score(self, tasks: Sequence[Task], completions: Sequence[str],
              stop_reasons: Sequence[str | None] | None = None) -> Scores:
        """``score`` of the batch with this stage's pool and settings."""
        return score(tasks, completions, self.pool, self.code, stop_reasons)

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], task_json: Sequence[str],
                 **kwargs: Any) -> list[float]:
        """TRL's reward-function form: one reward per completion of a ``task_json`` dataset."""
        return self.score([Task.from_json(t) for t in task_json], list(completions)).rewards


def reward_metrics(metrics: dict[str, list[float]], name: str, rewards: torch.Tensor, verdicts: torch.Tensor,
                   group: int) -> None:
    """The step's reward mean and std over its verdict rows (none logged when it has none) and the share of groups that
    carry no signal; ``rewards`` and ``verdicts`` [N] over all processes."""
    judged = rewards[verdicts]  # [N'] the verdict rows' rewards
    if judged.numel():
        mean, std = judged.mean().item(), judged.std().item() if judged.numel() > 1 else 0.0
        metrics["reward"].append(mean)
        metrics["reward_std"].append(std)
        metrics[f"rewards/{name}/mean"].append(mean)
        metrics[f"rewards/{name}/std"].append(std)
    metrics["frac_reward_zero_std"].append(zero_std_fraction(rewards, verdicts, group))


def log_scores(metrics: dict[str, list[float]], seen_stages: set[str], name: str, batch: RolloutBatch, scores: Scores,
               rewards: torch.Tensor, verdicts: torch.Tensor, per_completion: torch.Tensor, group: int,
               gather: Callable[[list], list], completions_path: Path | None, step: int,
               made_by: dict[str, Any] | None = None) -> list[str | None]:
    """Reward metrics (every process) and, where ``completions_path`` is given (the main process in training),
    one line per completion of all processes, each with ``made_by`` (``completions_made_by``); ``rewards``,
    ``verdicts`` and ``per_completion`` (each completion's advantage) are [N]. A row that is no verdict keeps its line,
    without a reward and marked ``excluded``. Returns every process's rows' ``Scores.excluded``."""
    reward_metrics(metrics, name, rewards, verdicts, group)
    stages, excluded = gather(scores.stages), gather(scores.excluded or [None] * len(scores.stages))
    seen_stages.update(stages)
    for stage in sorted(seen_stages):  # every stage seen so far, 0 when absent, so curves have no gaps
        metrics[f"reward_stage/{stage}"].append(stages.count(stage) / len(stages))
    metrics["reward/sandbox_error_rate"].append(excluded.count("sandbox_error") / len(excluded))
    prompts, completions = gather(batch.prompts), gather(batch.completions)
    task_ids, errors = gather([t.id for t in batch.tasks]), gather(scores.errors)
    ids = gather(batch.ids) if batch.ids is not None else None
    lengths = gather(batch.lengths) if batch.lengths is not None else None
    off = gather(batch.off_policy.sum(-1).tolist()) if batch.off_policy is not None else None
    extra = gather(batch.records) if batch.records is not None else None  # multi-turn episodes, token log-probs
    if completions_path is None:
        return excluded
    lines = []
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        reward = None if excluded[i] else rewards[i].item()
        record = {"step": step, "prompt": prompt, "completion": completion,
                  "rewards": {name: reward}, "advantage": per_completion[i].item(), "excluded": excluded[i],
                  "task_id": task_ids[i], "reward_stage": stages[i], "reward_error": errors[i], "made_by": made_by}
        if lengths is not None:
            record["tokens"] = lengths[i]
        if ids is not None:
            record.update(id=ids[i], off_policy_tokens=off[i])
        if extra is not None:
            record.update(extra[i])
        lines.append(json.dumps(record, default=str) + "\n")
    append_text(completions_path, "".join(lines))
    return excluded


def completions_made_by(cfg: Any, engine: str) -> dict[str, Any]:
    """What each ``completions.jsonl`` row records of its making: the ``engine`` that sampled it, the fingerprints of
    the model and adapter training started from (the row's ``step`` says how far it went) and the sampling."""
    return {"engine": engine, "model": model_fingerprints("rl", cfg), "sampling": to_dict(cfg.sampling)}
