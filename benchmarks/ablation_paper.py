"""The MoL-RL paper's first experiment on a pretrained model: MoL against CE before the same GRPO.

SmolLM2-135M-Instruct on the chain world, at the pretrained headline's settings (``headline_paper.PAPER``: its
warm-up, worlds, problems, MoL of 80 steps and GRPO of 24). Arms per seed:

==================  ==========================================================================================
arm                 what it is
==================  ==========================================================================================
base                the warmed-up base
mol, mol+grpo       MoL (CE on feedback + KL to the base on decisions), then GRPO continuing its adapter
ce, ce+grpo         CE on every trace token (decisions and feedback), then the same GRPO
ce_feedback(+grpo)  CE on feedback tokens only, no KL, then the same GRPO
base+grpo           the same GRPO from the base (a fresh LoRA), 24 steps
base+grpo_long      GRPO from the base for 104 steps: as many optimiser steps as MoL + GRPO took (80 + 24)
mol+grpo_fresh      GRPO with a fresh LoRA on the merged MoL model (``merge_new``): the adapter state of base+grpo
==================  ==========================================================================================

The claims are pre-registered in ``molrl.study.claims`` (``PRIMARY["ablation.md"]``) before any of these runs:
primary, ``mol+grpo`` − ``ce+grpo`` held-out (smallest effect 0.05, read both ways); secondary, forgetting of ``mol``
against ``ce`` (general accuracy, general KL, a general corpus's NLL), ``mol+grpo`` against ``ce_feedback+grpo``,
against ``base+grpo_long`` and against ``mol+grpo_fresh``, and the headline's own claim again. 3 seeds, then up to 5
while the primary is undecided, under the study's rule (``molrl.study.verdict``).

Every arm is scored greedily on the seed's held-out and general problems (those the warm-up saw left out), with the
rule probe (``rule_probe.py``), accuracy per chain step, general KL to the base on the base's greedy general answers
(``molrl.study.headline.forgetting``) and the NLL of a general corpus none of the runs trained on
(``molrl.study.corpus``: the first 100 MATH-500 solutions and HumanEval's 164 canonical solutions, from
``--corpus``).

**Phases.** A seed's arms run in phases that need nothing but the base and the seed's collected traces, so a phase
can run on another machine than the one before, and in any order (whichever runs first on a seed also evaluates and
measures the base, whose answers every phase's general KL reads):

- ``mol``: mol, mol+grpo, mol+grpo_fresh (and the base's evaluation);
- ``ce``: ce, ce+grpo;
- ``base``: base+grpo, base+grpo_long;
- ``ce_feedback``: ce_feedback, ce_feedback+grpo;
- ``replicate`` (``--replicate``, seed 0): the GRPO of ``mol+grpo`` again with another training seed, from the 80-step
  MoL and from the 32-step one (``mol_short``): does GRPO's take-off depend on the MoL checkpoint or on the run?
- ``grpo_replicate`` and ``ce_grpo_replicate`` (``--phase``, any seed): the GRPO of ``mol+grpo`` (``ce+grpo``) alone
  again with another training seed, from the same MoL (CE) model: whether a seed's score after GRPO follows its
  checkpoint or its run.

**Kept in the repository.** After each phase its evaluations (samples, results), training metrics, rule probe,
general KL, corpus NLL, stage seconds and the commit it ran at go under ``benchmarks/stored/ablation_paper/seed-N``,
and the warm-up's adapter under ``.../base``; ``runs/`` does not survive a new machine. A stored phase is never run
again. On a new machine the base is rebuilt by merging the stored warm-up adapter into the model (its fingerprint
checked against the stored one) and the seed's traces are restored, so later phases pair with earlier ones on the same
base and traces. Run with the same ``--out`` path as before (a stage's record names resolved paths).

    python benchmarks/ablation_paper.py --model runs/smollm2/model --out runs/ablation_paper   # seeds, report
    python benchmarks/ablation_paper.py --model M --out OUT --seed 0 --phase mol --phase ce         # some phases
    python benchmarks/ablation_paper.py --report          # the report from what is stored (no model needed)
    python benchmarks/ablation_paper.py --model DIR --quick --out runs/ablation_quick --store runs/ablation_store

The report is ``benchmarks/stored/ablation_paper/ablation.md``.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from headline_paper import PAPER, QUICK, SHORT_STEPS, primary_verdict, seed_dir, stage_seconds
from rule_probe import probe_run, table

from molrl.cli import setup_logging
from molrl.demo.seeds import cell
from molrl.logs.plots import metric_series
from molrl.pipeline import DONE, run_pipeline
from molrl.pipeline.config import MolRun, RlRun
from molrl.report import read_metrics
from molrl.study.claims import CLAIMS, is_primary
from molrl.study.headline import (model_label, paired_accuracy_claim, paired_problem_scores, problem_count,
                                  step_accuracy)
from molrl.study.metrics import quarter_rise, scorer
from molrl.study.verdict import RULE, claim_line, mcnemar_p, primary_note
from molrl.records.writes import write_bytes, write_text

REPO = Path(__file__).resolve().parent.parent
STORE = REPO / "benchmarks" / "stored" / "ablation_paper"
"""Where each finished phase's evaluations are kept, in the repository."""
GRPO = ["algorithm=grpo"]


def paper_steps(key: str) -> int:
    """The optimiser steps ``PAPER`` sets at ``key`` (``mol.train.max_steps``, ``rl.train.max_steps``)."""
    return int(next(o.split("=", 1)[1] for o in PAPER if o.startswith(key + "=")))


LONG_STEPS = paper_steps("mol.train.max_steps") + paper_steps("rl.train.max_steps")
"""GRPO steps of ``base+grpo_long``: MoL's optimiser steps and GRPO's (80 + 24), as ``mol+grpo`` took."""
REPLICATE_SEED = 1000
"""The training seed of the replicate GRPO runs (the seed's own is its number)."""
NO_KL_LOG = "loss.monitor_kl=false"
"""The CE arms skip the base forward that only logs their decision KL (general KL is measured after)."""


@dataclass(frozen=True)
class Phase:
    """Arms that run together: what MoL and RL runs they train and which models they evaluate and measure."""

    mol_runs: tuple[MolRun, ...]
    rl_runs: tuple[RlRun, ...]
    models: tuple[str, ...]


REPLICATE_GRPO = [*GRPO, f"train.seed={REPLICATE_SEED}"]
"""The replicate GRPO runs: the same GRPO under another training seed."""

PHASES: dict[str, Phase] = {
    "mol": Phase((MolRun("mol", ["loss.mode=mol"]),),
                 (RlRun("mol+grpo", "mol", GRPO), RlRun("mol+grpo_fresh", "mol", [*GRPO, "model.adapter_mode=merge_new"])),
                 ("base", "mol", "mol+grpo", "mol+grpo_fresh")),
    "ce": Phase((MolRun("ce", ["loss.mode=ce", NO_KL_LOG]),), (RlRun("ce+grpo", "ce", GRPO),), ("ce", "ce+grpo")),
    "base": Phase((), (RlRun("base+grpo", "base", GRPO),
                       RlRun("base+grpo_long", "base", [*GRPO, f"train.max_steps={LONG_STEPS}"])),
                  ("base+grpo", "base+grpo_long")),
    "ce_feedback": Phase((MolRun("ce_feedback", ["loss.mode=ce_feedback", NO_KL_LOG]),),
                         (RlRun("ce_feedback+grpo", "ce_feedback", GRPO),), ("ce_feedback", "ce_feedback+grpo")),
    "replicate": Phase((MolRun("mol", ["loss.mode=mol"]), MolRun("mol_short", ["loss.mode=mol",
                                                                               f"train.max_steps={SHORT_STEPS}"])),
                       (RlRun("mol+grpo_rep", "mol", REPLICATE_GRPO),
                        RlRun("mol_short+grpo", "mol_short", GRPO),
                        RlRun("mol_short+grpo_rep", "mol_short", REPLICATE_GRPO)),
                       ("mol_short", "mol+grpo_rep", "mol_short+grpo", "mol_short+grpo_rep")),
    "grpo_replicate": Phase((MolRun("mol", ["loss.mode=mol"]),),
                            (RlRun("mol+grpo_rep", "mol", REPLICATE_GRPO),),
                            ("mol+grpo_rep",)),
    "ce_grpo_replicate": Phase((MolRun("ce", ["loss.mode=ce", NO_KL_LOG]),),
                               (RlRun("ce+grpo_rep", "ce", REPLICATE_GRPO),),
                               ("ce+grpo_rep",)),
}
"""Each seed's phases, in the order they run: the primary pair's first."""
ARM_PHASES = ("mol", "ce", "base", "ce_feedback")
"""The phases every seed runs (``replicate`` only on request)."""
QUICK_PHASE = {"base+grpo_long": ["train.max_steps=2"], "mol_short": ["train.max_steps=1"]}
"""--quick: the runs whose own step count is set shortened further."""
MODELS = ("base", "mol", "ce", "ce_feedback", "mol+grpo", "ce+grpo", "ce_feedback+grpo", "base+grpo",
          "base+grpo_long", "mol+grpo_fresh")
"""The report's models, in its order."""
SEEDS, MAX_SEEDS = 3, 5
MEASURES = ("rule_probe.json", "forgetting.json", "corpus_nll.json")
"""The measures each seed keeps beside its evaluations, per model."""
CORPUS_MATH, CORPUS_MAX_TOKENS = 100, 256
"""The corpus's MATH-500 rows (the file's first) and each answer's most tokens."""
log = logging.getLogger("ablation_paper")


def repo_commit(repo: Path) -> str:
    """``repo``'s commit now, with ``+dirty`` when its tracked files differ from it."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo, capture_output=True,
                           text=True).stdout.strip()
    return head + ("+dirty" if dirty else "")


@functools.cache
def commit() -> str:
    """The commit of the code this process loaded, read once (the command line reads it as the process starts): a
    phase that finishes after the checkout has moved on names the code that ran it, not the checkout's commit then."""
    return repo_commit(REPO)


def with_quick(phase: Phase, quick: bool) -> Phase:
    """``phase`` with the runs of ``QUICK_PHASE`` shortened under --quick."""
    if not quick:
        return phase
    short = lambda name, o: [*o, *QUICK_PHASE.get(name, [])]  # noqa: E731
    return Phase(tuple(MolRun(r.name, short(r.name, r.overrides)) for r in phase.mol_runs),
                 tuple(RlRun(r.name, r.start, short(r.name, r.overrides)) for r in phase.rl_runs), phase.models)


# ---- the store: what survives a machine ----------------------------------------------------------------------------

def stored_phases(store: Path, seed: int) -> dict[str, dict]:
    """The phases of ``seed`` kept in ``store``, by name, each with its record (commit, seconds, base, machine)."""
    found = store / f"seed-{seed}" / "phases.json"
    return json.loads(found.read_text()) if found.is_file() else {}


def base_fingerprint(base_dir: Path) -> str:
    """The warmed-up base's fingerprint: its top-level files (weights, config, tokenizer, provenance), not the
    ``warm_up/`` record of how it was made (its traces and training run, which a rebuilt base does not hold)."""
    import hashlib

    from molrl.records.fingerprint import fingerprint

    files = sorted(f for f in base_dir.iterdir() if f.is_file() and not f.name.startswith("."))
    return hashlib.sha256("".join(f"{f.name}\0{fingerprint(f)}\n" for f in files).encode()).hexdigest()


def keep_base(out: Path, store: Path) -> None:
    """Keep the warm-up's adapter and the base's fingerprint in ``store/base`` (once)."""
    base = out / "base"
    if (store / "base" / "base.json").is_file() or not (base / DONE).is_file():
        return
    target = store / "base"
    shutil.copytree(base / "warm_up" / "run" / "adapter", target / "adapter", dirs_exist_ok=True)
    shutil.copy2(base / DONE, target / "made_of.json")
    shutil.copy2(base / "timing.json", target / "timing.json")
    shutil.copy2(base / "molrl_provenance.json", target / "molrl_provenance.json")  # dated: the rebuilt base takes it
    write_text(target / "base.json", json.dumps({"fingerprint": base_fingerprint(base), "commit": commit()}, indent=1))


def restore_base(out: Path, store: Path, model: str) -> None:
    """Rebuild the warmed-up base in OUT/base from the stored warm-up adapter, when it is not there; refuse a rebuilt
    base whose fingerprint differs from the stored one (the phases already stored ran on that base)."""
    from molrl.engines.export import merge_adapter

    base, kept = out / "base", store / "base"
    if (base / DONE).is_file() or not (kept / "base.json").is_file():
        return
    made_from = json.loads((kept / "made_of.json").read_text()).get("model")
    if made_from and made_from != str(Path(model).resolve()):  # the path is part of the base's record (its marker)
        raise SystemExit(f"{kept / 'made_of.json'}: the stored base was made from the model at {made_from}, and its "
                         f"fingerprint holds that path; put the same model there and pass --model {made_from} "
                         f"(not {model}), or start a new store (--store DIR)")
    log.info("rebuilding the warmed-up base in %s from the stored warm-up adapter %s", base, kept / "adapter")
    merge_adapter(kept / "adapter", base, base=model)
    shutil.copy2(kept / "molrl_provenance.json", base / "molrl_provenance.json")  # the same record, date included
    made_of = json.loads((kept / "made_of.json").read_text())
    made_of["model"] = str(Path(model).resolve())
    write_text(base / DONE, json.dumps(made_of))
    shutil.copy2(kept / "timing.json", base / "timing.json")
    check_base(out, store)


def check_base(out: Path, store: Path) -> None:
    """Refuse a base whose fingerprint differs from the one the stored phases ran on."""
    kept = store / "base" / "base.json"
    if not kept.is_file():
        return
    want, have = json.loads(kept.read_text())["fingerprint"], base_fingerprint(out / "base")
    if want != have:
        raise SystemExit(f"{out / 'base'}: its fingerprint {have[:12]} is not the stored phases' base {want[:12]} "
                         f"({kept}); the arms would not pair. Rebuild it from the stored adapter (delete {out / 'base'}) "
                         "or start a new store (--store DIR)")


def restore_seed(run: Path, store: Path, seed: int, phases: dict[str, Phase] | None = None,
                 measures: Sequence[str] = MEASURES) -> None:
    """Put what ``store`` keeps of ``seed`` into its run directory where it is missing: the collected traces (so the
    same traces are trained on) and the stored evaluations and ``measures`` of its stored ``phases`` (default this
    benchmark's; the base's answers, which the general KL of a later phase reads)."""
    kept = store / f"seed-{seed}" / "pipeline"
    if not kept.is_dir():
        return
    pipeline = run / "pipeline"
    traces = pipeline / "collect" / "traces.jsonl"
    if (kept / "collect" / "traces.jsonl").is_file() and not traces.is_file():
        # the traces alone: collect resumes on them with nothing left to do (its record names the base's folder,
        # whose warm-up record a rebuilt base does not hold)
        traces.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(kept / "collect" / "traces.jsonl", traces)
    for part in (f"eval/{p.name}" for p in sorted((kept / "eval").glob("*"))):
        if not (pipeline / part / DONE).is_file():
            shutil.copytree(kept / part, pipeline / part, dirs_exist_ok=True)
    stored = stored_models(store, seed, phases)
    for name in measures:
        if (kept / name).is_file():
            found = {m: v for m, v in json.loads((kept / name).read_text()).items() if m in stored}
            merged = {**found, **(json.loads((pipeline / name).read_text()) if (pipeline / name).is_file() else {})}
            write_text(pipeline / name, json.dumps(merged, indent=1))


def stored_models(store: Path, seed: int, phases: dict[str, Phase] | None = None) -> set[str]:
    """The models whose evaluations and measures ``store`` keeps for ``seed``: those of its whole stored phases."""
    return {m for p, rec in stored_phases(store, seed).items() for m in rec.get("models", (phases or PHASES)[p].models)}


def with_base(phase: Phase, stored: set[str]) -> Phase:
    """``phase``, evaluating and measuring the base too when it is not among the ``stored`` models (the seed's
    ``stored_models``): whichever phase of a seed runs first measures the base, whose answers the general KL of every
    phase reads."""
    if "base" in phase.models or "base" in stored:
        return phase
    return Phase(phase.mol_runs, phase.rl_runs, ("base", *phase.models))


def store_phase(out: Path, store: Path, seed: int, name: str, phase: Phase, seconds: dict[str, float],
                measures: Sequence[str] = MEASURES) -> None:
    """Keep phase ``name`` of ``seed`` in ``store``: its models' evaluations, its runs' metrics and resolved configs,
    its RL runs' sampled completions (gzipped), the seed's traces, world, its models' entries in ``measures``, and
    the phase's record (last, so a phase is stored only whole). Phases of one seed may run at once in separate run
    folders: each adds its own models' entries to the stored measures and its record to the seed's, under a lock,
    so neither drops the other's."""
    import fcntl

    (store / f"seed-{seed}").mkdir(parents=True, exist_ok=True)
    with open(store / f"seed-{seed}" / ".store.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _store_phase(out, store, seed, name, phase, seconds, measures)


def keep_samples(run: Path, metrics: Path, name: str) -> Path | None:
    """Keep an RL run's sampled completions (``run/completions.jsonl``: every rollout with its rewards, by step) as
    ``metrics/<name>.completions.jsonl.gz``, so what GRPO sampled can be counted again once the run folder is gone;
    gzip without a timestamp, so the same samples make the same file. Returns the kept file (None without samples)."""
    import gzip

    source = run / "completions.jsonl"
    if not source.is_file():
        return None
    target = metrics / f"{name}.completions.jsonl.gz"
    write_bytes(target, gzip.compress(source.read_bytes(), mtime=0))  # the writer makes the folder
    return target


def _store_phase(out: Path, store: Path, seed: int, name: str, phase: Phase, seconds: dict[str, float],
                 measures: Sequence[str]) -> None:
    run = seed_dir(out, seed)
    pipeline, kept = run / "pipeline", store / f"seed-{seed}" / "pipeline"
    for model in phase.models:
        shutil.copytree(pipeline / "eval" / model, kept / "eval" / model, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.lock", ".*"))
    for group, runs in (("mol", phase.mol_runs), ("rl", phase.rl_runs)):
        for r in runs:
            for source, target in (("metrics.jsonl", f"{r.name}.jsonl"), ("config.yaml", f"{r.name}.config.yaml")):
                if (pipeline / group / r.name / source).is_file():  # its metrics and its resolved settings
                    (kept / "metrics").mkdir(parents=True, exist_ok=True)
                    shutil.copy2(pipeline / group / r.name / source, kept / "metrics" / target)
    for r in phase.rl_runs:
        keep_samples(pipeline / "rl" / r.name, kept / "metrics", r.name)
    if not (kept / "collect" / DONE).is_file():
        shutil.copytree(pipeline / "collect", kept / "collect", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.lock", ".*"))
    (store / f"seed-{seed}" / "world").mkdir(parents=True, exist_ok=True)
    shutil.copy2(run / "world" / "world.json", store / f"seed-{seed}" / "world" / "world.json")
    for measure in measures:
        ours = {m: v for m, v in json.loads((pipeline / measure).read_text()).items() if m in phase.models}
        found = json.loads((kept / measure).read_text()) if (kept / measure).is_file() else {}
        write_text(kept / measure, json.dumps({**found, **ours}, indent=1))
    from molrl.pipeline import environment

    record = stored_phases(store, seed)
    record[name] = {"commit": commit(), "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "models": list(phase.models),
                    "base": base_fingerprint(out / "base"),
                    "cpu": environment()["cpu"], "cores": environment()["cores"], "host": platform.node(),
                    "seconds": seconds}
    write_text(store / f"seed-{seed}" / "phases.json", json.dumps(record, indent=1))


# ---- measures ------------------------------------------------------------------------------------------------------

def general_corpus(root: Path) -> list[tuple[str, str]]:
    """The general corpus: the first ``CORPUS_MATH`` MATH-500 problems with their solutions and HumanEval's problems
    with their canonical solutions, from ``root`` (MATH-500's test.jsonl and HumanEval.jsonl.gz under it)."""
    import gzip

    math_rows = [json.loads(line) for line in (root / "math500" / "test.jsonl").read_text().splitlines()]
    with gzip.open(root / "humaneval" / "HumanEval.jsonl.gz", "rt") as fh:
        code_rows = [json.loads(line) for line in fh]
    return ([(r["problem"], r["solution"]) for r in math_rows[:CORPUS_MATH]]
            + [(f"Complete this Python function.\n\n{r['prompt']}", r["prompt"] + r["canonical_solution"])
               for r in code_rows])


def measure_corpus(run: Path, models: Sequence[str], corpus: list[tuple[str, str]]) -> list[str]:
    """The corpus NLL per token of each of ``models`` not yet in RUN/pipeline/corpus_nll.json; returns those
    measured."""
    from molrl.models import load_model, load_tokenizer
    from molrl.pipeline import model_weights
    from molrl.pipeline.config import load_pipeline_config
    from molrl.study.corpus import answer_nll, mean_nll

    pipeline = run / "pipeline"
    found = pipeline / "corpus_nll.json"
    kept = json.loads(found.read_text()) if found.is_file() else {}
    todo = [m for m in models if m not in kept]
    if not todo:
        return []
    cfg = load_pipeline_config(pipeline / "config.yaml")
    tokenizer = load_tokenizer(cfg.model)
    for m in todo:
        path, adapter = model_weights(cfg, m, pipeline)
        total, count = answer_nll(load_model(path, adapter=adapter), tokenizer, corpus, CORPUS_MAX_TOKENS)
        kept[m] = {"nll": mean_nll(total, count), "tokens": count, "texts": len(corpus)}
        log.info("%s: general corpus NLL %.4f per token over %d tokens", m, kept[m]["nll"], count)
        write_text(found, json.dumps(kept, indent=1))
    return todo


def measure(run: Path, models: Sequence[str], corpus: list[tuple[str, str]]) -> dict[str, float]:
    """The rule probe, general KL and corpus NLL of ``models`` (each kept beside the run, measured once); returns
    the seconds each measure took."""
    from molrl.study.headline import forgetting

    seconds = {}
    started = time.time()
    found = run / "pipeline" / "rule_probe.json"
    missing = [m for m in models if m not in (json.loads(found.read_text()) if found.is_file() else {})]
    if missing:
        probe_run(run, missing)
    seconds["rule probe"], started = time.time() - started, time.time()
    forgetting(run / "pipeline", [m for m in models if m != "base"])
    seconds["general KL"], started = time.time() - started, time.time()
    measure_corpus(run, models, corpus)
    seconds["corpus NLL"] = time.time() - started
    return seconds


# ---- running -------------------------------------------------------------------------------------------------------

def run_phase(out: Path, store: Path, seed: int, name: str, model: str, corpus: list[tuple[str, str]],
              quick: bool) -> bool:
    """Run phase ``name`` of ``seed`` unless it is stored; store it once done. Returns whether it ran."""
    from molrl.demo.run import prepare_seed

    overrides = [*PAPER, *(QUICK if quick else [])]
    return run_stored_phase(out, store, seed, name, with_quick(PHASES[name], quick), model,
                            lambda run: prepare_seed(run, "quick" if quick else "default", overrides, seed, model=model),
                            lambda run, models: measure(run, models, corpus))


def run_stored_phase(out: Path, store: Path, seed: int, name: str, phase: Phase, model: str,
                     prepare: Callable[[Path], tuple], measure_models: Callable[[Path, Sequence[str]], dict],
                     phases: dict[str, Phase] | None = None, measures: Sequence[str] = MEASURES) -> bool:
    """Run ``phase`` (named ``name``) of ``seed`` unless ``store`` has it, then store it: the base rebuilt from the
    store where it is missing, the seed's stored traces and evaluations put back, ``prepare(run)`` (the seed's
    ``prepare_seed``: its pipeline config, world and threads), the phase's runs and evaluations, then
    ``measure_models(run, models)`` (the seconds of each measure it keeps in ``measures``). Returns whether it ran."""
    from molrl.cpu import govern_threads

    if name in stored_phases(store, seed):
        log.info("seed %d, phase %s: stored (%s), not run again", seed, name, stored_phases(store, seed)[name]["commit"])
        return False
    run = seed_dir(out, seed)
    restore_base(out, store, model)
    restore_seed(run, store, seed, phases, measures)
    done = stored_models(store, seed, phases)  # evaluated by a stored phase (the base): read back, not run again
    phase = with_base(phase, done)
    try:
        cfg, world, threads = prepare(run)
        keep_base(out, store)
        check_base(out, store)
        cfg.mol_runs, cfg.rl_runs = list(phase.mol_runs), list(phase.rl_runs)
        cfg.eval_models = [m for m in phase.models if m not in done]
        run_pipeline(cfg, collect_tasks=world.rule_train, most_threads=threads)
        earlier = {k for rec in stored_phases(store, seed).values() for k in rec["seconds"]}  # counted by a phase
        own = {"collect", *(f"mol/{r.name}" for r in phase.mol_runs), *(f"rl/{r.name}" for r in phase.rl_runs),
               *(f"eval/{m}" for m in phase.models)} - earlier
        seconds = {**{k: v for k, v in stage_seconds(run / "pipeline").items() if k in own},
                   **measure_models(run, phase.models)}
    finally:
        govern_threads(None)
    store_phase(out, store, seed, name, phase, {k: round(v, 1) for k, v in seconds.items()}, measures)
    log.info("seed %d, phase %s: stored in %s", seed, name, store / f"seed-{seed}")
    return True


def seeds_done(store: Path, phases: Sequence[str] = ARM_PHASES) -> int:
    """How many seeds, from 0 on, have every one of ``phases`` stored (default the arm phases)."""
    seed = 0
    while all(p in stored_phases(store, seed) for p in phases):
        seed += 1
    return seed


# ---- the report ----------------------------------------------------------------------------------------------------

def claim(key: str, run_dirs: Sequence[Path], score, side: str, other: str, bench: str = "heldout") -> str:
    return paired_accuracy_claim(CLAIMS[key], run_dirs, score, side, other, bench, is_primary("ablation.md", key))


def measured(run_dirs: Sequence[Path], file: str, model: str, field: str) -> list[float]:
    """``field`` of ``model`` in each seed's ``file`` (forgetting.json's general KL is 0 for the base itself)."""
    values = []
    for d in run_dirs:
        found = json.loads((d / file).read_text())
        values.append(0.0 if model == "base" and file == "forgetting.json" else float(found[model][field]))
    return values


def mcnemar_lines(run_dirs: Sequence[Path], pairs: Sequence[tuple[str, str]]) -> list[str]:
    """Per seed, the exact McNemar p-value of each pair on its held-out problems (greedy: a problem is right or not)."""
    lines = ["Per-seed exact McNemar tests (held-out problems, greedy; b: right on the first side alone, c: on the "
             "second alone):", "", "| pair | " + " | ".join(f"seed {i}" for i in range(len(run_dirs))) + " |",
             "|---|" + "---|" * len(run_dirs)]
    for side, other in pairs:
        cells = []
        for d in run_dirs:
            (a,), (b,) = paired_problem_scores([d], side, other, "heldout")
            only_a = sum(1 for i in a if a[i] > 0.5 and b.get(i, 0) <= 0.5)
            only_b = sum(1 for i in a if a[i] <= 0.5 and b.get(i, 0) > 0.5)
            cells.append(f"b {only_a}, c {only_b}, p {mcnemar_p(only_a, only_b):.2g}")
        lines.append(f"| `{side}` vs `{other}` | " + " | ".join(cells) + " |")
    return lines


def step_table(run_dirs: Sequence[Path], models: Sequence[str]) -> list[str]:
    """Accuracy per chain step of each model (first step, later steps, every step), mean ± s.e. [per seed]."""
    keys = [json.loads((d.parent / "world" / "world.json").read_text())["key"] for d in run_dirs]

    def share(counts: dict[int, tuple[int, int]], ranks: range) -> float:
        right, total = (sum(counts.get(r, (0, 0))[i] for r in ranks) for i in (0, 1))
        return right / max(total, 1)
    lines = ["| model | first step (three-digit input) | later steps (one-digit input) | every step |",
             "|---|---|---|---|"]
    for m in models:
        counts = [step_accuracy(d, m, k) for d, k in zip(run_dirs, keys)]
        lines.append(f"| `{m}` | " + " | ".join(cell([share(c, r) for c in counts]) for r in
                                                 (range(1, 2), range(2, 100), range(1, 100))) + " |")
    return lines


REPLICATE_ROWS = (("mol", "mol", "-"), ("mol", "mol+grpo", "0 (the seed's)"),
                  ("mol", "mol+grpo_rep", str(REPLICATE_SEED)), ("mol_short", "mol_short", "-"),
                  ("mol_short", "mol_short+grpo", "0 (the seed's)"),
                  ("mol_short", "mol_short+grpo_rep", str(REPLICATE_SEED)))
"""The replicate section's rows: (the MoL model GRPO started from, the model, GRPO's training seed or - for none)."""


def replicate_lines(store: Path) -> list[str]:
    """Seed 0's replicate phase once stored (none before): GRPO from the 80- and 32-step MoLs under two training
    seeds, each model's scores and measures beside its GRPO's training reward over the first and last quarters of its
    steps (mean ± s.e. over the steps): does GRPO's take-off follow the MoL checkpoint or the run?"""
    if "replicate" not in stored_phases(store, 0):
        return []
    run = store / "seed-0" / "pipeline"
    score = scorer([run])
    found = {f: json.loads((run / f).read_text()) for f in MEASURES}
    lines = ["Replicate, seed 0 (GRPO again from the same MoL models with another training seed; the MoL models "
             f"of {paper_steps('mol.train.max_steps')} and {SHORT_STEPS} steps; held-out n = "
             f"{problem_count(run, 'base', 'heldout')}, general n = {problem_count(run, 'base', 'general')}; one "
             "seed's problems: it says whether the take-off follows the checkpoint on this seed, not across seeds):",
             "", "| GRPO from | model | GRPO's training seed | held-out | general | general KL | corpus NLL | rule "
             "probe, one-digit / three-digit | training reward, first quarter → last quarter |",
             "|---|---|---|---|---|---|---|---|---|"]
    for start, model, train_seed in REPLICATE_ROWS:
        probe = found["rule_probe.json"][model]
        reward = "-" if model == start else reward_rise(run, model)
        lines.append(f"| `{start}` | `{model}` | {train_seed} | {score(model, 'heldout')[0]:.3f} | "
                     f"{score(model, 'general')[0]:.3f} | {found['forgetting.json'][model]['general_kl']:.4f} | "
                     f"{found['corpus_nll.json'][model]['nll']:.4f} | {probe['one_digit_p']:.3f} / "
                     f"{probe['three_digit_p']:.3f} | {reward} |")
    return [*lines, ""]


def report(store: Path, seeds: int) -> Path:
    """``store/ablation.md`` over the first ``seeds`` stored seeds: every arm's scores and measures, the primary claim
    and the secondary ones, the per-seed McNemar tests, the per-step table, the rule probe and the machine time."""
    run_dirs = [store / f"seed-{s}" / "pipeline" for s in range(seeds)]
    score = scorer(run_dirs)
    models = [m for m in MODELS if all((d / "eval" / m / "results.json").is_file() for d in run_dirs)]
    kl = {m: measured(run_dirs, "forgetting.json", m, "general_kl") for m in models}
    nll = {m: measured(run_dirs, "corpus_nll.json", m, "nll") for m in models}
    counts = {b: [problem_count(d, "base", b) for d in run_dirs] for b in ("heldout", "general")}
    made_of = store / "base" / "made_of.json"
    model = model_label(json.loads(made_of.read_text())["model"]) if made_of.is_file() else "?"
    lines = [f"# MoL against CE before the same GRPO: {model}, chain world ({seeds} seed{'s' * (seeds != 1)})", "",
             f"Each seed: the chain world's base (`{model}` warmed up once on the world's formats), its own "
             "200 traces collected in the sandbox, MoL / CE / CE on feedback for 80 steps of 16 sequences (4.8 "
             "passes), then the same GRPO (groups of 8 at temperature 0.9, 2 prompts a step, lr 1e-4, 24 steps, KL "
             "0.05 to the base). Greedy single-turn evaluation, no feedback: held-out rule problems (n = "
             + ", ".join(map(str, counts["heldout"])) + " on seeds 0-" + str(seeds - 1) + ") and general problems "
             "(n = " + ", ".join(map(str, counts["general"])) + "). General KL: KL(model || base) per token on the "
             "base's greedy general answers. Corpus NLL: per token, on 100 MATH-500 solutions and HumanEval's 164 "
             "canonical solutions, which no run trained on. In this world the sandbox prints f's values in the "
             "answer's own format, so CE on the feedback is close to supervised training on answers. A cell is mean ± "
             "s.e. over seeds [per seed].", "",
             "| model | held-out | general | general KL | corpus NLL |", "|---|---|---|---|---|"]
    for m in models:
        lines.append(f"| `{m}` | {cell(score(m, 'heldout'))} | {cell(score(m, 'general'))} | {cell(kl[m], 4)} | "
                     f"{cell(nll[m], 4)} |")
    lines += ["", "Verdicts compare paired per-seed differences d: " + RULE, ""]
    at = len(lines)
    have = set(models)
    if {"mol+grpo", "ce+grpo"} <= have:
        lines.append(claim("mol_over_ce_grpo", run_dirs, score, "mol+grpo", "ce+grpo"))
    if {"mol", "ce"} <= have:
        lines += [claim("ce_forgets_accuracy", run_dirs, score, "mol", "ce", "general"),
                  claim_line(CLAIMS["ce_moves_general"], kl["ce"], kl["mol"]),
                  claim_line(CLAIMS["ce_forgets_corpus"], nll["ce"], nll["mol"])]
    for key, other in (("mol_over_ce_feedback_grpo", "ce_feedback+grpo"), ("mol_over_long_grpo", "base+grpo_long"),
                       ("continue_over_fresh", "mol+grpo_fresh"), ("headline", "base+grpo")):
        if {"mol+grpo", other} <= have:
            lines.append(claim(key, run_dirs, score, "mol+grpo", other))
    if any(line.startswith("- **Primary: ") for line in lines):
        lines[at:at] = [primary_note(lines), ""]
    pairs = [(a, b) for a, b in (("mol+grpo", "ce+grpo"), ("mol+grpo", "base+grpo"),
                                 ("mol+grpo", "ce_feedback+grpo"), ("mol+grpo", "base+grpo_long"),
                                 ("mol+grpo", "mol+grpo_fresh")) if {a, b} <= have]
    lines += ["", *mcnemar_lines(run_dirs, pairs), "", "Accuracy per chain step (greedy held-out answers; a step is "
              "right when it applies f rightly to the input it should):", "", *step_table(run_dirs, models), "",
              "Rule probe (P(true value) among ten digits; 0.1 a guess), per seed:", ""]
    for s, d in enumerate(run_dirs):
        found = json.loads((d / "rule_probe.json").read_text())
        lines += [f"Seed {s}:", "", *table({m: found[m] for m in models if m in found}), ""]
    lines += [*replicate_lines(store), *grpo_replicate_lines(store, seeds), *phase_time_lines(store, seeds)]
    path = store / "ablation.md"
    write_text(path, "\n".join(lines) + "\n")
    return path


def phase_arguments(doc: str, out: str, store: Path, phases: list[str], quick: str) -> argparse.ArgumentParser:
    """The command line of a benchmark of stored phases: the model, where runs and the store go, which seeds and
    phases to run, the report alone, the seed counts and the quick sizes."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="the pretrained chat model as a transformers directory")
    p.add_argument("--out", default=out, help="where the runs go (keep it across machines)")
    p.add_argument("--store", type=Path, default=store, help="where finished phases are kept (in the repository)")
    p.add_argument("--seed", type=int, action="append", help="run only this seed (repeatable; no report)")
    p.add_argument("--phase", action="append", choices=phases, help="run only this phase (repeatable)")
    p.add_argument("--report", action="store_true", help="only build the report from the stored seeds")
    p.add_argument("--seeds", type=int, default=SEEDS)
    p.add_argument("--max-seeds", type=int, default=MAX_SEEDS)
    p.add_argument("--quick", action="store_true", help=quick)
    return p


def parse_phase_arguments(p: argparse.ArgumentParser, report: Callable[[Path, int], Path],
                          seeds_done: Callable[[Path], int]) -> argparse.Namespace | None:
    """The parsed command line of a benchmark of stored phases; with ``--report``, the report of the stored seeds
    printed and None (nothing to run); without it, ``--model`` required."""
    args = p.parse_args()
    setup_logging()
    commit()  # the code this process runs, before any phase can outlast a move of the checkout
    if args.report:
        seeds = seeds_done(args.store)
        if not seeds:
            held = ", ".join(stored_phases(args.store, 0)) or "none"
            p.error(f"no seed has every phase stored in {args.store} yet (seed 0 holds: {held}); run the phases "
                    "first, then --report")
        print(report(args.store, seeds).read_text())
        return None
    if not args.model:
        p.error("--model is needed to run phases")
    return args


def reward_rise(run: Path, model: str) -> str:
    """``model``'s GRPO training reward, first quarter → last quarter of its steps (± the s.e.), from stored metrics."""
    rewards = metric_series(read_metrics(run / "metrics" / f"{model}.jsonl"), "reward")[1]
    return "not logged" if not rewards else "{:.3f} → {:.3f} (± {:.3f})".format(*quarter_rise(rewards))


def grpo_replicate_lines(store: Path, seeds: int) -> list[str]:
    """Each of the first ``seeds`` seeds whose ``mol+grpo`` or ``ce+grpo`` GRPO ran again with another training seed
    (seed 0's ``replicate`` phase, any seed's ``grpo_replicate`` / ``ce_grpo_replicate``): each GRPO beside its
    replicate from the same model, with their training rewards ("-" where a replicate is not stored). Does a seed's
    score after GRPO follow the checkpoint GRPO started from, or the GRPO run?"""
    stored = {s: stored_models(store, s) for s in range(seeds)}
    found = [s for s in range(seeds) if {"mol+grpo_rep", "ce+grpo_rep"} & stored[s]]
    if not found:
        return []
    lines = [f"GRPO from the same model with two training seeds ({'seed' if len(found) == 1 else 'seeds'} "
             f"{', '.join(map(str, found))}; held-out, each seed's own "
             "problems; the first run's training seed is the seed's, the replicate's "
             f"{REPLICATE_SEED}; training reward: first quarter → last quarter of GRPO's steps, ± the s.e. over "
             "steps):", "", "| seed | from | before GRPO | GRPO | its reward | replicate | its reward |",
             "|---|---|---|---|---|---|---|"]
    for s in found:
        run = store / f"seed-{s}" / "pipeline"
        score = scorer([run])
        for start in ("mol", "ce"):
            rep = f"{start}+grpo_rep"
            again = (f"{score(rep, 'heldout')[0]:.3f} | {reward_rise(run, rep)}" if rep in stored[s] else "- | -")
            lines.append(f"| {s} | `{start}` | {score(start, 'heldout')[0]:.3f} | "
                         f"{score(f'{start}+grpo', 'heldout')[0]:.3f} | {reward_rise(run, f'{start}+grpo')} | "
                         f"{again} |")
    return [*lines, ""]


def phase_time_lines(store: Path, seeds: int) -> list[str]:
    """The report's machine time: each stored phase's minutes, commit, cores and stages."""
    lines = ["Phases and machine time (minutes; each phase's stages and measures, as the run that finished each timed "
             "it: work lost to a kill is not counted, and a measure finished before a kill counts 0 in the run that "
             "resumed it):", ""]
    for s in range(seeds):
        for name, rec in stored_phases(store, s).items():
            lines.append(f"- seed {s}, {name}: {sum(rec['seconds'].values()) / 60:.1f} min at {rec['commit'][:10]} "
                         f"on {rec['cores']} cores ({rec['finished']}; " + ", ".join(
                             f"{k} {v / 60:.1f}" for k, v in rec["seconds"].items()) + ")")
    return lines


def main() -> None:
    p = phase_arguments(__doc__, "runs/ablation_paper", STORE, list(PHASES), "the quick world and warm-up, 1-2 steps a stage")
    p.add_argument("--corpus", type=Path, default=REPO.parent / "shared" / "data",
                   help="the folder holding math500/test.jsonl and humaneval/HumanEval.jsonl.gz")
    p.add_argument("--replicate", action="store_true", help="also the replicate phase on seed 0")
    args = parse_phase_arguments(p, report, seeds_done)
    if args is None:
        return
    out, corpus = Path(args.out), general_corpus(args.corpus)
    phases = args.phase or list(ARM_PHASES)
    for seed in args.seed or range(args.seeds):
        for name in phases:
            run_phase(out, args.store, seed, name, args.model, corpus, args.quick)
        if args.replicate and seed == 0:
            run_phase(out, args.store, seed, "replicate", args.model, corpus, args.quick)
    if args.seed:
        return
    seeds = seeds_done(args.store)
    path = report(args.store, seeds)
    while seeds < args.max_seeds and primary_verdict(path.read_text()) == "undecided":
        for name in ARM_PHASES:
            run_phase(out, args.store, seeds, name, args.model, corpus, args.quick)
        seeds = seeds_done(args.store)
        path = report(args.store, seeds)
    print(path.read_text())


if __name__ == "__main__":
    main()
