"""Benchmark splits, in one place: which split each task belongs to, which a run takes, and where training
and evaluation overlap.

- ``benchmark_split``: a task's split, decided by its benchmark. MBPP (Google's full file, 974 tasks) has
  the standard split of its paper: prompt 1-10 (few-shot examples), test 11-510, validation 511-600, train
  601-974. HumanEval, MATH-500 and AIME are test sets only. A user's JSONL file has no split (None).
- ``select_split``: the tasks of the split a run asks for; a training run (RL, collect) takes ``train`` by
  default, so a benchmark file given whole never trains on its test tasks unless asked.
- ``test_overlap``: the tasks of a run that lie in a test split, for the line a training run prints at start.
- ``TRAINED_ON`` (``trained_on.json``, written beside a run's adapter) records which benchmark tasks a run
  trained on; ``trained_overlap`` is the one check eval makes against it before scoring an adapter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

from molrl.errors import MolrlError
from molrl.task_types import Task

SPLITS = ("train", "validation", "test", "prompt")
"""The splits a benchmark task can be in."""
TRAINING_DEFAULT = "train"
"""The split a training run takes when none is named."""
TRAINED_ON = "trained_on.json"
"""The file, in a run's output folder, naming the benchmark tasks it trained on."""
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


def test_overlap(tasks: Iterable[Task]) -> dict[str, int]:
    """Per benchmark: how many of ``tasks`` lie in its test split (the split ``molrl eval`` scores)."""
    counts: dict[str, int] = {}
    for task in tasks:
        if task.split == "test":
            name = benchmark_of(task) or "?"
            counts[name] = counts.get(name, 0) + 1
    return counts


def overlap_line(tasks: Sequence[Task], key: str) -> str | None:
    """The one line a training run prints when its tasks overlap a benchmark's test split, else None."""
    counts = test_overlap(tasks)
    if not counts:
        return None
    parts = ", ".join(f"{n} of {name}'s test tasks" for name, n in sorted(counts.items()))
    return (f"{key}: {sum(counts.values())} of the {len(tasks)} tasks are in an eval test split ({parts}); "
            f"molrl eval will refuse to score them with an adapter trained on them")


def task_entries(tasks: Iterable[Task]) -> list[tuple[str | None, str | None, str]]:
    """(benchmark, split, id) of each task: what ``trained_on.json`` records of it."""
    return [(benchmark_of(t), t.split, t.id) for t in tasks]


def trained_record(entries: Iterable[tuple[str | None, str | None, str]]) -> dict[str, Any]:
    """What ``trained_on.json`` holds: per benchmark, per split, the sorted ids of the (benchmark, split, id) entries
    trained on (entries without a benchmark or split are a user's own tasks: nothing to record)."""
    record: dict[str, dict[str, set[str]]] = {}
    for name, split, task_id in entries:
        if name is not None and split is not None:
            record.setdefault(name, {}).setdefault(split, set()).add(str(task_id))
    return {"benchmarks": {name: {split: sorted(ids) for split, ids in sorted(splits.items())}
                           for name, splits in sorted(record.items())}}


def write_trained_on(folder: Path, entries: Iterable[tuple[str | None, str | None, str]],
                     earlier: Path | None = None) -> Path:
    """Write ``folder/trained_on.json`` for ``entries`` (``task_entries``), merged with the record found for
    ``earlier`` (the adapter a run continued from), so a chain of runs keeps every task any of them trained on."""
    entries = list(entries)
    if earlier is not None:
        entries += [(name, split, i) for name, splits in (read_trained_on(earlier) or {}).items()
                    for split, ids in splits.items() for i in ids]
    record = trained_record(entries)
    from molrl.writes import write_text

    path = folder / TRAINED_ON
    write_text(path, json.dumps(record, indent=2, sort_keys=True) + "\n")  # whole, or not there at all
    return path


def read_trained_on(adapter: str | Path) -> dict[str, dict[str, list[str]]] | None:
    """The benchmarks (name -> split -> ids) the runs behind ``adapter`` trained on: ``trained_on.json`` in the
    adapter's folder or its parent (the run's folder); None when neither has one."""
    adapter = Path(adapter)
    for folder in (adapter, adapter.parent):
        path = folder / TRAINED_ON
        if path.is_file():
            try:
                return dict(json.loads(path.read_text(encoding="utf-8"))["benchmarks"])
            except (ValueError, KeyError, TypeError):
                raise MolrlError(f"{path}: not a trained_on record; delete it or re-run the training run "
                                 "that wrote it") from None
    return None


def trained_overlap(adapter: str | Path, tasks: Iterable[Task]) -> dict[str, int]:
    """Per benchmark split (``mbpp/test``): how many of ``tasks`` the runs behind ``adapter`` trained on."""
    trained = read_trained_on(adapter) or {}
    seen = {(name, split, i) for name, splits in trained.items() for split, ids in splits.items() for i in ids}
    counts: dict[str, int] = {}
    for task in tasks:
        name = benchmark_of(task)
        if (name, task.split, task.id) in seen:
            label = f"{name}/{task.split}"
            counts[label] = counts.get(label, 0) + 1
    return counts


def refuse_trained_overlap(adapter: str | Path, tasks: Iterable[Task], key: str) -> None:
    """Raise one line when the runs behind ``adapter`` trained on any of ``tasks``; ``key`` is the switch that
    allows it."""
    counts = trained_overlap(adapter, tasks)
    if counts:
        parts = ", ".join(f"{n} of {label}" for label, n in sorted(counts.items()))
        raise MolrlError(f"{adapter}: the runs behind this adapter trained on {sum(counts.values())} of the problems "
                         f"to score ({parts}; see its {TRAINED_ON}); score another split, or set {key}=true to "
                         "score them anyway")
