"""``run_eval``: every benchmark of an ``EvalConfig``, chunk by chunk, resumable, into a run directory.

For each benchmark: load problems -> skip those already in ``samples.jsonl`` -> per chunk of
``batch_size`` problems get graded samples from the source (sampled single-turn, interactive
episodes, or a predictions file; all graded by the shared graders) -> append them -> summarise.
Results land in ``results.json`` / ``results.md`` next to the resolved ``config.yaml``. A re-run follows
``molrl.records.rerun``, the rule of every stage: other settings are refused by name, a finished run is left as it is.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any, Iterator, Sequence

import yaml

from molrl.config import check_values, to_dict
from molrl.config.renames import current_names
from molrl.cpu import use_threads
from molrl.errors import MolrlError
from molrl.eval.config import EvalConfig
from molrl.eval.grading import graded_now, regrade
from molrl.eval.report import results_markdown, write_results
from molrl.eval.samples import SampleRecord, SampleStore, other_model, recorded_engines
from molrl.eval.single import summarise
from molrl.eval.interactive import InteractiveSource
from molrl.eval.sources import PredictionSource, SamplingSource
from molrl.eval.suites import load_suite, load_whole
from molrl.records.provenance import check_scored
from molrl.records.rerun import NEW_RUN, changed_keys, check_rerun, save_run_config, say_finished
from molrl.records.run_inputs import inputs_path
from molrl.tasks import Task
from molrl.records.locks import folder_lock
from molrl.sandbox.errors import ErrorCount

log = logging.getLogger(__name__)


def make_source(cfg: EvalConfig) -> Any:
    """The completion source a config asks for: predictions, single-turn sampling, or interactive."""
    if cfg.predictions:
        missing = [b for b in cfg.benchmarks if b not in cfg.predictions]
        if missing:
            raise MolrlError(f"predictions given for {', '.join(cfg.predictions)} but not for {', '.join(missing)}; "
                             "pass one --predictions NAME=PATH per benchmark")
        if cfg.model.path:
            log.warning("grading predictions: model %s is not loaded", cfg.model.path)
        return PredictionSource(cfg)
    if not cfg.model.path:
        raise MolrlError("no model to evaluate: pass --model M, or --predictions FILE to grade completions made elsewhere")
    if cfg.mode == "interactive":
        return InteractiveSource(cfg)
    return SamplingSource(cfg)


def run_eval(cfg: EvalConfig) -> Path:
    """Evaluate ``cfg.benchmarks`` and return the run directory holding the results (one run at a time writes a
    run directory: ``molrl.records.locks.folder_lock``)."""
    out = Path(cfg.output_dir)
    created = not out.exists()
    with folder_lock(out, f"use another {NEW_RUN['eval']}", stage="eval"), _removed_if_failed_empty(out, created):
        return _evaluate(cfg)


def _evaluate(cfg: EvalConfig) -> Path:
    """``run_eval``'s work, in the order the module docstring gives."""
    check_values(cfg, "EvalConfig")
    out = Path(cfg.output_dir)
    started = any(p.stat().st_size for p in out.glob("*/samples.jsonl"))
    check_rerun("eval", cfg, out / "config.yaml", started=started)  # molrl.records.rerun: one rule for every stage
    suites = {name: load_suite(name, cfg) for name in cfg.benchmarks}  # all data checked before any work
    if cfg.model.adapter or (cfg.model.path and not cfg.predictions):  # never score what the model trained on
        known = {name: load_whole(name, cfg) for name in cfg.benchmarks}  # matched as exclusion matches: whole files
        check_scored(cfg.model.path, cfg.model.adapter, suites, cfg.allow_trained_overlap, "allow_trained_overlap",
                     known)
    source = make_source(cfg)
    suites = {name: source.select(name, tasks) for name, tasks in suites.items()}
    check_same_model(out, suites, source)  # a raised limit extends a run with the model that made it only
    if started and finished(out, cfg, suites, source):
        say_finished(out, f"every problem graded, {out / 'results.md'}", "eval")
        return out
    if source.mode != "predictions":  # a model generates: one thread policy for every stage
        use_threads(cfg.threads, "eval")
        source.plan(sum(len(tasks) for tasks in suites.values()))  # what engine=auto weighs the engine's start against
    save_run_config("eval", cfg, out / "config.yaml")
    results: dict[str, Any] = {
        "label": source.label, "mode": source.mode, "model": cfg.model.path, "adapter": to_dict(cfg.model.adapter),
        "enable_thinking": cfg.thinking, "sampling": to_dict(cfg.sampling), "benchmarks": {},
    }
    # interactive episodes run the model's code whatever the task kind
    needs_sandbox = cfg.mode == "interactive" or any(t.kind == "code" for tasks in suites.values() for t in tasks)
    made: list[SampleRecord] = []  # every sample summarised: the engines that made them go in the results
    errors = ErrorCount(cfg.sandbox.max_error_rate, "eval")  # the samples graded here that the sandbox failed
    try:
        with _sandbox_pool(cfg, needs_sandbox) as pool, _progress() as progress:
            for name, tasks in suites.items():
                records = run_suite(name, tasks, source, pool, cfg, progress, errors)
                results["benchmarks"][name] = summarise(tasks, records, cfg.ks)
                made += [r for rs in records for r in rs]
    finally:  # a vLLM engine's memory back before the next stage of the process starts its own
        source.close()
    results.update(engine=recorded_engines(made), model_fingerprint=source.model_fingerprints())
    write_results(out, results)
    scores = ", ".join(f"{name} pass@1 {m['pass@1']:.3f}" if "pass@1" in m else f"{name} no judged sample"
                       for name, m in results["benchmarks"].items())
    for name, m in results["benchmarks"].items():
        if m["sandbox_errors"] or m["grader_errors"]:
            log.warning("eval %s: %d sandbox errors and %d grader errors are no verdict, left out of its metrics",
                        name, m["sandbox_errors"], m["grader_errors"])
    log.info("eval %s: %s (%s)", source.label, scores, out / "results.md")
    log.debug("%s", results_markdown(results))
    return out


def run_suite(
    name: str, tasks: Sequence[Task], source: Any, pool: Any, cfg: EvalConfig, progress: Any, errors: ErrorCount
) -> list[list[SampleRecord]]:
    """Graded samples of one benchmark, per task; finished problems are read back, not redone. Every chunk graded
    here counts its sandbox errors in ``errors`` (the run's), which stops the run past ``sandbox.max_error_rate``."""
    store = SampleStore(Path(cfg.output_dir) / name / "samples.jsonl")
    found = store.load()
    done = {tid: rs for tid, rs in found.items() if source.finished(name, tid, rs)}
    stale = [t for t in tasks if t.id in done and not graded_now(t, done[t.id])]
    if stale and source.mode == "interactive":  # an episode's verdict came from its turns: it is played again
        log.info("%s: %d problems were graded by an older grading; their episodes run again", name, len(stale))
        for task in stale:
            del done[task.id]
    elif stale:  # judged again from the completions held; nothing is generated again
        log.info("%s: %d problems were graded by an older grading; graded again from their completions in %s",
                 name, len(stale), store.path)
        for task, records in zip(stale, regrade(stale, [done[t.id] for t in stale], pool)):
            done[task.id] = records
        count_errors(errors, [done[t.id] for t in stale])
    if len(done) != len(found) or stale:  # half-written by an interrupted run, stale, or graded again
        store.rewrite(r for rs in done.values() for r in rs)
    pending = [t for t in tasks if t.id not in done]
    if len(pending) < len(tasks):
        log.info("%s: %d of %d problems already done in %s", name, len(tasks) - len(pending), len(tasks), store.path)
    bar = progress.add_task(f"eval {name}", total=len(tasks), completed=len(tasks) - len(pending), figures="")
    position = {t.id: i for i, t in enumerate(tasks)}
    for start in range(0, len(pending), cfg.batch_size):
        chunk = pending[start : start + cfg.batch_size]
        for task, records in zip(chunk, source.records(name, chunk, position[chunk[0].id], pool)):
            for record in records:  # what made it (engine, model, sampling) travels with each sample
                record.made_by = source.made_by(position[chunk[0].id])
            store.append(records)
            done[task.id] = records
        progress.advance(bar, len(chunk))
        count_errors(errors, [done[t.id] for t in chunk])  # the chunk's samples are stored before a stop
    return [done[t.id] for t in tasks]


def count_errors(errors: ErrorCount, records: Sequence[Sequence[SampleRecord]]) -> None:
    """Count the sandbox errors among freshly graded ``records`` (a sample whose stage, or interactive episode's end,
    is ``sandbox_error``); past ``sandbox.max_error_rate`` of the run's samples this stops it."""
    samples = [r for rs in records for r in rs]
    errors.add(sum(r.stage == "sandbox_error" for r in samples), len(samples))


def finished(out: Path, cfg: EvalConfig, suites: dict[str, Sequence[Task]], source: Any) -> bool:
    """Whether ``out`` already holds this very run's results, so that nothing is written: the same config but for the
    keys ``molrl.records.rerun`` lets a re-run change (left as saved: a finished run asked for fewer problems or benchmarks, or
    another label, stays as it is), results written for every benchmark and pass@k asked for (others summarise
    again), and every problem's samples complete and judged by the current grading (``molrl.tasks.grade.GRADING``)."""
    saved, results = out / "config.yaml", out / "results.json"
    if not (saved.is_file() and results.is_file()):
        return False
    kept = yaml.safe_load(saved.read_text()) or {}  # compared under the current key names (changed_keys, current_names)
    if changed_keys("eval", kept, cfg) or not set(cfg.ks) <= set(current_names(EvalConfig, kept).get("ks") or ()):
        return False
    summarised = json.loads(results.read_text()).get("benchmarks") or {}
    if not all(name in summarised for name in suites):
        return False
    for name, tasks in suites.items():
        found = SampleStore(out / name / "samples.jsonl").load()
        if not all(t.id in found and source.finished(name, t.id, found[t.id]) and graded_now(t, found[t.id])
                   for t in tasks):
            return False
    return True


def check_same_model(out: Path, suites: dict[str, Sequence[Task]], source: Any) -> None:
    """Refuse to add to samples in ``out`` that another model made (the fingerprints each sample keeps of the model and
    adapter differ from the ones loaded now), before anything loads: one run, one model."""
    now = source.model_fingerprints()
    for name in suites:
        store = SampleStore(out / name / "samples.jsonl")
        other = other_model(store.load(), now) if now else None
        if other is not None:
            kept = other.made_by["model"]
            key = next(k for k in sorted(kept.keys() & now.keys()) if kept[k] != now[k])
            raise MolrlError(f"{store.path}: problem {other.id} was sampled from another {key} (fingerprint {kept[key]}, "
                             f"now {now[key]}); put that model back to extend this run, or start a new run with "
                             f"{NEW_RUN['eval']}")


def grading_current(cfg: EvalConfig) -> bool:
    """Whether every sample stored in ``cfg.output_dir`` was judged by the current grading of its task's kind: a
    finished run that is not is run again, which grades its samples again (``run_suite``)."""
    for name in cfg.benchmarks:
        found = SampleStore(Path(cfg.output_dir) / name / "samples.jsonl").load()
        if found and not all(graded_now(t, found[t.id]) for t in load_suite(name, cfg) if t.id in found):
            return False
    return True


@contextlib.contextmanager
def _removed_if_failed_empty(out: Path, created: bool) -> Iterator[None]:
    """On a failure before any sample was written, remove what this run made: ``out`` if it ``created`` it, else its
    config.yaml and inputs.json if it wrote them; so a failed eval (a bad model, say) leaves nothing behind."""
    had_config = (out / "config.yaml").exists()
    try:
        yield
    except BaseException:
        if not any(p.stat().st_size for p in out.glob("*/samples.jsonl")):
            if created:
                shutil.rmtree(out, ignore_errors=True)
            elif not had_config:
                (out / "config.yaml").unlink(missing_ok=True)
                inputs_path(out / "config.yaml").unlink(missing_ok=True)
        raise


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
    from molrl.logs.console import new_progress

    with new_progress() as progress:
        yield progress
