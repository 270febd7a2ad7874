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
keys ``molrl.rerun.HARMLESS`` lists (logging, workers, threads) may change freely.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

from molrl.config import ConfigError, load_config, save_config, to_dict

from molrl.config_ranges import RunDir, Threads
from molrl.cpu import stage_threads
from molrl.errors import MolrlError
from molrl.layout import rl_runs
from molrl.rerun import changed_keys
from molrl.run_inputs import changed_inputs, input_fingerprints
from molrl.writes import folder_lock, write_text

log = logging.getLogger(__name__)

STAGES = ("collect", "mol", "rl", "eval")
DONE = "DONE"
BASE = "base"


@dataclass
class MolRun:
    """One named MoL run: the shared ``mol`` section plus overrides."""

    name: str = "mol"
    """Run name (its directory under mol/ and its label in the report)."""
    overrides: list[str] = field(default_factory=list)
    """``key=value`` settings of MolConfig on top of the ``mol`` section, e.g. loss.mode=ce."""


@dataclass
class RlRun:
    """One named RL run: the shared ``rl`` section plus overrides, started from a MoL run or the base."""

    name: str = "rl"
    """Run name (its directory under rl/ and its label in the report)."""
    start: str = "mol"
    """Name of the MoL run whose adapter the policy starts from, or ``base`` for the plain base model."""
    overrides: list[str] = field(default_factory=list)
    """``key=value`` settings of RlConfig on top of the ``rl`` section, e.g. algorithm=opd."""


@dataclass
class PipelineConfig:
    """A whole MoL-RL run: which stages, their settings, and the named variants."""

    model: str = ""
    """Base model every stage starts from: a local HF directory or a hub name."""
    output_dir: RunDir = Path("runs/pipeline")
    """The run directory (every stage's artifacts, the resolved config and report.md)."""
    stages: list[str] = field(default_factory=lambda: list(STAGES))
    """Stages to run, in order, from collect, mol, rl, eval (``grpo``, the first name of rl, still reads)."""
    traces: list[str] = field(default_factory=list)
    """Existing trace files for MoL (added to collected traces; used alone when collect is skipped)."""
    general_traces: list[str] = field(default_factory=list)
    """Trace files tagged general (replay data: KL on all their tokens in MoL)."""
    exclude_eval_tasks: bool = True
    """Leave out of every MoL run the traces whose task is a test task eval scores (eval.data's benchmark files, by
    content: MoL's ``data.exclude_benchmarks``)."""
    collect: dict[str, Any] = field(default_factory=dict, metadata={"config": "molrl.collect.config:CollectConfig"})
    """CollectConfig settings (model and output_dir are set by the pipeline; data.path too when the tasks are held in
    memory)."""
    mol: dict[str, Any] = field(default_factory=dict, metadata={"config": "molrl.mol.config:MolConfig"})
    """MolConfig settings shared by every MoL run (model, data.traces and output_dir are set by the pipeline)."""
    mol_runs: list[MolRun] = field(default_factory=lambda: [MolRun()])
    """The MoL runs."""
    rl: dict[str, Any] = field(default_factory=dict, metadata={"config": "molrl.rl.config:RlConfig"})
    """RlConfig settings shared by every RL run (model.path, model.adapter, output_dir are set)."""
    rl_runs: list[RlRun] = field(default_factory=lambda: [RlRun()])
    """The RL runs (any algorithm: grpo, dr_grpo, dr_grpo_std, opd, ppo)."""
    eval: dict[str, Any] = field(default_factory=dict, metadata={"config": "molrl.eval.config:EvalConfig"})
    """EvalConfig settings for every evaluated model (model, adapter, output_dir, label are set)."""
    eval_models: list[str] = field(default_factory=list)
    """Models to evaluate by name (base, a MoL run, an RL run); empty = the base and every run."""
    title: str = "MoL-RL pipeline"
    """Title of report.md."""
    threads: Threads | None = None
    """Torch CPU threads of every stage whose own section leaves them unset; none: the idle cores (molrl.cpu)."""

    # The RL sections were named for one algorithm while they run any.
    RENAMED_KEYS: ClassVar[dict[str, tuple[str, Callable[[Any], Any]]]] = {
        "grpo": ("rl", lambda section: section), "grpo_runs": ("rl_runs", lambda runs: runs)}

    def __post_init__(self) -> None:
        if "grpo" in self.stages:
            log.warning("stages: grpo is now rl; read as rl")
            self.stages = ["rl" if s == "grpo" else s for s in self.stages]
        unknown = [s for s in self.stages if s not in STAGES]
        if unknown:
            raise ValueError(f"stages: unknown stage {unknown[0]!r}; expected some of {', '.join(STAGES)}")
        names = [BASE] + [r.name for r in self.mol_runs] + [r.name for r in self.rl_runs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"run name {dupes[0]!r} is used twice (names must differ from each other and from 'base')")
        mol_names = {r.name for r in self.mol_runs}
        for run in self.rl_runs:
            if run.start != BASE and run.start not in mol_names:
                raise ValueError(f"rl_runs: {run.name} starts from {run.start!r}, which is not a MoL run nor 'base'")


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
    with folder_lock(out, "use another output_dir"):  # one pipeline at a time in a run directory
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


def collect_config(cfg: PipelineConfig, out: Path, in_memory: bool) -> Any:
    """The CollectConfig of the collect stage."""
    from molrl.collect.config import CollectConfig

    fixed = {"model": {"path": cfg.model}, "output_dir": str(out / "collect")}
    if in_memory:
        fixed["data"] = {"path": "<in memory>"}
    return stage_config(CollectConfig, cfg.collect, fixed, [], "collect")


def mol_config(cfg: PipelineConfig, run: MolRun, traces: Sequence[str], out: Path) -> Any:
    """The MolConfig of one MoL run."""
    from molrl.mol.config import MolConfig

    fixed = {"model": {"path": cfg.model}, "output_dir": str(out / "mol" / run.name),
             "data": {"traces": [*traces, *cfg.general_traces]}}
    own = (cfg.mol.get("data") or {}).get("exclude_benchmarks") or {}
    excluded = {name: path for name, path in eval_benchmark_files(cfg).items() if name not in own}
    if excluded:
        fixed["data"]["exclude_benchmarks"] = excluded
    return stage_config(MolConfig, cfg.mol, fixed, run.overrides, f"mol_runs.{run.name}")


def eval_benchmark_files(cfg: PipelineConfig) -> dict[str, str]:
    """The local files of the benchmarks eval scores (molrl's own names), which MoL's traces leave out; none unless
    ``exclude_eval_tasks``."""
    from molrl.tasks.index import FORMATS

    if not cfg.exclude_eval_tasks:
        return {}
    files = {}
    for name, source in (cfg.eval.get("data") or {}).items():
        path = source.get("path") if isinstance(source, dict) else source
        if name in FORMATS and path and not str(path).startswith("hub:"):
            files[name] = str(path)  # MoL names a missing one before it loads the model
    return files


def rl_config(cfg: PipelineConfig, run: RlRun, out: Path) -> Any:
    """The RlConfig of one RL run (its policy starts from the named MoL run's adapter, or the base)."""
    from molrl.rl.config import RlConfig

    start = None if run.start == BASE else str(out / "mol" / run.start / "adapter")
    fixed = {"output_dir": str(rl_runs(out) / run.name), "model": {"path": cfg.model, "adapter": start}}
    return stage_config(RlConfig, cfg.rl, fixed, run.overrides, f"rl_runs.{run.name}")


def eval_config(cfg: PipelineConfig, name: str, model: str, adapter: str | None, out: Path) -> Any:
    """The EvalConfig of one evaluated model."""
    from molrl.eval.config import EvalConfig

    fixed = {"model": {"path": model, "adapter": adapter}, "output_dir": str(out / "eval" / name), "label": name}
    return stage_config(EvalConfig, cfg.eval, fixed, [], "eval")


def check_stages(cfg: PipelineConfig, out: Path, in_memory: bool) -> None:
    """Build every stage's config before any work, so a bad key fails now and not after hours of training."""
    if "collect" in cfg.stages:
        collect_config(cfg, out, in_memory)
    if "mol" in cfg.stages:
        for run in cfg.mol_runs:
            mol_config(cfg, run, ["traces.jsonl"], out)
    rl_cfgs = [rl_config(cfg, rl_run, out) for rl_run in cfg.rl_runs] if "rl" in cfg.stages else []
    if "eval" in cfg.stages:
        eval_cfgs = [eval_config(cfg, name, cfg.model, None, out) for name in cfg.eval_models or model_names(cfg)]
        for rl_cfg, run in zip(rl_cfgs, cfg.rl_runs):
            for key in ("math_prompt", "code_prompt"):
                if eval_cfgs and getattr(rl_cfg, key) != getattr(eval_cfgs[0], key):
                    log.warning("rl_runs.%s: %s differs from eval's, so the policy is trained on other prompts "
                                "than it is evaluated on; set rl.%s and eval.%s alike", run.name, key, key, key)


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

    With ``stage`` (``collect``, ``mol``, ``rl``, ``eval``) the keys ``molrl.rerun.HARMLESS`` lists for it may differ
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


def stage_config(cls: type, section: dict[str, Any], fixed: dict[str, Any], overrides: Sequence[str], where: str) -> Any:
    """``cls`` built from a pipeline section, the pipeline-owned values in ``fixed``, then run overrides."""
    owned = sorted(k for k in _flatten(fixed) if k in _flatten(section))
    if owned:
        raise ConfigError(f"{where}: {owned[0]} is set by the pipeline; remove it from the section")
    items = [f"{k}={json.dumps(v)}" for k, v in {**_flatten(section), **_flatten(fixed)}.items()]
    try:
        return load_config(cls, None, [*items, *overrides], overrides_from="the pipeline config")
    except ConfigError as err:
        raise ConfigError(f"pipeline section {where}: {err}") from None


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists and other values are leaves)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = to_dict(value)
    return flat


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


def load_pipeline_config(path: str | Path | None, overrides: Sequence[str] = ()) -> PipelineConfig:
    """The pipeline config from a YAML file plus ``key=value`` overrides."""
    return load_config(PipelineConfig, path, overrides)
