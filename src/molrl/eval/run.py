"""``run_eval``: every benchmark of an ``EvalConfig``, chunk by chunk, resumable, into a run directory.

For each benchmark: load problems -> skip those already in ``samples.jsonl`` -> per chunk of
``batch_size`` problems get graded samples from the source (sampled single-turn, interactive
episodes, or a predictions file; all graded by the shared graders) -> append them -> summarise.
Results land in ``results.json`` / ``results.md`` next to the resolved ``config.yaml``.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, Iterator, Sequence

import yaml

from molrl.config import save_config, to_dict
from molrl.errors import MolrlError
from molrl.eval.config import SAMPLE_KEYS, EvalConfig
from molrl.eval.report import results_markdown, write_results
from molrl.eval.samples import SampleRecord, SampleStore
from molrl.eval.single import summarise
from molrl.eval.interactive import InteractiveSource
from molrl.eval.sources import PredictionSource, SamplingSource
from molrl.eval.suites import load_suite
from molrl.tasks import Task

log = logging.getLogger(__name__)


def make_source(cfg: EvalConfig) -> Any:
    """The completion source a config asks for: predictions, single-turn sampling, or interactive."""
    if cfg.predictions:
        missing = [b for b in cfg.benchmarks if b not in cfg.predictions]
        if missing:
            raise MolrlError(f"predictions given for {', '.join(cfg.predictions)} but not for {', '.join(missing)}; "
                             "pass one --predictions NAME=PATH per benchmark")
        if cfg.model:
            log.warning("grading predictions: model %s is not loaded", cfg.model)
        return PredictionSource(cfg)
    if not cfg.model:
        raise MolrlError("no model to evaluate: pass --model M, or --predictions FILE to grade completions made elsewhere")
    if cfg.mode == "interactive":
        return InteractiveSource(cfg)
    return SamplingSource(cfg)


def run_eval(cfg: EvalConfig) -> Path:
    """Evaluate ``cfg.benchmarks`` and return the run directory holding the results."""
    out = Path(cfg.output_dir)
    check_resumable(out, cfg)
    save_config(cfg, out / "config.yaml")
    suites = {name: load_suite(name, cfg) for name in cfg.benchmarks}  # all data checked before any work
    source = make_source(cfg)
    suites = {name: source.select(name, tasks) for name, tasks in suites.items()}
    results: dict[str, Any] = {
        "label": source.label, "mode": source.mode, "model": cfg.model, "adapter": cfg.adapter,
        "enable_thinking": cfg.enable_thinking, "sampling": to_dict(cfg.sampling), "benchmarks": {},
    }
    # interactive episodes run the model's code whatever the task kind
    needs_sandbox = cfg.mode == "interactive" or any(t.kind == "code" for tasks in suites.values() for t in tasks)
    with _sandbox_pool(cfg, needs_sandbox) as pool, _progress() as progress:
        for name, tasks in suites.items():
            records = run_suite(name, tasks, source, pool, cfg, progress)
            results["benchmarks"][name] = summarise(tasks, records, cfg.ks)
    write_results(out, results)
    scores = ", ".join(f"{name} pass@1 {m.get('pass@1', float('nan')):.3f}" for name, m in results["benchmarks"].items())
    log.info("eval %s: %s (%s)", source.label, scores, out / "results.md")
    log.debug("%s", results_markdown(results))
    return out


def run_suite(
    name: str, tasks: Sequence[Task], source: Any, pool: Any, cfg: EvalConfig, progress: Any
) -> list[list[SampleRecord]]:
    """Graded samples of one benchmark, per task; finished problems are read back, not redone."""
    store = SampleStore(Path(cfg.output_dir) / name / "samples.jsonl")
    found = store.load()
    done = {tid: rs for tid, rs in found.items() if source.finished(name, tid, rs)}
    if len(done) != len(found):  # half-written by an interrupted run, or stale: redo those problems
        store.rewrite(r for rs in done.values() for r in rs)
    pending = [t for t in tasks if t.id not in done]
    if len(pending) < len(tasks):
        log.info("%s: %d of %d problems already done in %s", name, len(tasks) - len(pending), len(tasks), store.path)
    bar = progress.add_task(f"eval {name}", total=len(tasks), completed=len(tasks) - len(pending), figures="")
    position = {t.id: i for i, t in enumerate(tasks)}
    for start in range(0, len(pending), cfg.batch_size):
        chunk = pending[start : start + cfg.batch_size]
        for task, records in zip(chunk, source.records(name, chunk, position[chunk[0].id], pool)):
            store.append(records)
            done[task.id] = records
        progress.advance(bar, len(chunk))
    return [done[t.id] for t in tasks]


def check_resumable(out: Path, cfg: EvalConfig) -> None:
    """Refuse to mix samples made under different settings in one run directory."""
    path = out / "config.yaml"
    if not path.is_file() or not any(p.stat().st_size for p in out.glob("*/samples.jsonl")):
        return  # nothing sampled yet: settings may still be fixed freely
    old = yaml.safe_load(path.read_text()) or {}
    new = to_dict(cfg)
    for key in SAMPLE_KEYS:
        if key in old and old[key] != new[key]:
            raise MolrlError(
                f"{out} holds a run made with {key}={old[key]!r}, not {new[key]!r}; "
                "use another --out, or delete that directory to start over"
            )


@contextlib.contextmanager
def _sandbox_pool(cfg: EvalConfig, needed: bool) -> Iterator[Any]:
    if not needed:
        yield None
        return
    from molrl.sandbox import SandboxPool

    pool = SandboxPool(cfg.sandbox)
    try:
        yield pool
    finally:
        pool.close()


@contextlib.contextmanager
def _progress() -> Iterator[Any]:
    from molrl.console import new_progress

    with new_progress() as progress:
        yield progress
