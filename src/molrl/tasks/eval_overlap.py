"""Where a training run's data overlaps what eval scores: the one line a run prints at start, for every stage.

A run that trains on a benchmark's test tasks (the split ``molrl eval`` scores) says so before it trains, with the
counts per benchmark:

- RL and collect train on tasks (``molrl.tasks.source.load_task_source``): a task is a test task by its split
  (``Task.split``, set by its loader: ``molrl.tasks.splits``), counted by ``test_overlap``, said by ``overlap_line``;
- MoL trains on traces (``molrl.mol.data.load_examples``): a trace is on a test task when it names one
  (``molrl.tasks.index.trace_tag``: ``meta["benchmark_task"]``, written by ``traces convert --benchmarks`` and
  ``molrl collect``), else when its source's task set is a benchmark's test set (``KNOWN_TEST_SETS``); counted by
  ``trace_test_overlap``, said by ``traces_overlap_line`` with the switch that leaves them out.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from molrl.task_types import Task
from molrl.tasks.splits import benchmark_of

KNOWN_TEST_SETS = {("mint", "mbpp"): "mbpp", ("mint", "humaneval"): "humaneval"}
"""(trace ``meta["source"]``, ``meta["dataset"]``) -> the benchmark whose test split that task set is drawn from,
known without the benchmark's file: MINT's MBPP problems are MBPP test tasks (16 to 491) and its HumanEval problems
are HumanEval's. MINT's MATH problems are MATH test problems, of which MATH-500 holds a few (7 of 100): only the
MATH-500 file tells which (``data.exclude_benchmarks``)."""


def test_overlap(tasks: Iterable[Task]) -> dict[str, int]:
    """Per benchmark: how many of ``tasks`` lie in its test split (the split ``molrl eval`` scores)."""
    counts: dict[str, int] = {}
    for task in tasks:
        if task.split == "test":
            name = benchmark_of(task) or "?"
            counts[name] = counts.get(name, 0) + 1
    return counts


def trace_test_overlap(traces: Iterable[Any]) -> dict[str, int]:
    """Per benchmark: how many of the domain ``traces`` are on one of its test tasks: the benchmark task a trace names
    (``molrl.tasks.index.trace_tag``), else its source's task set (``KNOWN_TEST_SETS``)."""
    from molrl.tasks.index import trace_tag

    counts: dict[str, int] = {}
    for trace in traces:
        if trace.kind == "general":  # replay data: no task of its own
            continue
        tag = trace_tag(trace.meta)
        if tag is not None:
            name = tag["benchmark"] if tag["split"] == "test" else None
        else:
            name = KNOWN_TEST_SETS.get((trace.meta.get("source"), trace.meta.get("dataset")))
        if name is not None:
            counts[name] = counts.get(name, 0) + 1
    return counts


def overlap_line(tasks: Sequence[Task], key: str) -> str | None:
    """The one line a training run prints when its tasks overlap a benchmark's test split, else None."""
    counts = test_overlap(tasks)
    parts = ", ".join(f"{n} of {name}'s test tasks" for name, n in sorted(counts.items()))
    return _trained_on_test(key, f"{sum(counts.values())} of the {len(tasks)} tasks are in an eval test split "
                                 f"({parts})") if counts else None


def traces_overlap_line(traces: Sequence[Any], key: str) -> str | None:
    """The one line MoL prints when its domain traces are on a benchmark's test tasks (``trace_test_overlap``), with
    the switch that leaves them out; else None."""
    counts = trace_test_overlap(traces)
    parts = ", ".join(f"{n} on {name}'s" for name, n in sorted(counts.items()))
    files = ", ".join(f"{name}: FILE" for name in sorted(counts))
    return _trained_on_test(key, f"{sum(counts.values())} of the {len(traces)} traces are on tasks of an eval test "
                                 f"split ({parts} test tasks)",
                            f"; leave them out with data.exclude_benchmarks={{{files}}} (the files eval scores) or "
                            "`molrl traces filter --exclude-benchmarks`") if counts else None


def _trained_on_test(key: str, what: str, fix: str = "") -> str:
    """The line that says a run trains on ``what`` (a count of test tasks), alike for every stage."""
    return f"{key}: {what}; molrl eval will refuse to score them with an adapter trained on them{fix}"
