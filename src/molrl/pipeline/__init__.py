"""``molrl pipeline``: collect -> MoL -> RL -> eval in one run directory, then ``report.md``.

Each stage is the real stage function (``run_collect``, ``run_mol``, ``run_rl``, ``run_eval``)
with its config built from a section of the pipeline config plus what the pipeline fixes (model,
inputs, output directory). Variants are named runs: several MoL runs (modes, epochs) and several
RL runs (algorithms, reward types, each starting from a named MoL run or the base), and every
resulting model is evaluated single-step. The RL stage and its sections are ``rl`` and ``rl_runs``;
their first names, ``grpo`` and ``grpo_runs``, still load.

Run directory::

    config.yaml                 the resolved pipeline config
    collect/traces.jsonl        collected traces (+ their config)
    mol/<run>/                  each MoL run's output (adapter/, metrics.jsonl, config.yaml)
    rl/<run>/                   each RL run's output (grpo/<run>/ in a run dir made before: it resumes there)
    eval/<model>/               each evaluated model's results.json
    report.md, plots/*.png

A stage directory is finished when its ``DONE`` marker exists (written last, with the stage's
resolved config); a re-run skips finished stages and calls the stage function again for an
unfinished one, which resumes from its own checkpoints / appended records. A finished stage whose
config has since changed in a key that matters is an error naming the key, rather than a silent reuse; the
keys ``molrl.records.rerun.HARMLESS`` lists (logging, workers, threads) may change freely.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from molrl.config import ConfigError, save_config, to_dict
from molrl.cpu import stage_threads
from molrl.errors import MolrlError
from molrl.records.layout import rl_runs
from molrl.config.idle import from_section, idle_keys, idle_line
from molrl.pipeline.config import (BASE, MolRun, PipelineConfig, RlRun, collect_config, eval_config, mol_config,
                                   rl_config, section_keys)
from molrl.records.rerun import changed_keys
from molrl.records.run_inputs import changed_inputs, input_fingerprints
from molrl.records.locks import folder_lock
from molrl.records.writes import write_text

log = logging.getLogger(__name__)

DONE = "DONE"


def run_pipeline(cfg: PipelineConfig, *, collect_tasks: Sequence[Any] | None = None,
                 most_threads: int | None = None) -> Path:
    """Run the configured stages in ``cfg.output_dir`` (skipping finished ones), write report.md; returns the dir.

    ``collect_tasks`` replaces the task file of the collect section with tasks held in memory;
    ``most_threads`` caps the torch threads of a stage that follows the idle cores (the demo's preset sets it).
    """
    if not cfg.model:
        raise ConfigError("model is not set: give the base model (model=PATH)")
    out = Path(cfg.output_dir)
    check_stages(cfg, out, collect_tasks is not None)
    with folder_lock(out, "use another output_dir", stage="pipeline"):  # one pipeline at a time in a run directory
        started, finished = time.time(), (out / "report.md").is_file()
        if not finished:  # what the run was asked, kept from its start
            _record_run(cfg, out)
        with stage_threads(cfg.threads, most_threads):  # each stage applies it, unless its own section sets threads
            timings = _run_stages(cfg, out, collect_tasks)
        if finished and not any(p.stat().st_mtime >= started for p in out.rglob(DONE)):
            log.info("%s: finished (every stage done, %s); nothing to do", out, out / "report.md")
            return out  # a finished run is never rewritten: no stage ran, so its report stands
        if finished:
            _record_run(cfg, out)
        _record_timings(out, timings)
        from molrl.report import write_report

        report = write_report(out)
    log.info("report: %s", report)
    return out


def _run_stages(cfg: PipelineConfig, out: Path, collect_tasks: Sequence[Any] | None) -> dict[str, float]:
    """Every configured stage in order; returns the wall-clock seconds each took in this invocation."""
    timings: dict[str, float] = {}
    traces = list(cfg.traces)
    if "collect" in cfg.stages:
        traces.insert(0, str(_timed_stage(timings, "collect", lambda: collect_stage(cfg, out, collect_tasks))))
    if "mol" in cfg.stages:
        for run in cfg.mol_runs:
            _timed_stage(timings, f"mol/{run.name}", lambda run=run: mol_stage(cfg, run, traces, out))
    if "rl" in cfg.stages:
        for run in cfg.rl_runs:
            _timed_stage(timings, f"{rl_runs(out).name}/{run.name}", lambda run=run: rl_stage(cfg, run, out))
    if "eval" in cfg.stages:
        for name in cfg.eval_models or model_names(cfg):
            _timed_stage(timings, f"eval/{name}", lambda name=name: eval_stage(cfg, name, out))
    return timings


def environment() -> dict[str, Any]:
    """What the numbers of a run depend on besides its config: versions, CPU, cores, torch threads."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import torch

    versions = {}
    for name in ("molrl", "torch", "transformers", "peft", "trl"):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"versions": versions, "python": platform.python_version(), "cpu": cpu, "cores": os.cpu_count(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def model_names(cfg: PipelineConfig) -> list[str]:
    """Every model the pipeline produces, base first."""
    names = [BASE]
    if "mol" in cfg.stages or any((Path(cfg.output_dir) / "mol" / r.name).is_dir() for r in cfg.mol_runs):
        names += [r.name for r in cfg.mol_runs]
    if "rl" in cfg.stages or any((rl_runs(cfg.output_dir) / r.name).is_dir() for r in cfg.rl_runs):
        names += [r.name for r in cfg.rl_runs]
    return names


def check_stages(cfg: PipelineConfig, out: Path, in_memory: bool) -> None:
    """Build every stage's config before any work, so a bad key fails now and not after hours of training."""
    if "collect" in cfg.stages:
        collect_config(cfg, out, in_memory)
    if "mol" in cfg.stages and cfg.mol_runs:
        idle_in_every_run(cfg, "mol", [mol_config(cfg, run, ["traces.jsonl"], out) for run in cfg.mol_runs])
    rl_cfgs = [rl_config(cfg, rl_run, out) for rl_run in cfg.rl_runs] if "rl" in cfg.stages else []
    if rl_cfgs:
        idle_in_every_run(cfg, "rl", rl_cfgs)
    if "eval" in cfg.stages:
        eval_cfgs = [eval_config(cfg, name, cfg.model, None, out) for name in cfg.eval_models or model_names(cfg)]
        for rl_cfg, run in zip(rl_cfgs, cfg.rl_runs):
            for key in ("math_prompt", "code_prompt"):
                if eval_cfgs and getattr(rl_cfg, key) != getattr(eval_cfgs[0], key):
                    log.warning("rl_runs.%s: %s differs from eval's, so the policy is trained on other prompts "
                                "than it is evaluated on; set rl.%s and eval.%s alike", run.name, key, key, key)


def idle_in_every_run(cfg: PipelineConfig, stage: str, stage_cfgs: Sequence[Any]) -> None:
    """Refuse a key of the shared ``stage`` section (mol or rl) that acts in none of its runs
    (``molrl.config.idle``)."""
    idle = [{i.key: i for i in idle_keys(stage_cfg, stage)} for stage_cfg in stage_cfgs]
    section = frozenset(section_keys(type(stage_cfgs[0]), getattr(cfg, stage)))
    everywhere = [key for key in idle[0] if all(key in run for run in idle) and from_section(key, section)]
    if everywhere:
        runs = cfg.mol_runs if stage == "mol" else cfg.rl_runs
        raise ConfigError(f"pipeline section {stage}, in every {stage.upper() if stage == 'rl' else 'MoL'} run "
                          f"({', '.join(run.name for run in runs)}): {idle_line([idle[0][key] for key in everywhere])}")


def collect_stage(cfg: PipelineConfig, out: Path, tasks: Sequence[Any] | None) -> Path:
    """Collected traces of the base model (``collect/traces.jsonl``)."""
    from molrl.collect.files import collect_files
    from molrl.collect.run import run_collect

    collect_cfg = collect_config(cfg, out, tasks is not None)
    run_stage(out / "collect", collect_cfg, lambda: run_collect(collect_cfg, tasks=tasks), "collect")
    return collect_files(Path(collect_cfg.output_dir)).traces


def mol_stage(cfg: PipelineConfig, run: MolRun, traces: Sequence[str], out: Path) -> Path:
    """One MoL run on the traces (``mol/<name>/``)."""
    from molrl.mol.run import run_mol

    if not traces and not cfg.general_traces:
        raise ConfigError("mol: no traces to train on: run the collect stage or list files under traces")
    mol_cfg = mol_config(cfg, run, traces, out)
    run_stage(Path(mol_cfg.output_dir), mol_cfg, lambda: run_mol(mol_cfg), "mol")
    return Path(mol_cfg.output_dir)


def rl_stage(cfg: PipelineConfig, run: RlRun, out: Path) -> Path:
    """One RL run from a MoL run's adapter or the base (``rl/<name>/``)."""
    from molrl.rl.run import run_rl

    if run.start != BASE and not (out / "mol" / run.start / DONE).is_file():
        raise MolrlError(f"rl run {run.name} starts from MoL run {run.start}, which has not finished "
                         f"({out / 'mol' / run.start}); add mol to stages")
    rl_cfg = rl_config(cfg, run, out)
    run_stage(Path(rl_cfg.output_dir), rl_cfg, lambda: run_rl(rl_cfg), "rl")
    return Path(rl_cfg.output_dir)


def eval_stage(cfg: PipelineConfig, name: str, out: Path) -> Path:
    """Single-step evaluation of one model (``eval/<name>/``)."""
    from molrl.eval.run import grading_current, run_eval

    eval_cfg = eval_config(cfg, name, *model_weights(cfg, name, out), out)
    run_stage(Path(eval_cfg.output_dir), eval_cfg, lambda: run_eval(eval_cfg), "eval",
              current=lambda: grading_current(eval_cfg))
    return Path(eval_cfg.output_dir)


def model_weights(cfg: PipelineConfig, name: str, out: Path) -> tuple[str, str | None]:
    """(model, adapter) of a named model: the base, a MoL run's adapter, or an RL run's."""
    if name == BASE:
        return cfg.model, None
    for group, runs in (("mol", cfg.mol_runs), (rl_runs(out).name, cfg.rl_runs)):
        if name in {r.name for r in runs}:
            run_dir = out / group / name
            if not (run_dir / DONE).is_file():
                raise MolrlError(f"cannot evaluate {name}: {group} run {run_dir} has not finished")
            if (run_dir / "adapter").is_dir():
                merged = run_dir / "model"  # RL merge_new: the adapter sits on the merged MoL model
                return (str(merged) if merged.is_dir() else cfg.model), str(run_dir / "adapter")
            return str(run_dir / "model"), None
    raise ConfigError(f"eval_models: {name!r} is not base nor a MoL or RL run name")


def run_stage(stage_dir: Path, stage_cfg: Any, work: Callable[[], Any], stage: str | None = None,
              current: Callable[[], bool] | None = None) -> bool:
    """Run ``work`` unless ``stage_dir`` holds a DONE marker for the same config and inputs (contents, by their
    fingerprints); returns whether it ran.

    With ``stage`` (``collect``, ``mol``, ``rl``, ``eval``) the keys ``molrl.records.rerun.HARMLESS`` lists for it may differ
    from the finished run's (logging, workers, threads): the stage is still finished. Any other difference is an
    error naming each key with both values. ``current`` says whether a finished run's results still stand (an
    evaluation's: judged by the current grading); when they do not, ``work`` runs again and brings them up to date
    (an evaluation grades its stored samples again and generates nothing)."""
    marker = stage_dir / DONE
    resolved = to_dict(stage_cfg)
    if marker.is_file():
        done = json.loads(marker.read_text())
        changes = changed_keys(stage, done.get("config"), stage_cfg)
        changes += changed_inputs(stage, done.get("inputs"), stage_cfg)
        if changes:
            raise MolrlError(
                f"{stage_dir} finished with other settings than the ones asked for now: "
                f"{'; '.join(map(str, changes))}; delete {stage_dir} to redo it, or use a new output_dir"
            )
        if current is None or current():
            log.info("%s: finished earlier, skipped", stage_dir)
            return False
        log.info("%s: finished earlier, under an older grading: brought up to date", stage_dir)
    stage_dir.mkdir(parents=True, exist_ok=True)
    log.info("%s: running", stage_dir)
    started = time.time()
    work()
    write_text(marker, json.dumps({"seconds": round(time.time() - started, 1), "config": resolved,
                                   "inputs": input_fingerprints(stage, stage_cfg)}, indent=1))
    return True


def _timed_stage(timings: dict[str, float], name: str, fn: Callable[[], Any]) -> Any:
    started = time.time()
    result = fn()
    timings[name] = round(time.time() - started, 1)
    return result


def _record_run(cfg: PipelineConfig, out: Path) -> None:
    """The pipeline's resolved config and the machine it runs on, beside its stages."""
    save_config(cfg, out / "config.yaml")
    write_text(out / "environment.json", json.dumps(environment(), indent=1))


def _record_timings(out: Path, timings: dict[str, float]) -> None:
    """Wall-clock seconds of each stage in this invocation (skipped stages take ~0 s)."""
    write_text(out / "timings.json", json.dumps(timings, indent=1))


