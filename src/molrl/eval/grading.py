"""Grading completions into sample records through the shared graders (the ones RL rewards use).

Every completion goes through ``molrl.tasks.grade.grade``, the dispatch RL rewards and trace
collection use: math-verify for math, the sandbox pool for code with the verdict decided
outside it. Nothing here judges an answer itself. A single-turn code sample is graded on all its task's tests (the
benchmark's measure); whether its shown and its held-back tests passed is kept apart (``molrl.tasks.held_out``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from molrl.eval.metrics import majority_vote, problem_metrics
from molrl.eval.samples import SampleRecord
from molrl.tasks import Task
from molrl.tasks.held_out import split_outcome


def grade_samples(
    tasks: Sequence[Task],
    completions: Sequence[Sequence[str]],
    pool: Any = None,
    code_reward: Any = None,
) -> list[list[SampleRecord]]:
    """Grade ``completions[i]`` (the samples of ``tasks[i]``) into records, per task.

    ``pool`` is a ``molrl.sandbox.SandboxPool`` (needed for code tasks); ``code_reward`` a
    ``molrl.graders.code.CodeRewardConfig`` setting the partial-credit ``score`` (the verdict
    ``correct`` is all tests passing either way).
    """
    from molrl.tasks.grade import grade

    if len(tasks) != len(completions):
        raise ValueError(f"grade_samples: {len(tasks)} tasks but {len(completions)} completion lists")
    flat = [(i, j, t, c) for i, (t, cs) in enumerate(zip(tasks, completions)) for j, c in enumerate(cs)]
    graded = grade([t for *_, t, _ in flat], [c for *_, c in flat], pool, code_reward)
    grades = {(i, j): g for (i, j, _, _), g in zip(flat, graded)}
    keys = [t.content_key() for t in tasks]  # once a task, not once a sample
    return [
        [_record(t, j, c, grades[(i, j)], keys[i]) for j, c in enumerate(cs)]
        for i, (t, cs) in enumerate(zip(tasks, completions))
    ]


def task_metrics(task: Task, records: Sequence[SampleRecord], ks: Sequence[int]) -> dict[str, float]:
    """Per-problem metrics of one task's samples, with a majority-vote verdict for math."""
    out = problem_metrics([r.correct for r in records], [r.score for r in records], ks)
    if task.kind == "math":
        _, ok = majority_vote([r.extracted for r in records], [r.correct for r in records], same_answer)
        out["majority"] = float(ok)
    return out


def same_answer(a: str, b: str) -> bool:
    """Whether two extracted math answers are one answer: equal text, or equivalent to the grader."""
    from molrl.graders.math import grade_math

    if a.strip() == b.strip():
        return True
    return bool(grade_math(f"\\boxed{{{b}}}", a).correct)


def graded_now(task: Task, records: Sequence[SampleRecord]) -> bool:
    """Whether ``records`` were judged, by the current grading of their task's kind (else they are graded again: a
    sample whose judgement failed, a sandbox or grader error, is judged again on the next run, never kept as one)."""
    from molrl.tasks.grade import FAILED, GRADING

    return all(r.grading == GRADING[task.kind] and r.stage not in FAILED for r in records)


def regrade(tasks: Sequence[Task], records: Sequence[Sequence[SampleRecord]], pool: Any = None,
            code_reward: Any = None) -> list[list[SampleRecord]]:
    """``records`` (the samples of ``tasks[i]``) judged again by the current grading, from the completions they hold:
    nothing is generated again, and whether a completion was cut at the token limit, and what made it, are kept."""
    graded = grade_samples(tasks, [[r.completion for r in rs] for rs in records], pool, code_reward)
    return [[dataclasses.replace(new, truncated=old.truncated, made_by=old.made_by) for new, old in zip(news, olds)]
            for news, olds in zip(graded, records)]


def _record(task: Task, sample: int, completion: str, grade: Any, task_key: str) -> SampleRecord:
    from molrl.tasks.grade import GRADING

    shown, held_back = split_outcome(task, grade)
    return SampleRecord(
        id=task.id,
        sample=sample,
        completion=completion,
        extracted=grade.extracted,
        correct=bool(grade.correct),
        score=float(grade.score),
        stage=str(grade.stage),
        details=dict(grade.details or {}),
        truncated=bool(getattr(completion, "truncated", False)),  # a molrl.engines.generation.Completion knows
        shown_pass=shown,
        held_back_pass=held_back,
        grading=GRADING[task.kind],
        task_key=task_key,
    )
