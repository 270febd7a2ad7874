"""``load_task_source``: the tasks a stage's ``data`` block (``molrl.config.blocks.TaskSource``) names, read the
same way by collect, rl (and rl's evaluation hook) and eval (each benchmark, ``molrl.eval.suites``)."""

from __future__ import annotations

import logging

from molrl.config.blocks import TaskSource
from molrl.errors import MolrlError
from molrl.task_types import Task
from molrl.tasks.loaders import load_tasks
from molrl.tasks.eval_overlap import overlap_line
from molrl.tasks.splits import select_split
from molrl.tasks.toy import toy_tasks

log = logging.getLogger(__name__)


def load_task_source(src: TaskSource, role: str, split: str | None = None) -> list[Task]:
    """The tasks ``src`` names: a benchmark or JSONL file (its ``split``, else ``split``, else the training split for
    ``data`` and the test split for any other role; a file without splits whole), or the toy (``role`` names the key
    in errors: ``data``, ``eval.data``, ``data.mbpp``)."""
    src = src.resolved(role.removeprefix("data."))
    if src.format == "toy":
        return toy_tasks(src.limit or 64)
    if src.path is None:
        raise MolrlError(f"{role}.path is not set: give a task file ({role}.path=FILE {role}.format=FORMAT)")
    every = load_tasks(src.path, src.format, spec=src.spec)
    default = split or ("train" if role == "data" else "test")
    tasks = select_split(every, src.split, str(src.path), f"{role}.split", default)
    if len(tasks) < len(every):
        log.info("%s: %s takes the %s split, %d of %d tasks", src.path, role, src.split or default, len(tasks),
                 len(every))
    tasks = tasks[:src.limit] if src.limit is not None else tasks
    if role == "data" and (line := overlap_line(tasks, role)):
        log.warning("%s", line)
    return tasks
