"""``molrl demo --study``: the MoL-RL paper's ablations on the demo world, over seeds, in one report.

For each seed (world and training seed 0, 1, 2) in ``seed-N/``: the demo's world and base model,
the base's own traces (the collect stage) and an expert's traces in another style
(``molrl.demo.expert``), then one pipeline run with every variant below, then ``study.md`` over
all seeds (``molrl.demo.study_report``). Every step skips what is already on disk, so a killed
study continues where it stopped.

The claims and the runs that test them:

1. Forgetting: MoL vs pure CE vs CE on feedback only, on the base's own traces and on the
   expert's (runs ``mol``, ``ce``, ``ce_feedback`` and the same with ``-expert``). The CE runs
   measure their decision-token KL to the base too (``loss.monitor_kl``), for the mechanism plot.
2. MoL length: 0, 1 and 3 epochs of MoL (``base``, ``mol_1ep``, ``mol``) each followed by the
   same GRPO run. Every MoL run of the study trains 3 epochs except ``mol_1ep`` (the demo's own
   ``mol`` run, 100 steps, is about 6 epochs).
3. GRPO vs Dr.GRPO from the same MoL model, with completion length over training.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

from molrl.cpu import govern_threads
from molrl.errors import MolrlError
from molrl.pipeline import GrpoRun, MolRun, PipelineConfig, run_pipeline

log = logging.getLogger(__name__)

SOURCES = {"own": "", "expert": "-expert"}
"""Trace sources and the suffix of their MoL run names."""
LOSSES = ("mol", "ce", "ce_feedback")
"""The MoL loss ablation."""
EPOCHS = {0: "base", 1: "mol_1ep", 3: "mol"}
"""MoL epochs and the run each GRPO run starts from (the loss ablation's runs train 3 epochs too)."""
def run_study(out: str | Path, quick: bool = False, seeds: int = 3, overrides: list[str] | None = None) -> Path:
    """The study in ``out/seed-N`` for each seed and ``out/study.md`` over them; returns the report's path."""
    from molrl.demo.study_report import write_study_report

    if seeds < 1:
        raise MolrlError(f"--seeds {seeds}: give 1 or more")
    out = Path(out)
    started = time.time()
    try:
        run_dirs = [run_seed(out / f"seed-{seed}", quick, overrides, seed) for seed in range(seeds)]
    finally:
        govern_threads(None)
    report = write_study_report(run_dirs, out)
    log.info("study finished in %.0f s: %s", time.time() - started, report)
    return report


def run_seed(out: Path, quick: bool, overrides: list[str] | None, seed: int) -> Path:
    """Every run of the study for one seed; returns its pipeline directory."""
    from transformers import AutoTokenizer

    from molrl.demo.expert import expert_traces
    from molrl.demo.run import episode_config, prepare_seed, use_idle_threads

    preset = "study_quick" if quick else "default"
    cfg, world, threads = prepare_seed(out, preset, overrides, seed)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    expert = expert_traces(world.rule_train, tokenizer, episode_config(cfg), out / "expert" / "traces.jsonl")
    cfg = study_config(cfg, expert, seed, preset)
    run_pipeline(cfg, collect_tasks=world.rule_train, before_stage=lambda stage: use_idle_threads(threads, stage))
    return Path(cfg.output_dir)


def study_config(cfg: PipelineConfig, expert: Path, seed: int, preset: str) -> PipelineConfig:
    """The demo pipeline ``cfg`` with the study's MoL and GRPO runs in place of the demo's."""
    three = ["train.max_steps=-1", "train.epochs=3"]
    mol_runs = []
    for source, suffix in SOURCES.items():
        traces = [f"data.traces=[{expert},{','.join(cfg.general_traces)}]"] if source == "expert" else []
        for mode in LOSSES:
            monitor = [] if mode == "mol" else ["loss.monitor_kl=true"]
            mol_runs.append(MolRun(name=mode + suffix, overrides=[f"loss.mode={mode}", *monitor, *three, *traces]))
    mol_runs.append(MolRun(name=EPOCHS[1], overrides=["loss.mode=mol", "train.max_steps=-1", "train.epochs=1"]))
    grpo_runs = [GrpoRun(name=f"{start}+grpo", start=start, overrides=["algorithm=grpo"]) for start in EPOCHS.values()]
    grpo_runs.append(GrpoRun(name="mol+dr_grpo", start="mol", overrides=["algorithm=dr_grpo"]))
    return replace(cfg, mol_runs=mol_runs, grpo_runs=grpo_runs, eval_models=[],
                   title=f"molrl study ({preset} preset, seed {seed})")
