"""Benchmark splits, in one place: which split each task belongs to, which a run takes, and where training
and evaluation overlap.

- ``benchmark_split``: a task's split, decided by its benchmark. MBPP (Google's full file, 974 tasks) has
  the standard split of its paper: prompt 1-10 (few-shot examples), test 11-510, validation 511-600, train
  601-974. HumanEval, MATH-500 and AIME are test sets only. A user's JSONL file has no split (None).
- ``select_split``: the tasks of the split a run asks for; a training run (RL, collect) takes ``train`` by
  default, so a benchmark file given whole never trains on its test tasks unless asked.
- where training and evaluation overlap, and the line a training run prints at start: ``molrl.tasks.trained_on``.

What a model trained on travels inside its own folder: ``molrl.records.provenance``.
"""

from __future__ import annotations

from typing import Sequence

from molrl.errors import MolrlError
from molrl.task_types import Task

SPLITS = ("train", "validation", "test", "prompt")
"""The splits a benchmark task can be in."""
TRAINING_DEFAULT = "train"
"""The split a training run takes when none is named."""
TEST_ONLY = ("humaneval", "math500", "aime")
"""Benchmarks whose every task is a test task."""


def mbpp_split(task_id: int) -> str:
    """MBPP's standard split of a task id: prompt 1-10, test 11-510, validation 511-600, train 601-974."""
    if task_id <= 10:
        return "prompt"
    if task_id <= 510:
        return "test"
    return "validation" if task_id <= 600 else "train"


def benchmark_split(benchmark: str | None, task_id: str) -> str | None:
    """The split of task ``task_id`` of ``benchmark`` (a loader's ``meta["source"]``); None when it has none."""
    if benchmark == "mbpp" and task_id.isdigit():
        return mbpp_split(int(task_id))
    if benchmark in TEST_ONLY:
        return "test"
    return None


def select_split(tasks: Sequence[Task], split: str | None, where: str, key: str,
                 default: str = TRAINING_DEFAULT) -> list[Task]:
    """The tasks of ``split`` (``all``: every task; None: ``default``); ``where`` (the file) and ``key`` (the config
    key) name the source in errors. A file without splits gives all its tasks when none is named."""
    if split == "all" or not tasks:
        return list(tasks)
    if split is not None and split not in SPLITS:
        raise MolrlError(f"{key}={split!r}: unknown split; expected one of {', '.join(SPLITS)} or all")
    if all(t.split is None for t in tasks):
        if split is None:
            return list(tasks)
        raise MolrlError(f"{where}: its tasks have no benchmark split, so {key}={split} selects nothing; "
                         f"unset {key} or set {key}=all")
    wanted = split or default
    if wanted == "all":
        return list(tasks)
    chosen = [t for t in tasks if t.split == wanted]
    if not chosen:
        found = sorted({t.split or "none" for t in tasks})
        raise MolrlError(f"{where}: no task in the {wanted} split (its splits: {', '.join(found)}); "
                         f"set {key} to one of them, or {key}=all to take every task")
    return chosen


def benchmark_of(task: Task) -> str | None:
    """The benchmark a task was read from (its loader's ``meta["source"]``), None for a user's file."""
    return task.meta.get("source")
