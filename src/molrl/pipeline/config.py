"""The pipeline's config (``PipelineConfig``, its named MoL and RL runs) and each stage's config built from its
sections: the section, plus what the pipeline fixes (model, inputs, output directory), plus a run's overrides."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

from molrl.config.strict import seal
from molrl.config import ConfigError, load_config, override_key, to_dict
from molrl.config.idle import shared_section
from molrl.config.ranges import RunDir, Threads
from molrl.records.layout import rl_runs
from molrl.records.writes import plain_name

log = logging.getLogger(__name__)

STAGES = ("collect", "mol", "rl", "eval")
"""The pipeline's stages, in their order."""
BASE = "base"
"""The name of the base model among the pipeline's models."""


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
        for name in names:  # each becomes a folder (mol/, rl/, eval/) and names the adapter an RL run starts from
            if not plain_name(name):
                raise ValueError(f"run name {name!r} is not one plain folder name, so its run would be written outside "
                                 "the run directory; give a name that is not '.' or '..' and holds no '/', '\\' or NUL")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"run name {dupes[0]!r} is used twice (names must differ from each other and from 'base')")
        unknown = [name for name in self.eval_models if name not in names]
        if unknown:
            raise ValueError(f"eval_models: {unknown[0]!r} is not base nor a MoL or RL run name")
        mol_names = {r.name for r in self.mol_runs}
        for run in self.rl_runs:
            if run.start != BASE and run.start not in mol_names:
                raise ValueError(f"rl_runs: {run.name} starts from {run.start!r}, which is not a MoL run nor 'base'")

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
    mol = stage_config(MolConfig, cfg.mol, fixed, run.overrides, f"mol_runs.{run.name}", shared=True)
    if mol.loss.cached_base and mol.loss.base_targets_dir is None:  # one store for every run: each finds its own
        mol.loss = replace(mol.loss, base_targets_dir=out / "base_targets")
    return mol


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
    return stage_config(RlConfig, cfg.rl, fixed, run.overrides, f"rl_runs.{run.name}", shared=True)


def eval_config(cfg: PipelineConfig, name: str, model: str, adapter: str | None, out: Path) -> Any:
    """The EvalConfig of one evaluated model."""
    from molrl.eval.config import EvalConfig

    fixed = {"model": {"path": model, "adapter": adapter}, "output_dir": str(out / "eval" / name), "label": name}
    return stage_config(EvalConfig, cfg.eval, fixed, [], "eval")

def stage_config(cls: type, section: dict[str, Any], fixed: dict[str, Any], overrides: Sequence[str], where: str,
                 shared: bool = False) -> Any:
    """``cls`` built from a pipeline section, the pipeline-owned values in ``fixed``, then run overrides; ``shared``:
    the section is shared by several runs, and its keys this run leaves idle are named once, not refused
    (``molrl.config.idle``; one idle in every run is refused by ``molrl.pipeline.check_stages``)."""
    owned = sorted(k for k in _flatten(fixed) if k in _flatten(section))
    if owned:
        raise ConfigError(f"{where}: {owned[0]} is set by the pipeline; remove it from the section")
    items = [f"{k}={json.dumps(v)}" for k, v in {**_flatten(section), **_flatten(fixed)}.items()]
    mine = {".".join(override_key(cls, item)[0]) for item in overrides}
    keys = section_keys(cls, section) - mine if shared else set()
    try:
        with shared_section(f"pipeline section {where}", keys):
            return load_config(cls, None, [*items, *overrides], overrides_from="the pipeline config")
    except ConfigError as err:
        raise ConfigError(f"pipeline section {where}: {err}") from None


def section_keys(cls: type, section: dict[str, Any]) -> set[str]:
    """The keys a pipeline section sets, under ``cls``'s current names (``model=PATH`` as ``model.path``)."""
    return {".".join(override_key(cls, f"{k}={json.dumps(v)}")[0]) for k, v in _flatten(section).items()} - {""}


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists and other values are leaves)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = to_dict(value)
    return flat

def load_pipeline_config(path: str | Path | None, overrides: Sequence[str] = ()) -> PipelineConfig:
    """The pipeline config from a YAML file plus ``key=value`` overrides."""
    return load_config(PipelineConfig, path, overrides)


seal(PipelineConfig)  # an attribute it does not have is refused (molrl.config.strict)
