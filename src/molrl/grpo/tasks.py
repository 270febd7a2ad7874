"""Where GRPO's tasks come from: a benchmark or JSONL file via ``molrl.tasks.load_tasks``, or the toy."""

from __future__ import annotations

from molrl.errors import MolrlError
from molrl.grpo.config import TaskSource
from molrl.tasks import Task


def load_task_source(src: TaskSource, role: str) -> list[Task]:
    """The tasks ``src`` names (``role`` names the config section in errors: train / eval.tasks)."""
    if src.format == "toy":
        from molrl.grpo.toy import toy_tasks

        return toy_tasks(src.limit or 64)
    if src.path is None:
        raise MolrlError(f"{role}.path is not set: give a task file ({role}.path=FILE {role}.format=FORMAT)")
    from molrl.tasks import load_tasks

    return load_tasks(src.path, src.format, limit=src.limit, spec=src.spec)
