"""Benchmarks by name: which loader reads them and where their problems come from.

A benchmark's data is a local file in its usual format (see ``molrl.tasks.load_tasks``) or a
Hugging Face dataset named ``hub:DATASET[:SPLIT]``, fetched with ``datasets.load_dataset`` and
written to the run directory as JSONL before the same loader reads it. Each benchmark is scored on its
``split`` (default ``test``; ``molrl.tasks.splits``): ``mbpp`` means MBPP's standard test split (tasks 11-510),
taken out of Google's full file when that is the data given. A file without splits is scored whole.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from molrl.errors import MolrlError
from molrl.tasks import Task
from molrl.tasks.splits import select_split

log = logging.getLogger(__name__)

# Benchmark name -> format understood by molrl.tasks.load_tasks.
KNOWN = {"math500": "math500", "aime24": "aime", "aime25": "aime", "humaneval": "humaneval", "mbpp": "mbpp"}
FORMAT_HINT = {
    "math500": "MATH-500 test.jsonl (problem, answer, subject, level, unique_id)",
    "aime": "AIME test.jsonl (id, problem, answer)",
    "humaneval": "HumanEval.jsonl(.gz) (task_id, prompt, entry_point, canonical_solution, test)",
    "mbpp": "MBPP jsonl (task_id, text, code, test_list, test_setup_code)",
}


def load_suite(name: str, cfg: Any) -> list[Task]:
    """The problems of benchmark ``name`` (first ``cfg.limit`` of them when set)."""
    from molrl.tasks import load_tasks

    if name in cfg.custom:
        fmt, spec = "jsonl", cfg.custom[name]
    elif name in KNOWN:
        fmt, spec = KNOWN[name], None
    else:
        raise MolrlError(
            f"unknown benchmark {name!r}; known: {', '.join(KNOWN)}, or describe a JSONL file under custom.{name}"
        )
    source = cfg.data.get(name)
    if not source:
        hint = FORMAT_HINT.get(fmt, "a JSONL file matching its custom spec")
        raise MolrlError(f"no data for benchmark {name!r}; pass --data {name}=PATH ({hint}) or {name}=hub:DATASET")
    path = fetch_hub(source, Path(cfg.output_dir) / "data" / f"{name}.jsonl") if source.startswith("hub:") else Path(source)
    if not path.is_file():
        raise MolrlError(f"{path}: data file of benchmark {name!r} not found")
    tasks = load_tasks(path, fmt, spec=spec)
    if any(t.split is not None for t in tasks):  # a file without splits is scored whole
        before = len(tasks)
        tasks = select_split(tasks, cfg.split, str(path), "split")
        if len(tasks) < before:
            log.info("%s: scoring %s's %s split, %d of %d tasks", path, name, cfg.split, len(tasks), before)
    tasks = tasks[: cfg.limit] if cfg.limit is not None else tasks
    if not tasks:
        raise MolrlError(f"{path}: benchmark {name!r} has no problems")
    return tasks


def fetch_hub(source: str, dest: Path) -> Path:
    """Write the hub dataset ``hub:DATASET[:SPLIT]`` (split default ``test``) to ``dest`` as JSONL."""
    if dest.is_file():
        return dest  # fetched by an earlier, interrupted run
    name, _, split = source[len("hub:"):].partition(":")
    if not name:
        raise MolrlError(f"data source {source!r}: expected hub:DATASET or hub:DATASET:SPLIT")
    import datasets

    try:
        dataset = datasets.load_dataset(name, split=split or "test")
    except Exception as err:  # network, auth, unknown dataset or split: all reported the same way
        raise MolrlError(f"could not load {source!r} from the Hugging Face hub: {err}") from None
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    dataset.to_json(str(tmp), lines=True, force_ascii=False)
    tmp.replace(dest)
    return dest
