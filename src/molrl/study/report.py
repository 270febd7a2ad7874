"""``study.md``: one table per claim over seeds, a verdict line per claim, the time, and the mechanism plots.

Read back from each seed's pipeline directory (``eval/*/results.json``, ``mol/*/metrics.jsonl``,
``rl/*/metrics.jsonl``, the ``DONE`` markers), so the report can be rebuilt at any time. A cell is the mean
over seeds ± its standard error, with the per-seed values after it. Verdicts follow ``molrl.study.verdict``.
The KL claims (5 and 6) are in ``molrl.study.kl``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import yaml

from molrl.config.renames import current_names
from molrl.demo.seeds import cell, mean_se, seed_summary
from molrl.study.arms import CODE, DIGIT, LOSSES, SOURCES, StudyArms
from molrl.study.kl import dose_section, rl_kl_section
from molrl.study.metrics import KL, Score, late_mean, last_value, mol_late_mean, scorer, summed_series
from molrl.study.claims import CLAIMS, is_primary
from molrl.study.verdict import RULE, claim_line, primary_note
from molrl.pipeline.config import PipelineConfig
from molrl.logs.plots import metric_series, pyplot, save_figure
from molrl.report import read_metrics, stage_times
from molrl.records.writes import write_text

LENGTH = "completions/mean_length"
"""GRPO's logged mean completion length (tokens) per step."""


def write_study_report(run_dirs: Sequence[Path], out: Path, arms: StudyArms = DIGIT,
                       wall_s: float | None = None) -> Path:
    """Write ``out/study.md`` and ``out/plots/*.png`` from the seeds' pipeline directories; ``wall_s`` is the
    wall-clock time of the invocation that wrote it."""
    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    score = scorer(run_dirs)
    benchmarks = "the held-out rule problems (*held-out*), the general tasks (*general*)" + (
        " and the held-out code-answer problems (*code*)" if arms.rewards else "")
    lines = [f"# molrl study: the MoL-RL ablations on the {arms.world} world ({len(run_dirs)} seeds)", "",
             f"Seeds 0 to {len(run_dirs) - 1} each build their own world and base and train every run with that "
             f"seed (`seed-N/pipeline/report.md` has each seed's own report). Scores are single-step pass@1 on "
             f"{benchmarks}; a cell is mean ± standard error over seeds (per-seed values in brackets).", "",
             "An epoch is one pass over the domain traces (the collected or the expert's episodes); the "
             "general replay traces are interleaved at one per three domain traces and do not count "
             "towards it.", "",
             "Verdicts compare paired per-seed differences d (the claim's side minus the other): " + RULE, ""]
    claims_at = len(lines)
    lines += forgetting_section(score, run_dirs, plots)
    lines += epochs_section(score, run_dirs, arms)
    lines += algorithm_section(score, run_dirs, plots, arms)
    lines += reward_section(score, run_dirs, plots, arms) if arms.rewards else no_code_section()
    if arms.kl_doses:
        lines += dose_section(score, run_dirs, plots, arms)
    if arms.rl_kl:
        lines += rl_kl_section(score, run_dirs, plots, arms)
    figure = plot_general_vs_heldout(score, plots / "general_vs_heldout.png", study_models(arms))
    lines += ["## General vs held-out accuracy per model", "", f"![general vs held-out](plots/{figure.name})", ""]
    lines += time_section(run_dirs, wall_s)
    lines += [seed_summary(run_dirs)]
    lines[claims_at:claims_at] = [primary_note(lines), ""]
    report = out / "study.md"
    write_text(report, "\n".join(lines))
    return report


def study_models(arms: StudyArms) -> list[str]:
    """Every model of the study, base first: the MoL runs, then the RL runs."""
    mol = [m + s for s in SOURCES.values() for m in LOSSES]
    mol += [r for r in (*arms.epochs.values(), *arms.kl_doses.values()) if r not in mol and r != "base"]
    rl = [f"{start}+grpo" for start in arms.epochs.values()]
    rl += [r for r in (*arms.algorithms.values(), *arms.rewards.values(), *arms.rl_kl.values()) if r not in rl]
    return ["base", *mol, *rl]


def time_section(run_dirs: Sequence[Path], wall_s: float | None) -> list[str]:
    """The study's time: each seed's stages as they took (their ``DONE`` markers and the base's timing), summed."""
    groups = ("base model", "collect", "mol", "rl", "eval")
    per_seed = []
    for run_dir in run_dirs:
        config = current_names(PipelineConfig, yaml.safe_load((Path(run_dir) / "config.yaml").read_text()))
        sums = dict.fromkeys(groups, 0.0)
        for stage, seconds in stage_times(Path(run_dir), config):
            group = "rl" if stage.startswith(("rl/", "grpo/")) else next(g for g in groups if stage.startswith(g))
            sums[group] += seconds  # (grpo/: RL runs of a run directory made before the rename)
        per_seed.append(sums)
    total = sum(sum(s.values()) for s in per_seed)
    lines = ["## Time", "",
             f"The whole study: **{total / 60:.1f} minutes** of stage time over {len(run_dirs)} seed{'s' * (len(run_dirs) != 1)} (each stage as "
             "long as the invocation that finished it took; world files, the expert's traces and start-up add "
             "seconds)." + (f" This invocation: {wall_s / 60:.1f} minutes of wall-clock time (finished runs are "
                            "reused, so a resumed study's invocation is shorter)." if wall_s is not None else ""), "",
             "| seed | " + " | ".join(groups) + " | total (min) |", "|---|" + "---:|" * (len(groups) + 1)]
    for seed, sums in enumerate(per_seed):
        lines.append(f"| {seed} | " + " | ".join(f"{sums[g]:.0f} s" for g in groups)
                     + f" | {sum(sums.values()) / 60:.1f} |")
    return lines + ["", "Measured on the machine of `seed-0/pipeline/environment.json`; the stages take as many torch "
                    "threads as there are idle cores (at most 2), so a loaded machine runs them slower.", ""]


def forgetting_section(score: Score, run_dirs: Sequence[Path], plots: Path) -> list[str]:
    """Claim 1: MoL vs CE vs CE on feedback only, per trace source."""
    lines = ["## 1. MoL vs CE vs CE on feedback only (forgetting)", "",
             "The paper: pure CE on traces forgets; MoL's KL on decision tokens keeps the model's own "
             "reasoning. *own* traces are the base's collected episodes, *expert* traces another agent's "
             "(same tool and feedback, another wording). *Held-out* measures what the model absorbed from the "
             "feedback, *general* what it kept (forgetting). Decision KL is KL(model || base) per decision token "
             "on the training batches, the mean over the last quarter of MoL steps.", "",
             "| traces | loss | held-out | general | decision KL (end) |", "|---|---|---|---|---|"]
    verdicts = []
    for source, suffix in SOURCES.items():
        kl = {mode: [mol_late_mean(d, mode + suffix) for d in run_dirs] for mode in LOSSES}
        for mode in LOSSES:
            run = mode + suffix
            lines.append(f"| {source} | {mode} | {cell(score(run, 'heldout'))} | {cell(score(run, 'general'))} | "
                         f"{cell(kl[mode], 4)} |")
        verdicts.append(claim_line(CLAIMS["ce_forgets"].fill(source=source), score("mol" + suffix, "general"),
                                   score("ce" + suffix, "general")))
        verdicts.append(claim_line(CLAIMS["mol_over_ce_feedback"].fill(source=source),
                                   score("mol" + suffix, "heldout"), score("ce_feedback" + suffix, "heldout")))
        verdicts.append(claim_line(CLAIMS["ce_moves_decisions"].fill(source=source), kl["ce"], kl["mol"]))
    lines += ["", *verdicts, ""]
    figure = plot_kl(run_dirs, plots / "decision_kl.png")
    if figure is not None:
        lines += [f"![decision KL over MoL training](plots/{figure.name})", ""]
    return lines


def epochs_section(score: Score, run_dirs: Sequence[Path], arms: StudyArms) -> list[str]:
    """Claim 2: 0 / 1 / 3 MoL epochs and the demo's MoL length, each followed by the same GRPO run."""
    lines = ["## 2. MoL length before the same GRPO", "",
             "The paper: more MoL before RL gives RL a better start. Each MoL run is followed by the same GRPO run; "
             "*demo* is the demo's own MoL length (`mol.train.max_steps`).", "",
             "| MoL epochs (steps) | held-out before GRPO | held-out after GRPO | general after GRPO |",
             "|---|---|---|---|"]
    for label, start in arms.epochs.items():
        lines.append(f"| {mol_length(run_dirs, start, label)} | {cell(score(start, 'heldout'))} | "
                     f"{cell(score(start + '+grpo', 'heldout'))} | {cell(score(start + '+grpo', 'general'))} |")
    base = score(arms.epochs["0"] + "+grpo", "heldout")
    lines.append("")
    for label, start in list(arms.epochs.items())[1:]:
        length = mol_length(run_dirs, start, label).replace(" (", " epochs (", 1)
        lines.append(claim_line(CLAIMS["mol_before_grpo"].fill(length=length, label=label),
                                score(start + "+grpo", "heldout"), base,
                                primary=is_primary("study.md", "mol_before_grpo", label=label)))
    return lines + [""]


def mol_length(run_dirs: Sequence[Path], run: str, label: str) -> str:
    """A MoL run's length as trained: ``4.7 (80 steps)`` from its metrics (mean over seeds), ``0`` for the base."""
    if run == "base":
        return "0"
    epochs = [last_value(d, "mol", run, "epoch") for d in run_dirs]
    steps = [last_value(d, "mol", run, "step") for d in run_dirs]
    whose = ", the demo's" if label == "demo" else ""
    return f"{sum(epochs) / len(epochs):.1f} ({sum(steps) / len(steps):.0f} steps{whose})"


def algorithm_section(score: Score, run_dirs: Sequence[Path], plots: Path, arms: StudyArms) -> list[str]:
    """Claim 3: GRPO vs Dr.GRPO from the same MoL model: scores and completion length."""
    runs = arms.algorithms
    lengths = {alg: [late_mean(d, run, LENGTH) for d in run_dirs] for alg, run in runs.items()}
    lines = ["## 3. GRPO vs Dr.GRPO", "",
             f"The paper: Dr.GRPO reduces redundant output length. Both start from `{arms.algorithm_start}`. Length is "
             "the mean completion length (tokens) over the last quarter of training steps.", "",
             "| algorithm | held-out | general | completion length (last quarter) |", "|---|---|---|---|"]
    for alg, run in runs.items():
        lines.append(f"| {alg} | {cell(score(run, 'heldout'))} | {cell(score(run, 'general'))} | "
                     f"{cell(lengths[alg], 1)} |")
    lines += ["", claim_line(CLAIMS["dr_grpo_shorter"], lengths["grpo"], lengths["dr_grpo"]),
              claim_line(CLAIMS["dr_grpo_loses"], score(runs["grpo"], "heldout"), score(runs["dr_grpo"], "heldout")),
              ""]
    figure = plot_lengths(run_dirs, runs, plots / "completion_length.png")
    if figure is not None:
        lines += [f"![completion length per step](plots/{figure.name})", ""]
    return lines


BROKEN = tuple(f"reward_stage/code/{stage}" for stage in ("no_code", "compile_error", "runtime_error"))
"""The GRPO metrics of completions whose code does not run (their fractions of each step's batch)."""
PASSED = "reward_stage/code/all_pass"
"""The GRPO metric of completions whose code passes the test."""


def no_code_section() -> list[str]:
    """Claim 4 on a world without a code-answer family: why it is not measured, and what measuring it needs."""
    return ["## 4. Staged vs binary code reward: not measured on this world", "",
            "The chain world has no code-answer family: every problem is answered with a boxed number and graded by "
            "the math grader, so the code reward's stages (no code, compile error, runtime error, tests pass) never "
            "occur and a staged and a binary run would train on the same rewards. Measuring it here needs chain "
            "code-answer problems (\"Write solve() returning f^k(n).\", one call test, graded by the code grader), "
            "a base trained to answer them in a code fence (the digit world's base learns this from direct code "
            "answers), room for the answer in `sampling.max_new_tokens`, and a held-out code benchmark. The digit "
            "world's study has all of these: `molrl demo --study --world digit`.", ""]


def reward_section(score: Score, run_dirs: Sequence[Path], plots: Path, arms: StudyArms) -> list[str]:
    """Claim 4: the staged code reward vs the binary one, each a GRPO run from the same MoL model."""
    before = score(arms.algorithm_start, CODE)
    lines = ["## 4. Staged vs binary code reward", "",
             "The paper: multi-stage and binary rewards are both robust. Both runs start from "
             f"`{arms.algorithm_start}` and train on the code-answer problems (write `solve()` returning the call's value); "
             "the staged reward scores no code 0, a compile error 0.1, a runtime error 0.2, a wrong value 0.3 and "
             "a pass 1, the binary one a pass 1 and the rest 0. *Broken* is the fraction of sampled completions "
             "with no code, a compile error or a runtime error over the last quarter of training steps.", "",
             "| reward | code before GRPO | code after GRPO | general after GRPO | broken completions (last quarter) |",
             "|---|---|---|---|---|"]
    for mode, run in arms.rewards.items():
        broken = [late_mean(d, run, *BROKEN) for d in run_dirs]
        lines.append(f"| {mode} | {cell(before)} | {cell(score(run, CODE))} | {cell(score(run, 'general'))} | "
                     f"{cell(broken)} |")
    lines.append("")
    for mode, run in arms.rewards.items():
        lines.append(claim_line(CLAIMS["reward_learns"].fill(mode=mode), score(run, CODE), before))
    lines += [claim_line(CLAIMS["staged_over_binary"], score(arms.rewards["staged"], CODE),
                         score(arms.rewards["binary"], CODE)), ""]
    figure = plot_reward_stages(run_dirs, plots / "code_reward_stages.png", arms.rewards)
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
    plt = pyplot()
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
    return save_figure(fig, path)


def plot_kl(run_dirs: Sequence[Path], path: Path) -> Path | None:
    """Decision-token KL to the base per MoL step, one line per loss, one panel per trace source (mean over seeds)."""
    panels = {f"{source} traces: KL(model || base) on decision tokens":
              {mode: [metric_series(read_metrics(d / "mol" / (mode + suffix) / "metrics.jsonl"), KL)
                      for d in run_dirs] for mode in LOSSES}
              for source, suffix in SOURCES.items()}
    return plot_panels(panels, "MoL optimiser step", path)


def plot_reward_stages(run_dirs: Sequence[Path], path: Path, rewards: dict[str, str]) -> Path | None:
    """Per GRPO step, the fraction of completions that pass and that are broken, staged vs binary (mean over seeds)."""
    panels = {title: {mode: [summed_series(d, run, keys) for d in run_dirs] for mode, run in rewards.items()}
              for title, keys in (("code passes the test", (PASSED,)),
                                  ("broken: no code, compile or runtime error", BROKEN))}
    return plot_panels(panels, "GRPO step", path, "fraction of sampled completions")


def plot_lengths(run_dirs: Sequence[Path], runs: dict[str, str], path: Path) -> Path | None:
    """Mean completion length per GRPO step, one line per algorithm (mean over seeds)."""
    panels = {"completion length": {alg: [summed_series(d, run, [LENGTH]) for d in run_dirs] for alg, run in runs.items()}}
    return plot_panels(panels, "GRPO step", path, "mean completion length (tokens)")


def plot_general_vs_heldout(score: Score, path: Path, models: Sequence[str]) -> Path:
    """One point per model: held-out (x) against general (y) accuracy, means over seeds with standard-error bars
    (grey: the base, red: RL runs, blue: MoL runs)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    for model in models:
        (x, xe), (y, ye) = mean_se(score(model, "heldout")), mean_se(score(model, "general"))
        colour = "tab:gray" if model == "base" else "tab:red" if "grpo" in model else "tab:blue"
        ax.errorbar([x], [y], xerr=[xe], yerr=[ye], marker="o", color=colour, capsize=3)
        ax.annotate(model, (x, y), fontsize=7, xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel("held-out accuracy (absorbed)")
    ax.set_ylabel("general accuracy (kept)")
    ax.set_xlim(-0.05, 1.05)
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)
