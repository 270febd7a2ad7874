"""The environment side of an episode: carry out model actions and record what happened.

Code to run goes to the sandbox (all episodes of a round in one ``run_many``); submitted code
solutions and math answers are graded by ``molrl.tasks.grade.grade`` (binary for code: the sandbox
runs the tests, the verdict is decided outside it), the dispatch evaluation and RL rewards use.
The result is an ``Observation`` per action.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from molrl.episode.actions import Action
from molrl.episode.feedback import Observation
from molrl.graders.code import CodeRewardConfig, program_for
from molrl.graders.extract import defines as top_level_defines_code
from molrl.tasks.grade import grade
from molrl.task_types import Task

_BINARY = CodeRewardConfig(mode="binary")


def observe(pool: Any, items: Sequence[tuple[Task, Action]], tests_on_execute: bool = False) -> list[Observation]:
    """What the environment observes for each ``(task, action)``; budget fields are left for the loop."""
    observations = [Observation(action=action.kind, problem=action.problem) for _, action in items]
    runs = [i for i, (_, action) in enumerate(items) if action.kind == "code"]
    if runs:
        results = pool.run_many([program_for(items[i][1].content, items[i][0]) for i in runs])
        for i, result in zip(runs, results):
            observations[i].exec = exec_record(result)
    graded = [i for i, (task, action) in enumerate(items) if action.kind == "solution" or (
        task.kind == "code" and tests_on_execute and action.kind == "code" and defines(action.content, task.entry_point)
    )]
    if graded:
        grades = grade([items[i][0] for i in graded], [items[i][1].raw for i in graded], pool, _BINARY)
        for i, g in zip(graded, grades):
            observations[i].grade = g.to_dict()
    for i, (_, action) in enumerate(items):
        if action.kind == "solution":
            observations[i].verdict = bool(observations[i].grade and observations[i].grade["correct"])
    return observations


def exec_record(result: Any) -> dict[str, Any]:
    """The fields of a sandbox ``ExecResult`` that feedback is derived from (JSON-ready)."""
    record = dataclasses.asdict(result)
    return {key: record[key] for key in ("status", "exit_code", "stdout", "stderr", "truncated", "duration_s", "error")}


def defines(code: str, name: str | None) -> bool:
    """Whether ``code`` defines ``name`` at its top level (the rule that picks the graded block of a completion)."""
    return bool(name) and top_level_defines_code(code, name)  # type: ignore[arg-type]
