"""Grading completions into sample records through the shared graders (the ones RL rewards use).

Math goes through ``molrl.graders.math.grade_math`` (math-verify); code through
``molrl.graders.code.grade_code``, which runs every program in the sandbox pool and decides the
verdict outside it. Nothing here judges an answer itself.
"""

from __future__ import annotations

from typing import Any, Sequence

from molrl.eval.metrics import majority_vote, problem_metrics
from molrl.eval.samples import SampleRecord
from molrl.tasks import Task


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
    from molrl.graders.code import grade_code
    from molrl.graders.math import grade_math

    if len(tasks) != len(completions):
        raise ValueError(f"grade_samples: {len(tasks)} tasks but {len(completions)} completion lists")
    flat = [(i, j, t, c) for i, (t, cs) in enumerate(zip(tasks, completions)) for j, c in enumerate(cs)]
    grades: dict[tuple[int, int], Any] = {}
    code = [item for item in flat if item[2].kind == "code"]
    if code:
        if pool is None:
            raise ValueError("grade_samples: code tasks need a sandbox pool")
        code_grades = grade_code([c for *_, c in code], [t for _, _, t, _ in code], pool, code_reward)
        grades.update({(i, j): g for (i, j, _, _), g in zip(code, code_grades)})
    for i, j, task, completion in flat:
        if task.kind == "math":
            grades[(i, j)] = grade_math(completion, task.answer)
    return [
        [_record(t, j, c, grades[(i, j)]) for j, c in enumerate(cs)]
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


def _record(task: Task, sample: int, completion: str, grade: Any) -> SampleRecord:
    return SampleRecord(
        id=task.id,
        sample=sample,
        completion=completion,
        extracted=grade.extracted,
        correct=bool(grade.correct),
        score=float(grade.score),
        stage=str(grade.stage),
        details=dict(grade.details or {}),
    )
