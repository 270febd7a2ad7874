"""The pretrained headline at the MoL-RL paper's settings: SmolLM2-135M-Instruct on the chain world, over seeds.

The pre-registered primary claim: MoL + GRPO reaches more held-out chains than the same GRPO from the base
(greedy held-out pass@1, ``mol+grpo`` minus ``base+grpo``, paired by seed). Secondary claims: more MoL helps a
pretrained model (``mol``, MoL at the toy world's length, minus ``mol_short``, the earlier headline's MoL), and GRPO
from MoL adds to MoL or erases it (``mol+grpo`` minus ``mol``).

Each seed is ``molrl demo --model``'s seed (``molrl.demo.run.prepare_seed``: its chain world, the model warmed up
once on the world's formats, then the base's own 200 traces collected in the sandbox), with the pipeline's runs set
to the paper's settings:

- MoL at the toy world's length. ``molrl demo``'s chain world trains MoL 80 steps of 32 sequences on its 400 own
  traces and their general replay at 3:1 (400 + 133 = 533 sequences a pass): 2560 / 533 = 4.8 passes. Here a pass is
  the 200 own traces and 66 replayed ones (266 sequences) and a step is 16 sequences, so 80 steps (1280 sequences)
  are 4.8 passes; the earlier headline's 32 steps (``mol_short``, for the secondary claim) were 1.9.
- GRPO from that MoL model and from the base: groups of 8 samples at temperature 0.9, 2 prompts a step (16
  samples), learning rate 1e-4, 24 steps, the same KL (0.05) to the base as before.
- greedy evaluation of every model on the seed's 200 held-out and 100 general problems less those the warmed-up
  base was trained on, known by content (``molrl.demo.pretrained_base.unseen_by``: 183 and 97 on seed 0), the rule
  probe of every model (``benchmarks/rule_probe.py``), and accuracy per chain step from the stored answers
  (``molrl.study.headline.step_accuracy``).

Seeds: 3, then up to ``--max-seeds`` (5) while the primary claim is undecided.

    python benchmarks/headline_paper.py --model runs/smollm2/model                # the seeds, then the report
    python benchmarks/headline_paper.py --model runs/smollm2/model --seed 0       # one seed alone, no report
    python benchmarks/headline_paper.py --model runs/smollm2/model --seed 0 --primary-only   # its primary arms
    python benchmarks/headline_paper.py --model runs/smollm2/model --seed 0 --control   # + GRPO from mol_short
    python benchmarks/headline_paper.py --model DIR --quick --out runs/headline_paper_quick  # every stage (minutes)

Resumable: a seed is a ``molrl demo --model`` seed directory (seed 0 in OUT, seed N in OUT/seed-N) whose finished
warm-up, world, stages and probes are reused, and a kill at any point resumes there. Per seed the primary arms run
first (MoL, both GRPO runs, their evaluations and probes), then ``mol_short``. OUT/timings.json keeps each stage's
seconds per seed (read from the stages' DONE markers: a resumed stage counts its last run), the warm-up's and the
report's; the report is OUT/headline.md with OUT/plots/headline.png. ``--control`` adds the same GRPO from ``mol_short``
(``mol_short+grpo``), which tells MoL's length from GRPO's settings; the report shows it once every seed has it.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Sequence

from headline_code import record_seconds  # the same timings file, read again before each write
from rule_probe import probe_run, table  # what each model knows of f, read without generating

from molrl.cli import setup_logging
from molrl.demo.seeds import cell
from molrl.pipeline import DONE, run_pipeline
from molrl.pipeline.config import MolRun, RlRun
from molrl.study.claims import ACCURACY, Claim
from molrl.study.headline import paired_accuracy_claim, seed_dirs, step_accuracy, write_headline
from molrl.study.metrics import scorer
from molrl.study.verdict import CLAIM_LINE, claim_line

PAPER = ["mol.train.max_steps=80", "rl.sampling.n=8", "rl.sampling.temperature=0.9", "rl.prompts_per_step=2",
         "rl.train.learning_rate=1e-4", "rl.train.max_steps=24", "rl.train.micro_batch_size=16",
         "mol.train.save_steps=8", "rl.train.save_steps=6"]
"""The paper's settings over ``configs/pipeline_pretrained.yaml``: MoL at the toy world's 4.8 passes, GRPO in groups
of 8 at temperature 0.9 and learning rate 1e-4, 16 samples a step; a checkpoint every 8 MoL and 6 GRPO steps, so a
kill loses minutes, not a stage (the config's 50 saved nothing in a run of 80 or 24; how often a run saves is not
part of what it is, ``molrl.records.rerun.HARMLESS``, so finished runs are reused)."""
SHORT_STEPS = 32
"""The earlier headline's MoL steps (1.9 passes): ``mol_short``."""
QUICK = ["mol.train.max_steps=2", "rl.train.max_steps=1", "rl.train.micro_batch_size=8"]
"""--quick: the quick preset's world and warm-up, two MoL steps (``mol_short`` one), one GRPO step."""
MORE_MOL = Claim("More MoL helps a pretrained model (4.8 passes against 1.9)", "held-out, mol − mol_short", ACCURACY)
"""The secondary claim on MoL's length (the other, GRPO from MoL against MoL, is the headline's ``grpo_adds``)."""
STEP_CLAIMS = {
    ("mol+grpo", "base+grpo", "all"): Claim("MoL + GRPO gets more chain steps right than GRPO alone",
                                            "every step, mol+grpo − base+grpo", ACCURACY),
    ("mol", "base", "all"): Claim("MoL gets more chain steps right than the base", "every step, mol − base",
                                  ACCURACY),
    ("mol", "base", "first"): Claim("MoL gets more first steps (three-digit inputs) right than the base",
                                    "first step, mol − base", ACCURACY)}
"""The per-step claims: (side, other, which steps) -> claim."""
SEEDS, MAX_SEEDS = 3, 5
"""Seeds first run, and the most run while the primary claim is undecided."""
CONTROL = "mol_short+grpo"
"""The control (``--control``): the same GRPO from ``mol_short``, to tell MoL's length from GRPO's settings."""
LENGTH_AFTER_GRPO = Claim("GRPO from the longer MoL reaches more (4.8 passes against 1.9, then the same GRPO)",
                          "held-out, mol+grpo − mol_short+grpo", ACCURACY)
"""The control's claim: whether MoL's length still matters once the same GRPO has run from each."""
STEP_MODELS = ("base", "base+grpo", "mol_short", "mol", "mol+grpo")
"""The models of the per-step table, in its order."""
INTRO = ("`{model}` is warmed up once on the chain world's formats (as `molrl demo --model` does): that is the base. "
         "Each seed builds its chain world, collects the base's own traces in the sandbox, trains MoL on them for 80 "
         "steps of 16 (4.8 passes, the toy world's length; `mol_short`: the earlier headline's 32 steps, 1.9 "
         "passes), runs the same GRPO from the MoL model and from the base (groups of 8 at temperature 0.9, 2 "
         "prompts a step, learning rate 1e-4, 24 steps, KL 0.05 to the base), and evaluates greedily in a single "
         "step without feedback: held-out rule problems (n = {n_held} a seed, drawn in each seed's own world) and "
         "general problems (n = {n_general} a seed). The primary claim is MoL + GRPO against GRPO alone, "
         "held-out.")
"""The report's description of the runs (``{model}``, ``{n_held}``, ``{n_general}`` filled in)."""
log = logging.getLogger("headline_paper")


def seed_dir(out: Path, seed: int) -> Path:
    """Seed ``seed``'s demo directory (world/, pipeline/; seed 0's holds the shared warmed-up base/)."""
    return seed_dirs(out, seed + 1)[seed].parent


def run_seed(out: Path, seed: int, model: str, quick: bool, secondary: bool = True, control: bool = False) -> None:
    """One seed's runs (finished ones reused): the primary arms and their probes, then ``mol_short`` and its probe,
    then with ``control`` the same GRPO from ``mol_short`` (``CONTROL``); each stage's seconds go to
    OUT/timings.json."""
    from molrl.cpu import govern_threads
    from molrl.demo.run import prepare_seed

    short = ["train.max_steps=1" if quick else f"train.max_steps={SHORT_STEPS}"]
    phases = [[MolRun("mol", ["loss.mode=mol"])]]
    if secondary:
        phases.append([*phases[0], MolRun("mol_short", ["loss.mode=mol", *short])])
    run, overrides = seed_dir(out, seed), [*PAPER, *(QUICK if quick else [])]
    try:
        for mol_runs in phases:
            cfg, world, threads = prepare_seed(run, "quick" if quick else "default", overrides, seed, model=model)
            cfg.mol_runs = mol_runs
            cfg.rl_runs = [RlRun("mol+grpo", "mol", ["algorithm=grpo"]),
                           RlRun("base+grpo", "base", ["algorithm=grpo"])]
            if control and any(r.name == "mol_short" for r in mol_runs):
                cfg.rl_runs.append(RlRun(CONTROL, "mol_short", ["algorithm=grpo"]))
            run_pipeline(cfg, collect_tasks=world.rule_train, most_threads=threads)
            started = time.time()
            probed = probe_missing(run, ["base", *(r.name for r in mol_runs), *(r.name for r in cfg.rl_runs)])
            probe_time = {f"rule probe/{','.join(probed)}": time.time() - started} if probed else {}
            record_seconds(out / "timings.json", str(seed), {**stage_seconds(run / "pipeline"), **probe_time})
    finally:
        govern_threads(None)


def probe_missing(run: Path, models: Sequence[str]) -> list[str]:
    """Probe the models of ``models`` not yet in RUN/pipeline/rule_probe.json; returns the ones probed."""
    found = run / "pipeline" / "rule_probe.json"
    missing = [m for m in models if m not in (json.loads(found.read_text()) if found.is_file() else {})]
    if missing:
        probe_run(run, missing)
    return missing


def stage_seconds(pipeline: Path) -> dict[str, float]:
    """Each finished stage's seconds in a pipeline directory, from its DONE marker (collect, mol/RUN, rl/RUN,
    eval/MODEL)."""
    markers = [pipeline / "collect" / DONE, *sorted(pipeline.glob(f"*/*/{DONE}"))]
    return {str(m.parent.relative_to(pipeline)): float(json.loads(m.read_text())["seconds"])
            for m in markers if m.is_file()}


def primary_verdict(text: str) -> str:
    """The verdict of the report's pre-registered primary claim, as its line in ``text`` says it."""
    found = [m.group(3) for m in map(CLAIM_LINE.match, text.splitlines()) if m and m.group(1)]
    if len(found) != 1:
        raise SystemExit(f"the report names {len(found)} primary claims; expected one")
    return found[0]


def seed_count(out: Path, model: str, quick: bool, first: int, most: int) -> Path:
    """Run seeds 0..``first``-1 and report, then one more seed at a time up to ``most`` while the report's primary
    claim is undecided; returns the last report's path."""
    for seed in range(first):
        run_seed(out, seed, model, quick)
    path, seeds = report(out, first, model), first
    while seeds < most and primary_verdict(path.read_text()) == "undecided":
        run_seed(out, seeds, model, quick)
        seeds += 1
        path = report(out, seeds, model)
    return path


def step_lines(out: Path, seeds: int) -> list[str]:
    """Accuracy per chain step of each model's greedy held-out answers over seeds, and the primary pair's claims on
    it: a step is right when it applies f rightly to the input it should (``molrl.study.headline.step_marks``)."""
    runs = [seed_dir(out, s) for s in range(seeds)]
    keys = [json.loads((r / "world" / "world.json").read_text())["key"] for r in runs]
    by = {m: [step_accuracy(r / "pipeline", m, k) for r, k in zip(runs, keys)] for m in STEP_MODELS}

    def share(counts: dict[int, tuple[int, int]], ranks: range) -> float:
        right, total = (sum(counts.get(r, (0, 0))[i] for r in ranks) for i in (0, 1))
        return right / max(total, 1)
    first, later, every = range(1, 2), range(2, 100), range(1, 100)
    shares = {m: {name: [share(c, ranks) for c in by[m]] for name, ranks in
                  (("first", first), ("later", later), ("all", every))} for m in STEP_MODELS}
    steps = [sum(t for _, t in c.values()) for c in by["base"]]
    lines = ["Accuracy per chain step of the greedy held-out answers: a step is right when it applies f rightly to "
             "the input it should (the question's start, then the answer's own previous value), so one wrong step "
             f"costs that step alone; steps a seed: {', '.join(map(str, steps))}. Mean ± s.e. over seeds [per seed].",
             "", "| model | first step (three-digit input) | later steps (one-digit input) | every step |",
             "|---|---|---|---|"]
    lines += [f"| `{m}` | {cell(s['first'])} | {cell(s['later'])} | {cell(s['all'])} |" for m, s in shares.items()]
    lines += ["", *(claim_line(claim, shares[side][steps], shares[other][steps])
                    for (side, other, steps), claim in STEP_CLAIMS.items())]
    return lines


def secondary_lines(out: Path, seeds: int) -> list[str]:
    """``mol_short``'s scores, and the secondary claim that more MoL helps."""
    run_dirs = seed_dirs(out, seeds)
    score = scorer(run_dirs)

    def scored(what: str, model: str) -> str:
        return f"{what}: held-out {cell(score(model, 'heldout'))}, general {cell(score(model, 'general'))}."

    lines = [scored("The earlier headline's MoL (`mol_short`, 32 steps, 1.9 passes)", "mol_short"), "",
             paired_accuracy_claim(MORE_MOL, run_dirs, score, "mol", "mol_short", "heldout")]
    if all((d / "eval" / CONTROL / DONE).is_file() for d in run_dirs):
        lines += ["", scored(f"The control, the same GRPO from `mol_short` (`{CONTROL}`)", CONTROL), "",
                  paired_accuracy_claim(LENGTH_AFTER_GRPO, run_dirs, score, "mol+grpo", CONTROL, "heldout")]
    return lines


def probe_lines(out: Path, seeds: int) -> list[str]:
    """The rule probe of every model on every seed (``benchmarks/rule_probe.py``)."""
    lines = ["What each model knows of f, read from its next-token distribution without generating "
             "(`benchmarks/rule_probe.py`; P(true value) among the ten digits, 0.1 a guess), per seed:", ""]
    for seed in range(seeds):
        found = json.loads((seed_dir(out, seed) / "pipeline" / "rule_probe.json").read_text())
        lines += [f"Seed {seed}:", "", *table({m: found[m] for m in STEP_MODELS if m in found}), ""]
    return lines


def time_lines(out: Path) -> list[str]:
    """Each seed's stage minutes and the warm-up's, from OUT/timings.json and the base's timing.json."""
    timings = json.loads((out / "timings.json").read_text())
    warm = out / "base" / "timing.json"
    lines = [f"Machine time: warm-up {json.loads(warm.read_text())['seconds'] / 60:.1f} min (once)" if warm.is_file()
             else "Machine time:"]
    for key, stages in timings.items():
        total = sum(stages.values()) / 60
        lines.append(f"- {'seed ' + key if key.isdigit() else key}: {total:.1f} min ("
                     + ", ".join(f"{k} {v / 60:.1f}" for k, v in stages.items()) + ")")
    return lines


def report(out: Path, seeds: int, model: str) -> Path:
    """OUT/headline.md over ``seeds`` seeds: the headline's table and claims (the primary claim first), then the
    secondary claims, the per-step table, the rule probe and the machine time."""
    started = time.time()
    extra = [*secondary_lines(out, seeds), "", *step_lines(out, seeds), "", *probe_lines(out, seeds)]
    path = write_headline(out, seeds, model, task="chain world at the paper's settings", intro=INTRO, extra=extra)
    record_seconds(out / "timings.json", "report", {"general KL and report": time.time() - started})
    with path.open("a") as fh:
        fh.write("\n".join(["", *time_lines(out), ""]))
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the pretrained chat model as a transformers directory")
    p.add_argument("--out", default="runs/headline_paper")
    p.add_argument("--seeds", type=int, default=SEEDS, help="seeds run first")
    p.add_argument("--max-seeds", type=int, default=MAX_SEEDS, help="most seeds while the primary is undecided")
    p.add_argument("--seed", type=int, action="append", default=None,
                   help="run only this seed (repeatable; no report)")
    p.add_argument("--primary-only", action="store_true", help="with --seed: the primary arms only, not mol_short")
    p.add_argument("--control", action="store_true",
                   help="with --seed: also the same GRPO from mol_short, to tell MoL's length from GRPO's settings")
    p.add_argument("--quick", action="store_true", help="the quick world and warm-up, 1-2 steps a stage, 2 seeds")
    args = p.parse_args()
    setup_logging()
    out = Path(args.out)
    if args.seed is not None:
        for seed in args.seed:
            run_seed(out, seed, args.model, args.quick, secondary=not args.primary_only, control=args.control)
        return
    first, most = (2, 2) if args.quick else (args.seeds, max(args.seeds, args.max_seeds))
    print(seed_count(out, args.model, args.quick, first, most).read_text())


if __name__ == "__main__":
    main()
