"""Which tests an episode's feedback may show, and which decide its reward.

An episode that grades a code solution before its last answer (``max_solutions`` above 1, or
``tests_on_execute``) writes the failing tests' expected values into its feedback
(``f(3) returned None, expected 9``). A reward graded on those same tests is earned by a lookup table of
the shown values: on MBPP, a second solution built from the first one's feedback scored 1.0 on 20 of 20
tasks without solving any. So such an episode runs on the task's *shown* tests and its reward grades the
*held-back* rest, tests its feedback never described:

- shown: the first ``n // 2`` tests in the source's order; held back: the last ``n - n // 2``.
  MBPP (3 tests each): 1 shown, 2 held back. HumanEval (its ``check`` asserts, 1 to 10+ per task): e.g.
  2 shown and 3 held back of 5.
- a task with fewer than 2 tests cannot be split; where tests would be shown it is left out of training,
  with its reason (23 of HumanEval's 164 have one test).

Math answers are not split: a wrong answer's feedback says it is wrong, never what is right.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from molrl.tasks.types import Task


def shows_tests(turns: int, episode: Any) -> bool:
    """Whether episodes of ``turns`` turns under ``episode`` (an ``EpisodeConfig``) can show test outcomes
    before their last answer."""
    return turns > 1 and (episode.max_solutions > 1 or episode.tests_on_execute)


def split_reason(task: Task) -> str | None:
    """Why ``task``'s tests cannot be split into shown and held back, or None when they can."""
    if task.kind == "code" and len(task.tests) < 2:
        return (f"code task has {len(task.tests)} test; an episode that shows test outcomes (max_solutions > 1 or "
                "tests_on_execute) needs 2 or more, one held back for the reward; set "
                "rollout.episode.max_solutions=1 and tests_on_execute=false to train on it")
    return None


def split_tests(task: Task) -> tuple[Task, Task]:
    """(shown, held back): ``task`` with its first ``n // 2`` tests, for the episode's feedback, and with the rest,
    for the reward; a math task is both. Raises ValueError for a code task with fewer than 2 tests."""
    reason = split_reason(task)
    if reason:
        raise ValueError(f"task {task.id}: {reason}")
    if task.kind != "code":
        return task, task
    half = len(task.tests) // 2
    return dataclasses.replace(task, tests=task.tests[:half]), dataclasses.replace(task, tests=task.tests[half:])
