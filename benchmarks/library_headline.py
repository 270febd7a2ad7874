"""The library world's headline on a pretrained model: MoL against the base and against CE, each before the same GRPO.

SmolLM2-135M-Instruct (or any chat model) in the library world (``molrl demo --world library --model``,
``configs/pipeline_library_pretrained.yaml``; docs/library.md), warmed up once in decoy libraries. Each seed builds its
own world (its own library's behaviours), collects the base's traces in the sandbox and runs the six models:

==================  ==========================================================================================
model               what it is
==================  ==========================================================================================
base                the warmed-up base
mol, mol+grpo       MoL (CE on feedback + KL to the base on decisions), then GRPO continuing its adapter
ce, ce+grpo         CE on every trace token, then the same GRPO
base+grpo           the same GRPO from the base (a fresh LoRA)
==================  ==========================================================================================

The claims were pre-registered in benchmarks/RESULTS.md before any outcome (``PRIMARY["library.md"]``): primary,
``mol+grpo`` − ``base+grpo`` and ``mol+grpo`` − ``ce+grpo`` held-out (smallest effect 0.05, read both ways);
secondary, ``mol`` − ``base`` held-out, ``mol`` − ``ce`` general accuracy and general KL, and the library probe's
shares. 3 seeds, up to 5 while a primary is undecided, under the study's rule; each seed scores its own world's
tasks, so the standard error is a bootstrap over seeds and, within each, its tasks.

Every model is scored greedily, single turn, without execution, on held-back tests of the seed's held-out and general
tasks, with the library probe (``library_probe.py``) and general KL to the base (``molrl.study.headline.forgetting``).

**Phases and the store** are the ablation's (``ablation_paper.py``): a seed's models run in phases that need only the
base and the seed's collected traces (``mol``: mol, mol+grpo and the base's evaluation; ``ce``: ce, ce+grpo;
``base``: base+grpo), each kept in ``benchmarks/stored/library_headline/seed-N`` once done (evaluations, metrics,
probe, general KL, world, traces, commit, seconds) and never run again; the warm-up's adapter is kept once, so a new
machine rebuilds the same base.

    python benchmarks/library_headline.py --model runs/smollm2/model --out runs/library_headline   # seeds, report
    python benchmarks/library_headline.py --model M --out OUT --seed 0 --phase base      # some phases
    python benchmarks/library_headline.py --report       # the report from what is stored (no model needed)

The report is ``benchmarks/stored/library_headline/library.md``.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from pathlib import Path
from typing import Sequence

from ablation_paper import Phase, parse_phase_arguments, phase_arguments, phase_time_lines, run_stored_phase
from ablation_paper import seeds_done as seeds_stored
from library_probe import probe_run, probe_table

from molrl.demo.library import task_functions
from molrl.demo.seeds import cell
from molrl.pipeline.config import MolRun, RlRun
from molrl.records.jsonl import read_records
from molrl.records.writes import write_text
from molrl.study.claims import CLAIMS, PRIMARY, is_primary
from molrl.study.headline import LIBRARY_INTRO, model_label, paired_accuracy_claim, problem_count
from molrl.study.metrics import scorer
from molrl.study.verdict import CLAIM_LINE, RULE, claim_line, primary_note

REPO = Path(__file__).resolve().parent.parent
STORE = REPO / "benchmarks" / "stored" / "library_headline"
GRPO = ["algorithm=grpo"]
PHASES: dict[str, Phase] = {
    "base": Phase((), (RlRun("base+grpo", "base", GRPO),), ("base", "base+grpo")),
    "mol": Phase((MolRun("mol", ["loss.mode=mol"]),), (RlRun("mol+grpo", "mol", GRPO),), ("mol", "mol+grpo")),
    "ce": Phase((MolRun("ce", ["loss.mode=ce"]),), (RlRun("ce+grpo", "ce", GRPO),), ("ce", "ce+grpo")),
}
"""Each seed's phases, in the order they run (the pilot's GRPO from the base first)."""
MODELS = ("base", "base+grpo", "mol", "mol+grpo", "ce", "ce+grpo")
MEASURES = ("library_probe.json", "forgetting.json")
REPORT = "library.md"
log = logging.getLogger("library_headline")


def measure(run: Path, models: Sequence[str]) -> dict[str, float]:
    """The library probe and general KL of ``models`` (each kept beside the run, measured once); the seconds each
    measure took."""
    from molrl.study.headline import forgetting

    started = time.time()
    probe_run(run, models)
    probed = time.time() - started
    forgetting(run / "pipeline", [m for m in models if m != "base"])
    return {"library probe": probed, "general KL": time.time() - started - probed}


def run_phase(out: Path, store: Path, seed: int, name: str, model: str, quick: bool) -> bool:
    """Run phase ``name`` of ``seed`` unless it is stored; store it once done. Returns whether it ran."""
    from molrl.demo.run import prepare_seed

    return run_stored_phase(out, store, seed, name, PHASES[name], model,
                            lambda run: prepare_seed(run, "quick" if quick else "default", [], seed,
                                                     world_name="library", model=model),
                            measure, PHASES, MEASURES)


def seeds_done(store: Path) -> int:
    """How many seeds, from 0 on, have every phase stored."""
    return seeds_stored(store, PHASES)


# ---- the report ----------------------------------------------------------------------------------------------------

def probe_shares(probes: Sequence[dict], model: str, probe: str) -> list[float]:
    """``model``'s mean share of the library probe ``probe`` (``feedback``, ``answer``, ``answer_in_context``) per
    seed, from each seed's ``library_probe.json``."""
    return [float(found[model]["mean"][probe]) for found in probes]


def accuracy(key: str, run_dirs: Sequence[Path], score, side: str, other: str, bench: str = "heldout") -> str:
    """A pass@1 claim's verdict line, its standard error over seeds and each seed's own tasks."""
    return paired_accuracy_claim(CLAIMS[key], run_dirs, score, side, other, bench, is_primary(REPORT, key),
                                 nested=True)


def claim_lines(run_dirs: Sequence[Path], score, kl: dict[str, list[float]], probes: Sequence[dict]) -> list[str]:
    """The primary claims, then the secondary ones, with the note that says which is which."""
    lines = [accuracy("headline", run_dirs, score, "mol+grpo", "base+grpo"),
             accuracy("mol_over_ce_grpo", run_dirs, score, "mol+grpo", "ce+grpo"),
             accuracy("absorbs", run_dirs, score, "mol", "base"),
             accuracy("grpo_learns", run_dirs, score, "base+grpo", "base"),
             accuracy("ce_forgets_accuracy", run_dirs, score, "mol", "ce", "general"),
             claim_line(CLAIMS["ce_moves_general"], kl["ce"], kl["mol"])]
    for probe in ("answer", "feedback"):
        for other in ("base", "ce"):
            lines.append(claim_line(CLAIMS[f"probe_{probe}"].fill(other=other), probe_shares(probes, "mol", probe),
                                    probe_shares(probes, other, probe)))
    return [primary_note(lines, len(PRIMARY[REPORT])), "", *lines]


def grpo_settings(metrics: Path) -> str:
    """The GRPO every model ran, as ``base+grpo``'s stored config says it, beside the paper's."""
    import yaml

    found = metrics / "base+grpo.config.yaml"
    if not found.is_file():
        return "GRPO: its settings were not stored with this seed."
    cfg = yaml.safe_load(found.read_text())
    sampling, train = cfg["sampling"], cfg["train"]
    return (f"GRPO: {train['max_steps']} steps of {cfg['prompts_per_step']} prompts x groups of {sampling['n']} at "
            f"temperature {sampling['temperature']:g}, top-p {sampling['top_p']:g}, lr {train['learning_rate']:g}, "
            f"KL {cfg['beta']:g} to its start (the pilot chose the temperature for the share of groups that carry a "
            "gradient; the paper's GRPO sampled at 0.9 with lr 1e-4).")


def pair_lines(run_dirs: Sequence[Path]) -> list[str]:
    """Each seed's held-out passes by the functions its tasks combine, per model: a seed's held-out tasks are a few
    pairs of functions under many twists, and one coding choice on a pair moves all of its tasks at once."""
    lines = ["Held-out passes by the functions a task combines (greedy samples passing, of the pair's), per seed: one "
             "coding choice on a pair can move all its tasks at once, so a seed's held-out tasks are not independent.",
             ""]
    for s, d in enumerate(run_dirs):
        tally = {m: Counter() for m in MODELS}  # (pair, passed) -> samples
        for m in MODELS:
            tally[m].update((task_functions(r["id"]), bool(r["correct"]))
                            for r in read_records(d / "eval" / m / "heldout" / "samples.jsonl"))
        pairs = sorted({p for counts in tally.values() for p, _ in counts})
        lines += [f"Seed {s}:", "", "| model | " + " | ".join(f"`{p}`" for p in pairs) + " |",
                  "|---|" + "---|" * len(pairs)]
        for m, counts in tally.items():
            lines.append(f"| `{m}` | " + " | ".join(f"{counts[p, True]} of {counts[p, True] + counts[p, False]}"
                                                     for p in pairs) + " |")
        lines.append("")
    return lines


def report(store: Path, seeds: int) -> Path:
    """``store/library.md`` over the first ``seeds`` stored seeds: every model's scores and general KL, the
    verdicts, each seed's library probe and the machine time."""
    run_dirs = [store / f"seed-{s}" / "pipeline" for s in range(seeds)]
    score = scorer(run_dirs)
    probes = [json.loads((d / "library_probe.json").read_text()) for d in run_dirs]
    kl = {m: [0.0 if m == "base" else float(json.loads((d / "forgetting.json").read_text())[m]["general_kl"])
              for d in run_dirs] for m in MODELS}
    made_of = store / "base" / "made_of.json"
    model = json.loads(made_of.read_text())["model"] if made_of.is_file() else "?"
    counts = {b: ", ".join(str(problem_count(d, "base", b)) for d in run_dirs) for b in ("heldout", "general")}
    lines = [f"# MoL against the base and CE before the same GRPO: {model_label(model)}, library world ({seeds} "
             f"seed{'s' * (seeds != 1)})", "",
             LIBRARY_INTRO.format(model=model_label(model), n_held=counts["heldout"], n_general=counts["general"])
             + " CE trains on every token of the same traces. " + grpo_settings(run_dirs[0] / "metrics")
             + " General KL is KL(model || base) per token on the base's greedy general answers. A cell is mean ± "
             "s.e. over seeds [per seed].", "",
             "| model | held-out | general | general KL |", "|---|---|---|---|"]
    for m in MODELS:
        lines.append(f"| `{m}` | {cell(score(m, 'heldout'))} | {cell(score(m, 'general'))} | {cell(kl[m], 4)} |")
    lines += ["", "Verdicts compare paired per-seed differences d: " + RULE + " Here each seed scores its own "
              "world's tasks, so the standard error is the larger of the seeds' own and a bootstrap over seeds and, "
              "within each, its tasks.", "", *claim_lines(run_dirs, score, kl, probes), "",
              *pair_lines(run_dirs), "Library probe (P(true) among a function's behaviours, by the candidates' "
              "whole probability; a guess is 0.375 on the mean), per seed:", ""]
    for s, (d, found) in enumerate(zip(run_dirs, probes)):
        key = json.loads((d.parent / "world" / "world.json").read_text())["key"]
        lines += [f"Seed {s} (`{key}`):", "", *probe_table({m: found[m] for m in MODELS if m in found},
                                                            lambda row, probe: row[probe]), ""]
    lines += phase_time_lines(store, seeds)
    path = store / REPORT
    write_text(path, "\n".join(lines) + "\n")
    return path


def undecided(text: str) -> bool:
    """Whether a primary claim of the report ``text`` is undecided."""
    return any(m and m.group(1) and m.group(3) == "undecided" for m in map(CLAIM_LINE.match, text.splitlines()))


def main() -> None:
    p = phase_arguments(__doc__, "runs/library_headline", STORE, list(PHASES),
                        "the quick world and warm-up, a few steps a stage")
    args = parse_phase_arguments(p, report, seeds_done)
    if args is None:
        return
    out = Path(args.out)
    for seed in args.seed or range(args.seeds):
        for name in args.phase or list(PHASES):
            run_phase(out, args.store, seed, name, args.model, args.quick)
    if args.seed:
        return
    seeds = seeds_done(args.store)
    path = report(args.store, seeds)
    while seeds < args.max_seeds and undecided(path.read_text()):
        for name in PHASES:
            run_phase(out, args.store, seeds, name, args.model, args.quick)
        seeds = seeds_done(args.store)
        path = report(args.store, seeds)
    print(path.read_text())


if __name__ == "__main__":
    main()
