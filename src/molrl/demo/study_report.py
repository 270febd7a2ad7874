"""``study.md``: one table per claim over seeds, a verdict line per claim, and the mechanism plots.

Read back from each seed's pipeline directory (``eval/*/results.json``, ``mol/*/metrics.jsonl``,
``grpo/*/metrics.jsonl``), so the report can be rebuilt at any time. A cell is the mean over
seeds ± its standard error, with the per-seed values after it.

A verdict compares paired per-seed differences d (the claim's side minus the other):
reproduced when every seed has d > 0 and the mean exceeds twice its standard error; not
reproduced when no seed has d > 0; mixed otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from molrl.demo.seeds import mean_se, seed_summary
from molrl.demo.study import EPOCHS, LOSSES, SOURCES
from molrl.report import _pyplot, _save, _series, accuracy, eval_results, read_metrics

LENGTH = "completions/mean_length"
"""GRPO's logged mean completion length (tokens) per step."""


def write_study_report(run_dirs: Sequence[Path], out: Path) -> Path:
    """Write ``out/study.md`` and ``out/plots/*.png`` from the seeds' pipeline directories."""
    results = [eval_results(Path(d)) for d in run_dirs]
    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    score = _scorer(results)
    lines = [f"# molrl study: the MoL-RL ablations on the demo world ({len(run_dirs)} seeds)", "",
             "Seeds 0 to {} each build their own world and base and train every run with that seed "
             "(`seed-N/pipeline/report.md` has each seed's own report). Scores are single-step pass@1 on "
             "the held-out rule problems and the general tasks; a cell is mean ± standard error over seeds "
             "(per-seed values in brackets).".format(len(run_dirs) - 1), "",
             "Verdicts compare paired per-seed differences d: *reproduced* when every seed has d > 0 and the "
             "mean exceeds twice its standard error, *not reproduced* when no seed has d > 0, *mixed* otherwise.", ""]
    lines += forgetting_section(score, run_dirs, plots)
    lines += epochs_section(score)
    lines += algorithm_section(score, run_dirs, plots)
    figure = plot_general_vs_heldout(score, plots / "general_vs_heldout.png")
    if figure is not None:
        lines += ["## General vs held-out accuracy per model", "", f"![general vs held-out](plots/{figure.name})", ""]
    lines += [seed_summary(run_dirs)]
    report = out / "study.md"
    report.write_text("\n".join(lines))
    return report


Score = Callable[[str, str], list[float]]
"""score(model, benchmark) -> pass@1 per seed."""


def _scorer(results: list[dict[str, dict[str, Any]]]) -> Score:
    def score(model: str, bench: str) -> list[float]:
        return [accuracy(r[model]["benchmarks"][bench])[0] for r in results]
    return score


def cell(values: Sequence[float], digits: int = 3) -> str:
    """``mean ± se [v1, v2, ...]`` of per-seed values.

    >>> cell([0.5, 0.7, 0.9], 2)
    '0.70 ± 0.12 [0.50, 0.70, 0.90]'
    """
    mean, se = mean_se(values)
    return f"{mean:.{digits}f} ± {se:.{digits}f} [" + ", ".join(f"{v:.{digits}f}" for v in values) + "]"


def verdict(diffs: Sequence[float]) -> str:
    """reproduced / not reproduced / mixed for paired per-seed differences (the claim's side minus the other).

    >>> verdict([0.2, 0.3, 0.25]), verdict([0.0, -0.1, 0.0]), verdict([0.2, -0.1, 0.1])
    ('reproduced', 'not reproduced', 'mixed')
    """
    mean, se = mean_se(diffs)
    if all(d > 0 for d in diffs) and mean > 2 * se:
        return "reproduced"
    if not any(d > 0 for d in diffs):
        return "not reproduced"
    return "mixed"


def claim_line(claim: str, side: Sequence[float], other: Sequence[float], what: str) -> str:
    """A verdict line: the claim, its verdict, and the paired difference with its standard error."""
    diffs = [a - b for a, b in zip(side, other)]
    mean, se = mean_se(diffs)
    return f"- **{claim}**: {verdict(diffs)} ({what}: {mean:+.3f} ± {se:.3f}, per seed " + \
        ", ".join(f"{d:+.3f}" for d in diffs) + ")."


def last_value(run_dir: Path, group: str, run: str, key: str) -> float:
    """The last logged value of ``key`` in a run's metrics.jsonl (nan if never logged)."""
    _, values = _series(read_metrics(run_dir / group / run / "metrics.jsonl"), key)
    return values[-1] if values else float("nan")


def forgetting_section(score: Score, run_dirs: Sequence[Path], plots: Path) -> list[str]:
    """Claim 1: MoL vs CE vs CE on feedback only, per trace source."""
    lines = ["## 1. MoL vs CE vs CE on feedback only (forgetting)", "",
             "The paper: pure CE on traces forgets; MoL's KL on decision tokens keeps the model's own "
             "reasoning. *own* traces are the base's collected episodes, *expert* traces another agent's "
             "(same tool and feedback, another wording). Decision KL is KL(model || base) per decision token "
             "at the end of MoL training.", "",
             "| traces | loss | held-out | general | decision KL (end) |", "|---|---|---|---|---|"]
    verdicts = []
    for source, suffix in SOURCES.items():
        for mode in LOSSES:
            run = mode + suffix
            kl = [last_value(d, "mol", run, "kl_decision") for d in run_dirs]
            lines.append(f"| {source} | {mode} | {cell(score(run, 'heldout'))} | {cell(score(run, 'general'))} | "
                         f"{cell(kl, 4)} |")
        verdicts.append(claim_line(f"CE forgets more than MoL ({source} traces)", score("mol" + suffix, "general"),
                                   score("ce" + suffix, "general"), "general accuracy, mol − ce"))
        verdicts.append(claim_line(f"MoL learns more than CE on feedback only ({source} traces)",
                                   score("mol" + suffix, "heldout"), score("ce_feedback" + suffix, "heldout"),
                                   "held-out accuracy, mol − ce_feedback"))
    lines += ["", *verdicts, ""]
    figure = plot_kl(run_dirs, plots / "decision_kl.png")
    if figure is not None:
        lines += [f"![decision KL over MoL training](plots/{figure.name})", ""]
    return lines


def epochs_section(score: Score) -> list[str]:
    """Claim 2: 0 / 1 / 3 MoL epochs, each followed by the same GRPO run."""
    lines = ["## 2. MoL epochs before the same GRPO", "",
             "| MoL epochs | held-out before GRPO | held-out after GRPO | general after GRPO |", "|---|---|---|---|"]
    for label, start in EPOCHS.items():
        lines.append(f"| {label} | {cell(score(start, 'heldout'))} | {cell(score(start + '+grpo', 'heldout'))} | "
                     f"{cell(score(start + '+grpo', 'general'))} |")
    base = score("base+grpo", "heldout")
    lines += ["", claim_line("1 epoch of MoL helps GRPO", score("mol_1ep+grpo", "heldout"), base,
                             "held-out after GRPO, 1 epoch − 0"),
              claim_line("3 epochs of MoL help more than 1", score("mol+grpo", "heldout"),
                         score("mol_1ep+grpo", "heldout"), "held-out after GRPO, 3 epochs − 1"), ""]
    return lines


def algorithm_section(score: Score, run_dirs: Sequence[Path], plots: Path) -> list[str]:
    """GRPO vs Dr.GRPO from the same MoL model: scores and completion length."""
    runs = {"grpo": "mol+grpo", "dr_grpo": "mol+dr_grpo"}
    lengths = {alg: [_late_mean(read_metrics(d / "grpo" / run / "metrics.jsonl"), LENGTH) for d in run_dirs]
               for alg, run in runs.items()}
    lines = ["## 3. GRPO vs Dr.GRPO", "",
             "The paper: Dr.GRPO reduces redundant output length. Length is the mean completion length "
             "(tokens) over the last quarter of training steps.", "",
             "| algorithm | held-out | general | completion length (last quarter) |", "|---|---|---|---|"]
    for alg, run in runs.items():
        lines.append(f"| {alg} | {cell(score(run, 'heldout'))} | {cell(score(run, 'general'))} | "
                     f"{cell(lengths[alg], 1)} |")
    lines += ["", claim_line("Dr.GRPO writes shorter completions", lengths["grpo"], lengths["dr_grpo"],
                             "tokens, grpo − dr_grpo"), ""]
    figure = plot_lengths(run_dirs, runs, plots / "completion_length.png")
    if figure is not None:
        lines += [f"![completion length per step](plots/{figure.name})", ""]
    return lines


def _late_mean(rows: list[dict[str, Any]], key: str) -> float:
    """Mean of ``key`` over the last quarter of the logged steps (nan if never logged)."""
    _, values = _series(rows, key)
    late = values[len(values) - max(1, len(values) // 4):]
    return sum(late) / len(late) if late else float("nan")


def _mean_curve(curves: list[tuple[list[float], list[float]]]) -> tuple[list[float], list[float]]:
    """The per-step mean of several (steps, values) curves over the steps they all logged."""
    common = sorted(set.intersection(*(set(steps) for steps, _ in curves))) if curves else []
    by_step = [dict(zip(steps, values)) for steps, values in curves]
    return common, [sum(c[s] for c in by_step) / len(by_step) for s in common]


def plot_kl(run_dirs: Sequence[Path], path: Path) -> Path | None:
    """Decision-token KL to the base per MoL step, one line per loss, one panel per trace source (mean over seeds)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(SOURCES), figsize=(11, 4), sharey=True)
    drawn = False
    for ax, (source, suffix) in zip(axes, SOURCES.items()):
        for mode in LOSSES:
            steps, values = _mean_curve([_series(read_metrics(d / "mol" / (mode + suffix) / "metrics.jsonl"),
                                                 "kl_decision") for d in run_dirs])
            if steps:
                ax.plot(steps, values, marker=".", label=mode)
                drawn = True
        ax.set_title(f"{source} traces: KL(model || base) on decision tokens")
        ax.set_xlabel("MoL optimiser step")
        ax.grid(alpha=0.3)
        ax.legend()
    if not drawn:
        plt.close(fig)
        return None
    return _save(fig, path)


def plot_lengths(run_dirs: Sequence[Path], runs: dict[str, str], path: Path) -> Path | None:
    """Mean completion length per GRPO step, one line per algorithm (mean over seeds)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    drawn = False
    for alg, run in runs.items():
        steps, values = _mean_curve([_series(read_metrics(d / "grpo" / run / "metrics.jsonl"), LENGTH)
                                     for d in run_dirs])
        if steps:
            ax.plot(steps, values, marker=".", label=alg)
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("mean completion length (tokens)")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def plot_general_vs_heldout(score: Score, path: Path) -> Path | None:
    """One point per model: general accuracy against held-out accuracy (means over seeds)."""
    models = ["base", *(m + s for s in SOURCES.values() for m in LOSSES), EPOCHS[1],
              *(f"{start}+grpo" for start in EPOCHS.values()), "mol+dr_grpo"]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 5))
    for model in models:
        x, y = mean_se(score(model, "heldout"))[0], mean_se(score(model, "general"))[0]
        ax.scatter([x], [y], color="tab:red" if "grpo" in model else "tab:blue")
        ax.annotate(model, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("held-out accuracy (rule problems)")
    ax.set_ylabel("general accuracy (forgetting check)")
    ax.set_xlim(-0.05, 1.05)
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    return _save(fig, path)
