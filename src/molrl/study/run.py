"""``molrl demo --study``: the MoL-RL paper's ablations on a demo world, over seeds, in one report.

For each seed (world and training seed 0, 1, 2) in ``seed-N/``: the demo's world and base model, the base's
own traces (the collect stage) and an expert's traces in another style (``molrl.demo.expert``), then one
pipeline run with every arm below, then ``study.md`` over all seeds (``molrl.study.report``). Every step
skips what is already on disk (the world's base by its settings, each run by its ``DONE`` marker), so a killed
study continues where it stopped and a finished one only rebuilds its report. Arms that are the same run share
it: one world, base and trace set per seed, and the demo's own runs wherever an arm is the demo's.

The chain world (the default; ``molrl.study.arms.CHAIN``), on the demo's own world, base and settings
(``study`` preset: the ``default`` one), so ``mol``, ``mol+grpo`` and ``base+grpo`` are ``molrl demo``'s runs:

1. MoL vs CE vs CE on feedback only (``mol``, ``ce``, ``ce_feedback``, each again with ``-expert`` on the
   expert's traces), at the demo's MoL length (80 steps, about 4.7 epochs); every run logs its decision KL.
2. 0, 1 and 3 epochs of MoL and the demo's length (``base``, ``mol_1ep``, ``mol_3ep``, ``mol``), each followed
   by the demo's GRPO (``{run}+grpo``, 80 steps).
3. GRPO vs Dr.GRPO from ``mol`` (``mol+grpo``, ``mol+dr_grpo``).
4. Staged vs binary code reward: not run, the chain world has no code-answer family (the report says what it
   would need); the digit world's study has it.
5. The KL dose: MoL with ``loss.kl_weight`` 0, 0.1, 1 and 10 (``mol_kl0``, ``mol_kl0.1``, ``mol``, ``mol_kl10``).
6. GRPO from ``mol`` with ``loss.kl_weight`` 0, 0.05, 0.1 and 0.3 (``mol+grpo``, ``mol+grpo_dkl0.05``, ...).

11 MoL runs, 8 GRPO runs and 20 evaluations a seed. Measured on the 2-core VM: see docs/study.md.

The digit world (``--world digit``; ``molrl.study.arms.DIGIT``, the ``study`` preset of the digit
world's presets): claim 1 at 3 epochs each; claim 2 with ``mol_1ep``, ``mol`` (3 epochs) and ``mol_demo``;
claim 3 from ``mol_demo``; claim 4 with two GRPO runs on its code-answer problems (the staged code reward, no
code < compile error < runtime error < tests pass, against the binary one), evaluated on held-out code-answer
problems; every GRPO run 60 steps. The three seeds took 39 minutes on 2 shared cores.

An epoch is one pass over the domain traces (the 400 collected episodes, or the expert's 400); the general
replay traces are interleaved at one per three domain traces (``mol.data.domain_general_ratio``) and do not
count towards it, so one epoch is 533 sequences, 17 optimiser steps of 32.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

from molrl.cpu import govern_threads
from molrl.study.arms import (CHAIN, CHAIN_NO_REPLAY, CODE, CODE_TOKENS, DIGIT, LOSSES, NO_REPLAY, SOURCES,
                              WORLD_ARMS, StudyArms)
from molrl.errors import MolrlError
from molrl.pipeline import run_pipeline
from molrl.pipeline.config import MolRun, PipelineConfig, RlRun

log = logging.getLogger(__name__)


def run_study(out: str | Path, quick: bool = False, seeds: int = 3, overrides: list[str] | None = None,
              world: str = "chain", replay: bool = True) -> Path:
    """The study of ``world`` in ``out/seed-N`` for each seed and ``out/study.md`` over them; returns its path.

    ``replay=False``: the chain world's arms without the general replay (``CHAIN_NO_REPLAY``) and their report,
    ``out/study_no_replay.md``."""
    from molrl.study.no_replay import write_no_replay_report
    from molrl.study.report import write_study_report

    if seeds < 1:
        raise MolrlError(f"--seeds {seeds}: give 1 or more")
    if world not in WORLD_ARMS:
        raise MolrlError(f"--study --world {world}: the study runs on {' or '.join(WORLD_ARMS)}")
    if not replay and world != "chain":
        raise MolrlError(f"--study --no-replay runs on the chain world, not --world {world}")
    out = Path(out)
    started = time.time()
    try:
        run_dirs = [run_seed(out / f"seed-{seed}", quick, overrides, seed, world, replay) for seed in range(seeds)]
    finally:
        govern_threads(None)
    if not replay:
        report = write_no_replay_report(run_dirs, out, CHAIN_NO_REPLAY, wall_s=time.time() - started)
    else:
        report = write_study_report(run_dirs, out, WORLD_ARMS[world], wall_s=time.time() - started)
    log.info("study finished in %.0f s: %s", time.time() - started, report)
    return report


def run_seed(out: Path, quick: bool, overrides: list[str] | None, seed: int, world: str = "chain",
             replay: bool = True) -> Path:
    """Every run of ``world``'s study for one seed (``replay=False``: the arms without the general replay); returns
    its pipeline directory."""
    from transformers import AutoTokenizer

    from molrl.demo.expert import ChainExpert, StyledExpert, expert_traces
    from molrl.demo.run import episode_config, prepare_seed

    started = time.time()
    preset = "study_quick" if quick else "study"
    cfg, built, threads = prepare_seed(out, preset, overrides, seed, world_name=world)
    if not replay:
        cfg = no_replay_config(cfg, out / "world", seed, preset)
        run_pipeline(cfg, collect_tasks=built.rule_train, most_threads=threads)
        log.info("seed %d of the study without replay finished in %.0f s", seed, time.time() - started)
        return Path(cfg.output_dir)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    expert = expert_traces(built.rule_train, tokenizer, episode_config(cfg), out / "expert" / "traces.jsonl",
                           expert=ChainExpert() if world == "chain" else StyledExpert())
    if world == "chain":
        cfg = chain_study_config(cfg, expert, seed, preset)
    else:
        cfg = digit_study_config(cfg, expert, out / "world", seed, preset)
    run_pipeline(cfg, collect_tasks=built.rule_train, most_threads=threads)
    log.info("seed %d of the study finished in %.0f s", seed, time.time() - started)
    return Path(cfg.output_dir)


def loss_runs(cfg: PipelineConfig, expert: Path, length: list[str]) -> list[MolRun]:
    """Claim 1: each loss on the base's own traces and on the expert's (``-expert``), ``length`` overrides each."""
    runs = []
    for source, suffix in SOURCES.items():
        traces = [f"data.traces=[{expert},{','.join(cfg.general_traces)}]"] if source == "expert" else []
        for mode in LOSSES:
            monitor = [] if mode == "mol" else ["loss.monitor_kl=true"]
            runs.append(MolRun(name=mode + suffix, overrides=[f"loss.mode={mode}", *monitor, *length, *traces]))
    return runs


def epoch_overrides(epochs: str) -> list[str]:
    """A MoL run of ``epochs`` passes over the domain traces (``demo``: the section's own ``max_steps``)."""
    return [] if epochs == "demo" else ["train.max_steps=-1", f"train.epochs={epochs}"]


def chain_study_config(cfg: PipelineConfig, expert: Path, seed: int, preset: str, arms: StudyArms = CHAIN
                       ) -> PipelineConfig:
    """The chain demo's pipeline ``cfg`` with every arm of ``arms``; the demo's own runs keep their names and
    overrides (``mol``: ``loss.mode=mol``; ``mol+grpo`` and ``base+grpo``: ``algorithm=grpo``)."""
    mol_runs = loss_runs(cfg, expert, [])
    for epochs, name in arms.epochs.items():
        if epochs not in ("0", "demo"):
            mol_runs.append(MolRun(name=name, overrides=["loss.mode=mol", *epoch_overrides(epochs)]))
    for weight, name in arms.kl_doses.items():
        if name not in {r.name for r in mol_runs}:
            mol_runs.append(MolRun(name=name, overrides=["loss.mode=mol", f"loss.kl_weight={weight:g}"]))
    rl_runs = [RlRun(name=f"{start}+grpo", start=start, overrides=["algorithm=grpo"]) for start in arms.epochs.values()]
    rl_runs.append(RlRun(name=arms.algorithms["dr_grpo"], start=arms.algorithm_start, overrides=["algorithm=dr_grpo"]))
    for weight, name in arms.rl_kl.items():
        if weight > 0:
            rl_runs.append(RlRun(name=name, start=arms.algorithm_start,
                                 overrides=["algorithm=grpo", f"loss.kl_weight={weight:g}"]))
    return replace(cfg, mol_runs=mol_runs, rl_runs=rl_runs, eval_models=[],
                   title=f"molrl study ({preset} preset, chain world, seed {seed})")


def digit_study_config(cfg: PipelineConfig, expert: Path, world_dir: Path, seed: int, preset: str,
                       arms: StudyArms = DIGIT) -> PipelineConfig:
    """The digit demo's pipeline ``cfg`` with the study's MoL and GRPO runs and its code-answer benchmark."""
    mol_runs = loss_runs(cfg, expert, epoch_overrides("3"))
    mol_runs.append(MolRun(name=arms.epochs["1"], overrides=["loss.mode=mol", *epoch_overrides("1")]))
    mol_runs.append(MolRun(name=arms.epochs["demo"], overrides=["loss.mode=mol"]))  # the section's max_steps
    rl_runs = [RlRun(name=f"{start}+grpo", start=start, overrides=["algorithm=grpo"]) for start in arms.epochs.values()]
    rl_runs.append(RlRun(name=arms.algorithms["dr_grpo"], start=arms.algorithm_start, overrides=["algorithm=dr_grpo"]))
    code_rl = [f"data.path={world_dir / 'code_rl_train.jsonl'}", "data.spec.kind=code",
               f"sampling.max_new_tokens={CODE_TOKENS}"]
    for mode, name in arms.rewards.items():
        rl_runs.append(RlRun(name=name, start=arms.algorithm_start,
                             overrides=["algorithm=grpo", *code_rl, f"reward.code_mode={mode}"]))
    evaluation = dict(cfg.eval)
    evaluation["benchmarks"] = [*evaluation.get("benchmarks", []), CODE]
    evaluation["data"] = {**evaluation.get("data", {}),
                          CODE: {"path": str(world_dir / "code_heldout.jsonl"), "spec": {"kind": "code"}}}
    return replace(cfg, mol_runs=mol_runs, rl_runs=rl_runs, eval=evaluation, eval_models=[],
                   title=f"molrl study ({preset} preset, seed {seed})")


def no_replay_config(cfg: PipelineConfig, world_dir: Path, seed: int, preset: str,
                     arms: StudyArms = CHAIN_NO_REPLAY) -> PipelineConfig:
    """The chain demo's pipeline ``cfg`` with ``arms``' runs: every MoL run on the base's own collected traces alone
    (``general_traces`` emptied), every GRPO run from ``arms.algorithm_start`` on the rule problems alone, in
    ``arms.rl_adapter_mode``."""
    from molrl.demo.run import RULE_ONLY

    mol_runs = []
    for mode in LOSSES:
        monitor = [] if mode == "mol" else ["loss.monitor_kl=true"]
        mol_runs.append(MolRun(name=mode + NO_REPLAY, overrides=[f"loss.mode={mode}", *monitor]))
    for weight, name in arms.kl_doses.items():
        if name not in {r.name for r in mol_runs}:
            mol_runs.append(MolRun(name=name, overrides=["loss.mode=mol", f"loss.kl_weight={weight:g}"]))
    rule_only = [f"data.path={world_dir / RULE_ONLY}", f"model.adapter_mode={arms.rl_adapter_mode}"]
    if arms.rl_adapter_mode == "merge_new":  # rl.beta's KL then also to the MoL model, as the decision KL's
        rule_only.append("model.reference=mol")
    rl_runs = [RlRun(name=name, start=arms.algorithm_start,
                     overrides=["algorithm=grpo", *rule_only, *([f"loss.kl_weight={w:g}"] if w > 0 else [])])
               for w, name in arms.rl_kl.items()]
    return replace(cfg, mol_runs=mol_runs, rl_runs=rl_runs, eval_models=[], general_traces=[],
                   title=f"molrl study without the general replay ({preset} preset, chain world, seed {seed})")
