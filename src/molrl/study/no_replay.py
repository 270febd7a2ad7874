"""``study_no_replay.md``: the chain study's forgetting claims without the general replay (``--study --no-replay``).

Every arm of the full study replays the general tasks (MoL mixes in general traces, GRPO's prompts include
general problems), which leaves forgetting no room to show. These arms (``molrl.study.arms.CHAIN_NO_REPLAY``)
train on the world's rule problems alone: MoL vs CE vs CE on feedback only, the KL dose, and GRPO from MoL with
MoL's decision KL at several weights in ``merge_new`` mode. Read back from each seed's pipeline directory as
``molrl.study.report`` does, with the same verdict rule.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from molrl.demo.seeds import cell
from molrl.records.jsonl import read_records
from molrl.study.arms import LOSSES, NO_REPLAY, StudyArms
from molrl.study.kl import dose_section, rl_kl_section
from molrl.study.metrics import Score, mol_late_mean, scorer
from molrl.study.report import plot_general_vs_heldout, time_section
from molrl.study.claims import CLAIMS, is_primary
from molrl.study.verdict import RULE, claim_line, primary_note
from molrl.records.writes import write_text


def write_no_replay_report(run_dirs: Sequence[Path], out: Path, arms: StudyArms, wall_s: float | None = None) -> Path:
    """Write ``out/study_no_replay.md`` and its plots (``out/plots/no_replay_*.png``); returns the report's path."""
    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    score = scorer(run_dirs)
    lines = [f"# molrl study without the general replay: forgetting on the {arms.world} world "
             f"({len(run_dirs)} seeds)", "",
             "Each seed builds its world and base as the demo does; every MoL run here trains on the base's own "
             "collected traces alone (no general replay traces), and every GRPO run prompts the training rule "
             "problems alone (no general problems). Scores are single-step pass@1 on the held-out rule problems "
             "(*held-out*) and the general tasks (*general*, what the model kept); a cell is mean ± standard error "
             "over seeds (per-seed values in brackets).", "",
             "Verdicts compare paired per-seed differences d (the claim's side minus the other): " + RULE, ""]
    claims_at = len(lines)
    lines += loss_section(score, run_dirs, arms)
    lines += rl_forgetting_section(score, arms)
    lines += ["Without replay, MoL at KL weight 0 is CE on the feedback tokens alone, the loss of "
              f"`ce_feedback{NO_REPLAY}` (the same sums and normaliser), so that run is the dose's zero point.", ""]
    lines += dose_section(score, run_dirs, plots, arms)
    lines += rl_kl_section(score, run_dirs, plots, arms)
    models = ["base", *dict.fromkeys([*(m + NO_REPLAY for m in LOSSES), *arms.kl_doses.values(),
                                      *arms.rl_kl.values()])]
    figure = plot_general_vs_heldout(score, plots / "no_replay_arms.png", models)
    lines += ["## Held-out against general, per arm", "",
              "Means over seeds with standard-error bars; up and right is better, left of the base is forgetting.",
              "", f"![held-out against general per arm](plots/{figure.name})", ""]
    lines += time_section(run_dirs, wall_s)
    lines[claims_at:claims_at] = [primary_note(lines), ""]
    report = out / "study_no_replay.md"
    write_text(report, "\n".join(lines))
    return report


def loss_section(score: Score, run_dirs: Sequence[Path], arms: StudyArms) -> list[str]:
    """MoL vs CE vs CE on feedback only, each on the base's own traces alone: scores, decision KL, verdicts."""
    runs = {mode: mode + NO_REPLAY for mode in LOSSES}
    kl = {mode: [mol_late_mean(d, run) for d in run_dirs] for mode, run in runs.items()}
    lines = ["## 1. MoL vs CE vs CE on feedback only, without replay", "",
             "The paper: pure CE on traces forgets; MoL's KL on decision tokens keeps the model's own reasoning. "
             "*General drop* is the base's general accuracy minus the run's. Decision KL is KL(model || base) per "
             "decision token on the training batches, mean over the last quarter of MoL steps.", "",
             "Two measured ways a general answer goes wrong: *naming f*, the share of general answers that write a "
             "step of the secret rule `f` where the problem asks for `s` or `m` (the rule's name carried over from "
             "the domain traces, where every step names `f`), and *wrong length*, the share whose steps are not as "
             "many as the problem asks.", "",
             "| loss | run | held-out | general | general drop from the base | naming f | wrong length | "
             "decision KL (end) |", "|---|---|---|---|---|---|---|---|",
             f"| — | `base` | {cell(score('base', 'heldout'))} | {cell(score('base', 'general'))} | — | "
             f"{cell([naming_f(d, 'base') for d in run_dirs])} | {cell([wrong_length(d, 'base') for d in run_dirs])} "
             "| — |"]
    base = score("base", "general")
    for mode, run in runs.items():
        drop = [b - a for b, a in zip(base, score(run, "general"))]
        lines.append(f"| {mode} | `{run}` | {cell(score(run, 'heldout'))} | {cell(score(run, 'general'))} | "
                     f"{cell(drop)} | {cell([naming_f(d, run) for d in run_dirs])} | "
                     f"{cell([wrong_length(d, run) for d in run_dirs])} | {cell(kl[mode], 4)} |")
    lines.append("")
    for mode, run in runs.items():
        lines.append(claim_line(CLAIMS["forgets_alone"].fill(mode=mode, run=run), base, score(run, "general")))
    lines += [claim_line(CLAIMS["ce_forgets_alone"], score(runs["mol"], "general"), score(runs["ce"], "general"),
                         primary=is_primary("study_no_replay.md", "ce_forgets_alone")),
              claim_line(CLAIMS["ce_feedback_forgets_alone"], score(runs["mol"], "general"),
                         score(runs["ce_feedback"], "general")),
              claim_line(CLAIMS["mol_over_ce_feedback_alone"], score(runs["mol"], "heldout"),
                         score(runs["ce_feedback"], "heldout")),
              claim_line(CLAIMS["ce_moves_decisions_alone"], kl["ce"], kl["mol"]), ""]
    return lines


SECRET_STEP = re.compile(r"\bf\(\d+\) =")
"""A step of the secret rule in an answer."""


STEP = re.compile(r"^\d+: \w\(", re.MULTILINE)
"""A step line of a chain answer."""


def general_answers(run_dir: Path, model: str) -> list[dict]:
    """``model``'s evaluated answers to the general problems (ids ``s/START/STEPS``, ``m/START/STEPS``)."""
    return [r for r in read_records(run_dir / "eval" / model / "general" / "samples.jsonl")
            if not str(r["id"]).startswith("f/")]


def naming_f(run_dir: Path, model: str) -> float:
    """The share of ``model``'s general answers (public rules ``s``, ``m``) that write a step of the secret rule."""
    rows = general_answers(run_dir, model)
    return sum(bool(SECRET_STEP.search(r["completion"])) for r in rows) / max(len(rows), 1)


def wrong_length(run_dir: Path, model: str) -> float:
    """The share of ``model``'s general answers whose step lines are not as many as the problem's steps."""
    rows = general_answers(run_dir, model)
    return sum(len(STEP.findall(r["completion"])) != int(str(r["id"]).rsplit("/", 1)[1]) for r in rows) / max(len(rows), 1)


def rl_forgetting_section(score: Score, arms: StudyArms) -> list[str]:
    """GRPO from MoL on the rule problems alone: does it forget what MoL kept?"""
    start, plain = arms.algorithm_start, arms.rl_kl[0.0]
    return ["## RL from MoL without replay", "",
            f"`{plain}`: GRPO from `{start}` on the rule problems alone (`model.adapter_mode="
            f"{arms.rl_adapter_mode}`, no decision KL; `rl.beta` as the pipeline's).", "",
            "| model | held-out | general |", "|---|---|---|",
            *(f"| `{m}` | {cell(score(m, 'heldout'))} | {cell(score(m, 'general'))} |" for m in ("base", start, plain)),
            "", claim_line(CLAIMS["rl_forgets_alone"].fill(start=start, run=plain), score(start, "general"),
                           score(plain, "general")),
            claim_line(CLAIMS["rl_learns_alone"].fill(start=start, run=plain), score(plain, "heldout"),
                       score(start, "heldout")), ""]
