"""The study's KL claims (``molrl demo --study``, chain world): MoL's KL dose (claim 5) and MoL's decision KL
inside GRPO (claim 6), each a table, verdict lines and a held-out-against-general curve.

Both read the runs named in ``StudyArms.kl_doses`` and ``StudyArms.rl_kl``; verdicts follow
``molrl.study.verdict``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from molrl.demo.seeds import cell, mean_se
from molrl.study.arms import StudyArms
from molrl.study.metrics import RL_KL, Score, last_quarter_mean, logged, mol_late_mean
from molrl.study.claims import CLAIMS
from molrl.study.verdict import claim_line, closing_weight, verdict
from molrl.logs.plots import pyplot, save_figure

BASES = {
    "continue": "the base being the policy with its adapter disabled, that is the model before MoL (MoL's own "
                "reference; the MoL adapter is trained on, `model.adapter_mode=continue`).",
    "merge_new": "the base being the MoL model itself (`model.adapter_mode=merge_new`: the MoL adapter merged, a "
                 "fresh adapter trained, and the term's base that merged model with the fresh adapter disabled), so "
                 "the term holds only what GRPO changes.",
}
"""What claim 6's KL is taken against, by ``model.adapter_mode``."""

Point = tuple[str, list[float], list[float]]
"""(label, held-out per seed, general per seed) of one model on a curve."""


def dose_section(score: Score, run_dirs: Sequence[Path], plots: Path, arms: StudyArms) -> list[str]:
    """Claim 5: MoL with the decision-KL weight at 0, 0.1x, 1x and 10x: held-out against general, and the KL."""
    doses = arms.kl_doses
    zero = doses[0.0]
    kl = {w: [mol_late_mean(d, run) for d in run_dirs] for w, run in doses.items()}
    lines = ["## 5. The KL dose: MoL's decision-KL weight", "",
             "MoL (`loss.mode=mol`) on the base's own traces with `loss.kl_weight` at "
             + ", ".join(f"{w:g}" for w in doses) + " (1 is MoL's default, the run `mol`). At 0 the domain traces "
             "train CE on their feedback tokens only and the general replay trains nothing (`ce_feedback` trains CE "
             "on the replay too, so it is not the same run). The KL should trade held-out accuracy (what the feedback "
             "taught) against general accuracy (what the model kept); the plot draws the curve. Decision KL is "
             "KL(model || base) per decision token, mean over the last quarter of MoL steps.", "",
             "| KL weight | run | held-out | general | decision KL (end) |", "|---|---|---|---|---|"]
    for weight, run in doses.items():
        lines.append(f"| {weight:g} | `{run}` | {cell(score(run, 'heldout'))} | {cell(score(run, 'general'))} | "
                     f"{cell(kl[weight], 4)} |")
    lines.append("")
    for weight, run in doses.items():
        if weight == 0:
            continue
        lines.append(claim_line(CLAIMS["dose_keeps"].fill(weight=weight), score(run, "general"),
                                score(zero, "general")))
        lines.append(claim_line(CLAIMS["dose_costs"].fill(weight=weight), score(zero, "heldout"),
                                score(run, "heldout")))
    top = max(doses)
    lines += [claim_line(CLAIMS["dose_works"].fill(weight=top), kl[0.0], kl[top]), ""]
    points = [(f"{w:g}", score(run, "heldout"), score(run, "general")) for w, run in doses.items()]
    figure = plot_curve({"MoL by decision-KL weight": points}, plots / "kl_dose.png", kl)
    return lines + [f"![held-out against general by MoL's KL weight](plots/{figure.name})", ""]


def rl_kl_section(score: Score, run_dirs: Sequence[Path], plots: Path, arms: StudyArms) -> list[str]:
    """Claim 6: GRPO from MoL with and without ``loss.kl_weight``, and the weight that closes the general drop."""
    start, runs = arms.algorithm_start, arms.rl_kl
    kl = {w: [last_quarter_mean(logged(d, "rl", run, RL_KL)) for d in run_dirs] for w, run in runs.items() if w > 0}
    lines = ["## 6. GRPO from MoL with MoL's decision KL (single-turn)", "",
             f"GRPO from `{start}` (`{runs[0.0]}` without the term) with `loss.kl_weight` at "
             + ", ".join(f"{w:g}" for w in runs) + ": the full-vocabulary KL(policy || base) on every sampled token, "
             + BASES[arms.rl_adapter_mode] + " In single-turn RL every sampled token is a decision token, "
             "so the term holds the rule's values as well as the general answers near its base's. "
             "Every run also keeps the pipeline's `rl.beta` (TRL's "
             f"sampled-token KL to the same base). *General drop* is `{start}`'s general accuracy minus the run's; "
             "the question is at which weight the drop closes without losing the held-out accuracy GRPO reaches "
             "without the term. Decision KL is the term's value per sampled token, mean over the last quarter of "
             "GRPO steps.", "",
             "| weight | run | held-out | general | general drop from MoL | decision KL (last quarter) |",
             "|---|---|---|---|---|---|"]
    for weight, run in runs.items():
        drop = [b - a for b, a in zip(score(start, "general"), score(run, "general"))]
        term = cell(kl[weight], 4) if weight > 0 else "— (term off)"
        lines.append(f"| {weight:g} | `{run}` | {cell(score(run, 'heldout'))} | {cell(score(run, 'general'))} | "
                     f"{cell(drop)} | {term} |")
    verdicts, rows = rl_kl_verdicts(score, arms)
    points = [(f"{w:g}", score(run, "heldout"), score(run, "general")) for w, run in runs.items()]
    figure = plot_curve({f"GRPO from {start} by decision-KL weight": points}, plots / "rl_decision_kl.png")
    return lines + ["", *verdicts, "", "The weight that closes the drop (its drop is under the smallest effect worth "
                    f"reporting, and its held-out loss does not hold): **{closing_weight(rows)}**.", "",
                    f"![held-out against general by GRPO's decision-KL weight](plots/{figure.name})", ""]


def rl_kl_verdicts(score: Score, arms: StudyArms) -> tuple[list[str], list[tuple[float, str, str]]]:
    """Claim 6's verdict lines, and per weight (weight, drop verdict, held-out loss verdict) for ``closing_weight``."""
    start, plain = arms.algorithm_start, arms.rl_kl[0.0]
    before = score(start, "general")
    lines, rows = [], []
    for weight, run in arms.rl_kl.items():
        drop = [b - a for b, a in zip(before, score(run, "general"))]
        loss = [a - b for a, b in zip(score(plain, "heldout"), score(run, "heldout"))]
        drop_claim, loss_claim = CLAIMS["rl_drop"].fill(weight=weight, start=start), CLAIMS["rl_weight_costs"]
        rows.append((weight, verdict(drop, drop_claim.min_effect), verdict(loss, loss_claim.min_effect)))
        lines.append(claim_line(drop_claim, before, score(run, "general")))
        if weight > 0:
            lines.append(claim_line(CLAIMS["rl_weight_keeps"].fill(weight=weight), score(run, "general"),
                                    score(plain, "general")))
            lines.append(claim_line(loss_claim.fill(weight=weight), score(plain, "heldout"), score(run, "heldout")))
    return lines, rows


def plot_curve(panels: dict[str, list[Point]], path: Path, kl: dict[float, list[float]] | None = None) -> Path:
    """Per panel, held-out (x) against general (y) accuracy, one point per label joined in order, means over seeds
    with standard-error bars; with ``kl``, a last panel of the decision KL against the weight."""
    plt = pyplot()
    count = len(panels) + (kl is not None)
    fig, axes = plt.subplots(1, count, figsize=(5.5 * count + 1, 4.5), squeeze=False)
    for ax, (title, points) in zip(axes[0], panels.items()):
        x = [mean_se(h) for _, h, _ in points]
        y = [mean_se(g) for _, _, g in points]
        ax.errorbar([m for m, _ in x], [m for m, _ in y], xerr=[s for _, s in x], yerr=[s for _, s in y],
                    marker="o", capsize=3)
        for (label, _, _), (mx, _), (my, _) in zip(points, x, y):
            ax.annotate(f"weight {label}", (mx, my), fontsize=8, xytext=(4, 4), textcoords="offset points")
        ax.set_title(title)
        ax.set_xlabel("held-out accuracy (absorbed)")
        ax.set_ylabel("general accuracy (kept)")
        ax.grid(alpha=0.3)
    if kl is not None:
        ax = axes[0][-1]
        weights = sorted(kl)
        means = [mean_se(kl[w]) for w in weights]
        ax.errorbar(weights, [m for m, _ in means], yerr=[s for _, s in means], marker="o", capsize=3)
        ax.set_xscale("symlog", linthresh=0.1)
        ax.set_title("decision KL(model || base) at the end of MoL")
        ax.set_xlabel("loss.kl_weight")
        ax.set_ylabel("nats per decision token")
        ax.grid(alpha=0.3)
    return save_figure(fig, path)
