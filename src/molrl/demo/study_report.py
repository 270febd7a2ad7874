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

from molrl.demo.seeds import cell, mean_se, seed_summary
from molrl.demo.study_arms import ALGORITHMS, CODE, EPOCHS, LOSSES, REWARD_START, REWARDS, SOURCES
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
             "the held-out rule problems (*held-out*), the general tasks (*general*) and the held-out "
             "code-answer problems (*code*); a cell is mean ± standard error over seeds "
             "(per-seed values in brackets).".format(len(run_dirs) - 1), "",
             "An epoch is one pass over the domain traces (the collected or the expert's episodes); the "
             "general replay traces are interleaved at one per three domain traces and do not count "
             "towards it.", "",
             "Verdicts compare paired per-seed differences d: *reproduced* when every seed has d > 0 and the "
             "mean exceeds twice its standard error, *not reproduced* when no seed has d > 0, *mixed* otherwise.", ""]
    lines += forgetting_section(score, run_dirs, plots)
    lines += epochs_section(score, run_dirs)
    lines += algorithm_section(score, run_dirs, plots)
    lines += reward_section(score, run_dirs, plots)
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


def epochs_section(score: Score, run_dirs: Sequence[Path]) -> list[str]:
    """Claim 2: 0 / 1 / 3 MoL epochs and the demo's MoL length, each followed by the same GRPO run."""
    lines = ["## 2. MoL length before the same GRPO", "",
             "The paper: more MoL before RL gives RL a better start. Each MoL run is followed by the same GRPO run; "
             "*demo* is the demo's own MoL length (`mol.train.max_steps`).", "",
             "| MoL epochs (steps) | held-out before GRPO | held-out after GRPO | general after GRPO |",
             "|---|---|---|---|"]
    for label, start in EPOCHS.items():
        lines.append(f"| {mol_length(run_dirs, start, label)} | {cell(score(start, 'heldout'))} | "
                     f"{cell(score(start + '+grpo', 'heldout'))} | {cell(score(start + '+grpo', 'general'))} |")
    base = score(EPOCHS["0"] + "+grpo", "heldout")
    lines.append("")
    for label, start in list(EPOCHS.items())[1:]:
        length = mol_length(run_dirs, start, label)
        lines.append(claim_line(f"MoL before GRPO helps ({length.replace(' (', ' epochs (', 1)} vs none)", score(start + "+grpo", "heldout"), base,
                                f"held-out after GRPO, {label} − 0"))
    return lines + [""]


def mol_length(run_dirs: Sequence[Path], run: str, label: str) -> str:
    """A MoL run's length as trained: ``4.7 (80 steps)`` from its metrics (mean over seeds), ``0`` for the base."""
    if run == EPOCHS["0"]:
        return "0"
    epochs = [last_value(d, "mol", run, "epoch") for d in run_dirs]
    steps = [last_value(d, "mol", run, "step") for d in run_dirs]
    whose = ", the demo's" if label == "demo" else ""
    return f"{sum(epochs) / len(epochs):.1f} ({sum(steps) / len(steps):.0f} steps{whose})"


def algorithm_section(score: Score, run_dirs: Sequence[Path], plots: Path) -> list[str]:
    """Claim 3: GRPO vs Dr.GRPO from the same MoL model: scores and completion length."""
    runs = ALGORITHMS
    lengths = {alg: [late_mean(d, run, LENGTH) for d in run_dirs] for alg, run in runs.items()}
    lines = ["## 3. GRPO vs Dr.GRPO", "",
             f"The paper: Dr.GRPO reduces redundant output length. Both start from `{EPOCHS['demo']}`. Length is "
             "the mean completion length (tokens) over the last quarter of training steps.", "",
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


def summed_series(run_dir: Path, run: str, keys: Sequence[str]) -> tuple[list[float], list[float]]:
    """(steps, values): per training step of a GRPO run, the sum of ``keys`` (a key not logged at a step counts 0)."""
    rows = read_metrics(run_dir / "grpo" / run / "metrics.jsonl")
    steps, _ = _series(rows, "reward")
    series = [dict(zip(*_series(rows, key))) for key in keys]
    return steps, [sum(s.get(step, 0.0) for s in series) for step in steps]


def late_mean(run_dir: Path, run: str, *keys: str) -> float:
    """Mean of ``summed_series`` over the last quarter of the logged steps (nan if none is logged)."""
    _, values = summed_series(run_dir, run, keys)
    late = values[len(values) - max(1, len(values) // 4):]
    return sum(late) / len(late) if late else float("nan")


BROKEN = tuple(f"reward_stage/code/{stage}" for stage in ("no_code", "compile_error", "runtime_error"))
"""The GRPO metrics of completions whose code does not run (their fractions of each step's batch)."""
PASSED = "reward_stage/code/all_pass"
"""The GRPO metric of completions whose code passes the test."""


def reward_section(score: Score, run_dirs: Sequence[Path], plots: Path) -> list[str]:
    """Claim 4: the staged code reward vs the binary one, each a GRPO run from the same MoL model."""
    before = score(REWARD_START, CODE)
    lines = ["## 4. Staged vs binary code reward", "",
             "The paper: multi-stage and binary rewards are both robust. Both runs start from "
             f"`{REWARD_START}` and train on the code-answer problems (write `solve()` returning the call's value); "
             "the staged reward scores no code 0, a compile error 0.1, a runtime error 0.2, a wrong value 0.3 and "
             "a pass 1, the binary one a pass 1 and the rest 0. *Broken* is the fraction of sampled completions "
             "with no code, a compile error or a runtime error over the last quarter of training steps.", "",
             "| reward | code before GRPO | code after GRPO | general after GRPO | broken completions (last quarter) |",
             "|---|---|---|---|---|"]
    for mode, run in REWARDS.items():
        broken = [late_mean(d, run, *BROKEN) for d in run_dirs]
        lines.append(f"| {mode} | {cell(before)} | {cell(score(run, CODE))} | {cell(score(run, 'general'))} | "
                     f"{cell(broken)} |")
    lines.append("")
    for mode, run in REWARDS.items():
        lines.append(claim_line(f"GRPO with the {mode} reward learns the code-answer problems", score(run, CODE),
                                before, f"code after − before, {mode}"))
    diffs = [a - b for a, b in zip(score(REWARDS["staged"], CODE), score(REWARDS["binary"], CODE))]
    mean, se = mean_se(diffs)
    lines += [f"- staged − binary on code after GRPO: {mean:+.3f} ± {se:.3f} (per seed "
              + ", ".join(f"{d:+.3f}" for d in diffs) + ").", ""]
    figure = plot_reward_stages(run_dirs, plots / "code_reward_stages.png")
    if figure is not None:
        lines += [f"![code reward stages per step](plots/{figure.name})", ""]
    return lines


def _mean_curve(curves: list[tuple[list[float], list[float]]]) -> tuple[list[float], list[float]]:
    """The per-step mean of several (steps, values) curves over the steps they all logged."""
    common = sorted(set.intersection(*(set(steps) for steps, _ in curves))) if curves else []
    by_step = [dict(zip(steps, values)) for steps, values in curves]
    return common, [sum(c[s] for c in by_step) / len(by_step) for s in common]


Curve = tuple[list[float], list[float]]
"""(steps, values) of one logged metric."""


def plot_panels(panels: dict[str, dict[str, list[Curve]]], xlabel: str, path: Path, ylabel: str = "") -> Path | None:
    """One panel per title, one line per label (the mean of its per-seed curves); None when nothing was logged."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels) + 1, 4), sharey=True, squeeze=False)
    drawn = False
    for ax, (title, lines) in zip(axes[0], panels.items()):
        for label, curves in lines.items():
            steps, values = _mean_curve(curves)
            if steps:
                ax.plot(steps, values, marker=".", label=label)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    return _save(fig, path)


def plot_kl(run_dirs: Sequence[Path], path: Path) -> Path | None:
    """Decision-token KL to the base per MoL step, one line per loss, one panel per trace source (mean over seeds)."""
    panels = {f"{source} traces: KL(model || base) on decision tokens":
              {mode: [_series(read_metrics(d / "mol" / (mode + suffix) / "metrics.jsonl"), "kl_decision")
                      for d in run_dirs] for mode in LOSSES}
              for source, suffix in SOURCES.items()}
    return plot_panels(panels, "MoL optimiser step", path)


def plot_reward_stages(run_dirs: Sequence[Path], path: Path) -> Path | None:
    """Per GRPO step, the fraction of completions that pass and that are broken, staged vs binary (mean over seeds)."""
    panels = {title: {mode: [summed_series(d, run, keys) for d in run_dirs] for mode, run in REWARDS.items()}
              for title, keys in (("code passes the test", (PASSED,)),
                                  ("broken: no code, compile or runtime error", BROKEN))}
    return plot_panels(panels, "GRPO step", path, "fraction of sampled completions")


def plot_lengths(run_dirs: Sequence[Path], runs: dict[str, str], path: Path) -> Path | None:
    """Mean completion length per GRPO step, one line per algorithm (mean over seeds)."""
    panels = {"completion length": {alg: [summed_series(d, run, [LENGTH]) for d in run_dirs] for alg, run in runs.items()}}
    return plot_panels(panels, "GRPO step", path, "mean completion length (tokens)")


def plot_general_vs_heldout(score: Score, path: Path) -> Path | None:
    """One point per model: general accuracy against held-out accuracy (means over seeds)."""
    models = ["base", *(m + s for s in SOURCES.values() for m in LOSSES), EPOCHS["1"], EPOCHS["demo"],
              *(f"{start}+grpo" for start in EPOCHS.values()), ALGORITHMS["dr_grpo"], *REWARDS.values()]
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
