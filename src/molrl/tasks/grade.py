"""``grade``: the one dispatch from (task, completion) pairs to ``Grade`` records, by task kind.

Evaluation, trace collection and RL rewards all grade through here, so a completion gets the
same verdict wherever it is scored. Code and the toy task run in the sandbox pool (the whole
batch at once) and are judged outside it (``molrl.graders.code``, ``molrl.tasks.toy``); math is
judged by math-verify in a worker process, within a time budget per batch (``molrl.graders.math``). A row the grader cannot judge is
its own ``sandbox_error`` / ``grader_error`` grade; the other rows keep theirs.

>>> from molrl.tasks import Task
>>> grade([Task(id="t", prompt="6*7?", kind="math", answer="42")], ["\\\\boxed{42}"])[0].score
1.0
"""

from __future__ import annotations

from typing import Any, Sequence

from molrl.graders.grade import Grade
from molrl.task_types import Task

GRADING = {"code": 4, "math": 1, "toy": 1}
"""The version of each kind's grading: raised when the same completion can get another verdict (code 2: the block
that defines the function under test is graded, not a later block that only uses it; code 3: blocks are read by a
CommonMark parser, fences of other languages are never code, and the definition is found at the top level by
``ast``: ``molrl.graders.extract``; code 4: a task any of whose jobs the sandbox could not run is a sandbox_error, no
verdict, where before the tests that did run made it partial). A stored evaluation graded by an older version is graded again from its
completions (``molrl.eval.run``); nothing is generated again."""
FAILED = ("sandbox_error", "grader_error")
"""Stages of a grade whose judgement failed (not the completion's fault)."""


def grade(tasks: Sequence[Task], completions: Sequence[str], pool: Any = None, code: Any = None) -> list[Grade]:
    """One ``Grade`` per ``(tasks[i], completions[i])``.

    ``pool`` is a ``molrl.sandbox.SandboxPool`` (needed for code and toy tasks); ``code`` a
    ``molrl.graders.code.CodeRewardConfig`` (staged or binary score; the default is staged).
    """
    if len(tasks) != len(completions):
        raise ValueError(f"grade: {len(tasks)} tasks but {len(completions)} completions")
    grades: list[Grade | None] = [None] * len(tasks)
    for kind in sorted({t.kind for t in tasks}):
        rows = [i for i, t in enumerate(tasks) if t.kind == kind]
        texts = [completions[i] for i in rows]
        if kind in ("code", "toy") and pool is None:
            raise ValueError(f"grade: {kind} tasks need a sandbox pool")
        if kind == "code":
            from molrl.graders.code import grade_code

            part = grade_code(texts, [tasks[i] for i in rows], pool, code)
        elif kind == "toy":
            from molrl.tasks.toy import grade_toy

            part = grade_toy(texts, pool)
        elif kind == "math":
            from molrl.graders.math import grade_math_batch

            part = grade_math_batch(texts, [tasks[i].answer or "" for i in rows])
        else:
            raise ValueError(f"grade: task {tasks[rows[0]].id} has kind {kind!r}; expected code, math or toy")
        for i, g in zip(rows, part):
            grades[i] = g
    return grades  # type: ignore[return-value]
