"""Benchmarks by name: where each one's problems come from and how they are read.

A benchmark is an entry of eval's ``data`` (``molrl.config.blocks.TaskSource``, the type collect and rl read their
tasks with): a local file in its format (see ``molrl.tasks.load_tasks``; a benchmark molrl knows by name takes its own
format) or a Hugging Face dataset named ``hub:DATASET[:SPLIT]``, fetched with ``datasets.load_dataset`` and written to
the run directory as JSONL before the same loader reads it. Each benchmark is scored on its ``split`` (default eval's
``split``, ``test``; ``molrl.tasks.splits``): ``mbpp`` means MBPP's standard test split (tasks 11-510), taken out of
Google's full file when that is the data given. A file without splits is scored whole.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from molrl.config.blocks import BENCHMARK_FORMATS
from molrl.errors import MolrlError
from molrl.tasks import Task
from molrl.tasks.source import load_task_source

log = logging.getLogger(__name__)

FORMAT_HINT = {
    "math500": "MATH-500 test.jsonl (problem, answer, subject, level, unique_id)",
    "aime": "AIME test.jsonl (id, problem, answer)",
    "humaneval": "HumanEval.jsonl(.gz) (task_id, prompt, entry_point, canonical_solution, test)",
    "mbpp": "MBPP jsonl (task_id, text, code, test_list, test_setup_code)",
}


def load_suite(name: str, cfg: Any) -> list[Task]:
    """The problems of benchmark ``name``: ``cfg.data[name]`` read as every stage reads a task source, on its split
    (else ``cfg.split``), the first ``cfg.limit`` of them when set."""
    src = _source(name, cfg)
    path = str(cfg.data[name].path)
    tasks = load_task_source(src, f"data.{name}", split=cfg.split)
    tasks = tasks[: cfg.limit] if cfg.limit is not None else tasks
    if not tasks:
        raise MolrlError(f"{path}: benchmark {name!r} has no problems")
    return tasks


def load_whole(name: str, cfg: Any) -> list[Task]:
    """Every task of benchmark ``name``'s data, all its splits and no limit: what a trained model's record is matched
    among (``molrl.records.provenance.check_scored``), as exclusion matches traces among a benchmark's whole file."""
    src = dataclasses.replace(_source(name, cfg), split="all", limit=None)
    return load_task_source(src, f"data.{name}", split="all")


def _source(name: str, cfg: Any) -> Any:
    """``cfg.data[name]``, checked, with a ``hub:`` dataset fetched to the run directory (once)."""
    src = cfg.data.get(name)
    if src is None or src.path is None:
        hint = FORMAT_HINT.get(BENCHMARK_FORMATS.get(name, ""), "a molrl task JSONL (fields under data.NAME.spec)")
        raise MolrlError(f"no data for benchmark {name!r}; pass --data {name}=PATH ({hint}) or {name}=hub:DATASET")
    path = str(src.path)
    if path.startswith("hub:"):
        return dataclasses.replace(src, path=fetch_hub(path, Path(cfg.output_dir) / "data" / f"{name}.jsonl"))
    if not Path(path).is_file():
        raise MolrlError(f"{path}: data file of benchmark {name!r} not found")
    return src


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
