"""``molrl demo --study``: the MoL-RL paper's ablations on the demo world, over seeds, in one report.

For each seed (world and training seed 0, 1, 2) in ``seed-N/``: the demo's world (with its
code-answer family) and base model, the base's own traces (the collect stage) and an expert's
traces in another style (``molrl.demo.expert``), then one pipeline run with every variant below,
then ``study.md`` over all seeds (``molrl.demo.study_report``). Every step skips what is already
on disk, so a killed study continues where it stopped.

The claims and the runs that test them:

1. Forgetting: MoL vs pure CE vs CE on feedback only, on the base's own traces and on the
   expert's (runs ``mol``, ``ce``, ``ce_feedback`` and the same with ``-expert``), 3 epochs each.
   The CE runs measure their decision-token KL to the base too (``loss.monitor_kl``), for the
   mechanism plot.
2. MoL length: 0, 1 and 3 epochs of MoL and the demo's own MoL length (``base``, ``mol_1ep``,
   ``mol``, ``mol_demo``: the pipeline's ``mol.train.max_steps``, 80 steps, about 4.7 epochs),
   each followed by the same GRPO run. ``mol`` is the loss ablation's 3-epoch run.
3. GRPO vs Dr.GRPO from the demo-length MoL model (``mol_demo+grpo`` is shared with claim 2),
   with completion length over training.
4. Rewards: the staged code reward (no code < compile error < runtime error < tests pass) vs the
   binary one (1 when every test passes), two GRPO runs from the demo-length MoL model on the
   world's code-answer problems, evaluated on held-out code-answer problems and the general set.

An epoch is one pass over the domain traces (the 400 collected episodes, or the expert's 400);
the general replay traces are interleaved at one per three domain traces
(``mol.data.domain_general_ratio``) and do not count towards it, so one epoch is 533 sequences,
17 optimiser steps of 32.

Sizes against the 60-minute budget on 2 shared cores (``study`` preset in ``molrl.demo.run``):
the demo's world and base (800 steps) plus 200 code-answer training problems (and 200 general
ones, for the base to learn the format) and 100 held-out ones; every GRPO run of the study takes
60 steps instead of the demo's 80 (7 runs: 4 for the epochs, Dr.GRPO, 2 rewards); every model is
evaluated on the three benchmarks. The three seeds took 39 minutes there (11 to 14 per seed), beside
other work.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

from molrl.cpu import govern_threads
from molrl.errors import MolrlError
from molrl.demo.study_arms import ALGORITHMS, CODE, CODE_TOKENS, EPOCHS, LOSSES, REWARD_START, REWARDS, SOURCES
from molrl.pipeline import MolRun, PipelineConfig, RlRun, run_pipeline

log = logging.getLogger(__name__)

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
    from molrl.demo.run import episode_config, prepare_seed

    started = time.time()
    preset = "study_quick" if quick else "study"
    cfg, world, threads = prepare_seed(out, preset, overrides, seed, world_name="digit")
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    expert = expert_traces(world.rule_train, tokenizer, episode_config(cfg), out / "expert" / "traces.jsonl")
    cfg = study_config(cfg, expert, out / "world", seed, preset)
    run_pipeline(cfg, collect_tasks=world.rule_train, most_threads=threads)
    log.info("seed %d of the study finished in %.0f s", seed, time.time() - started)
    return Path(cfg.output_dir)


def study_config(cfg: PipelineConfig, expert: Path, world_dir: Path, seed: int, preset: str) -> PipelineConfig:
    """The demo pipeline ``cfg`` with the study's MoL and GRPO runs and its code-answer benchmark."""
    three = ["train.max_steps=-1", "train.epochs=3"]
    mol_runs = []
    for source, suffix in SOURCES.items():
        traces = [f"data.traces=[{expert},{','.join(cfg.general_traces)}]"] if source == "expert" else []
        for mode in LOSSES:
            monitor = [] if mode == "mol" else ["loss.monitor_kl=true"]
            mol_runs.append(MolRun(name=mode + suffix, overrides=[f"loss.mode={mode}", *monitor, *three, *traces]))
    mol_runs.append(MolRun(name=EPOCHS["1"], overrides=["loss.mode=mol", "train.max_steps=-1", "train.epochs=1"]))
    mol_runs.append(MolRun(name=EPOCHS["demo"], overrides=["loss.mode=mol"]))  # the section's max_steps
    rl_runs = [RlRun(name=f"{start}+grpo", start=start, overrides=["algorithm=grpo"]) for start in EPOCHS.values()]
    rl_runs.append(RlRun(name=ALGORITHMS["dr_grpo"], start=EPOCHS["demo"], overrides=["algorithm=dr_grpo"]))
    code_rl = [f"data.path={world_dir / 'code_rl_train.jsonl'}", "data.spec.kind=code",
               f"max_completion_length={CODE_TOKENS}"]
    for mode, name in REWARDS.items():
        rl_runs.append(RlRun(name=name, start=REWARD_START,
                             overrides=["algorithm=grpo", *code_rl, f"reward.code_mode={mode}"]))
    evaluation = dict(cfg.eval)
    evaluation["benchmarks"] = [*evaluation.get("benchmarks", []), CODE]
    evaluation["custom"] = {**evaluation.get("custom", {}), CODE: {"kind": "code"}}
    evaluation["data"] = {**evaluation.get("data", {}), CODE: str(world_dir / "code_heldout.jsonl")}
    return replace(cfg, mol_runs=mol_runs, rl_runs=rl_runs, eval=evaluation, eval_models=[],
                   title=f"molrl study ({preset} preset, seed {seed})")
