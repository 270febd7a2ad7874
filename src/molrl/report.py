"""``report.md`` of a pipeline run: configuration, single-step score table, plots, measured findings.

Everything is read back from the run directory (the resolved ``config.yaml``, each stage's
``metrics.jsonl`` and each evaluated model's ``results.json``), so a report can be rebuilt at any
time and never states a number that is not on disk. Plots use matplotlib's Agg backend.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml

from molrl.records.jsonl import read_records
from molrl.logs.plots import metric_series, pyplot, save_figure
from molrl.records.layout import rl_runs
from molrl.records.writes import write_text

BASE = "base"


def write_report(run_dir: str | Path) -> Path:
    """Write ``report.md`` and ``plots/*.png`` for the pipeline run in ``run_dir``; returns the report path."""
    run_dir = Path(run_dir)
    config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    if "grpo_runs" in config:  # a run saved before the pipeline's RL runs were named rl_runs
        config["rl_runs"] = config.pop("grpo_runs")
    results = eval_results(run_dir, run_order(config))
    plots = run_dir / "plots"
    plots.mkdir(exist_ok=True)
    figures = [
        ("MoL loss terms per step", plot_mol(run_dir, plots / "mol_losses.png")),
        ("GRPO reward per step", plot_grpo(run_dir, plots / "grpo_reward.png")),
        ("Single-step accuracy", plot_eval(results, plots / "eval_accuracy.png")),
    ]
    lines = [f"# {config.get('title', 'MoL-RL pipeline')}", ""]
    lines += collection_summary(run_dir)
    lines += ["## Single-step scores", "", score_table(results, config), "", *truncation_lines(results)]
    lines += ["## What the runs show (as measured)", "", *findings(results, config), *reward_findings(run_dir), ""]
    for title, path in figures:
        if path is not None:
            lines += [f"## {title}", "", f"![{title}](plots/{path.name})", ""]
    lines += timing_table(stage_times(run_dir, config))
    lines += reproducibility(run_dir)
    lines += ["## Configuration", "", "```yaml", yaml.safe_dump(config, sort_keys=False).rstrip(), "```", ""]
    report = run_dir / "report.md"
    write_text(report, "\n".join(lines))
    return report


def run_order(config: dict[str, Any]) -> list[str]:
    """Model names in report order: the base, the MoL runs, then the GRPO runs."""
    return [BASE, *(r["name"] for r in config.get("mol_runs", [])), *(r["name"] for r in config.get("rl_runs", []))]


def eval_results(run_dir: Path, order: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """``results.json`` of every evaluated model, by model name, in ``order`` (others after, by name)."""
    rank = {name: i for i, name in enumerate(order or [BASE])}
    paths = sorted((run_dir / "eval").glob("*/results.json"), key=lambda p: (rank.get(p.parent.name, len(rank)), p.parent.name))
    return {path.parent.name: json.loads(path.read_text()) for path in paths}


def accuracy(metrics: dict[str, Any]) -> tuple[float, int, int]:
    """(pass@1, problems, samples) of one benchmark's metrics."""
    return float(metrics.get("pass@1", float("nan"))), int(metrics.get("problems", 0)), int(metrics.get("samples", 0))


def benchmark_names(results: dict[str, dict[str, Any]]) -> list[str]:
    """Every benchmark of any model, in the order they were first evaluated."""
    return list(dict.fromkeys(b for r in results.values() for b in r.get("benchmarks", {})))


def standard_error(p: float, n: int) -> float:
    """Binomial standard error of an accuracy over ``n`` problems: sqrt(p (1 - p) / n)."""
    return math.sqrt(p * (1 - p) / n) if n > 0 and 0 <= p <= 1 else float("nan")


def model_origin(name: str, config: dict[str, Any]) -> str:
    """What a model is, in words: the base, a MoL run's mode, or a GRPO run's algorithm and start."""
    if name == BASE:
        return "base model"
    for run in config.get("mol_runs", []):
        if run["name"] == name:
            return "MoL stage " + " ".join(run.get("overrides", [])).strip()
    for run in config.get("rl_runs", []):
        if run["name"] == name:
            return f"GRPO stage from {run.get('start')} " + " ".join(run.get("overrides", [])).strip()
    return ""


def score_table(results: dict[str, dict[str, Any]], config: dict[str, Any]) -> str:
    """Markdown table: one row per model, one column per benchmark: pass@1 ± s.e. (problems x samples), and the
    share of answers cut at the token limit when there is any."""
    if not results:
        return "_No model was evaluated._"
    benchmarks = benchmark_names(results)
    head = "| model | what | " + " | ".join(f"{b} pass@1 ± s.e. (problems × samples/problem)" for b in benchmarks) + " |"
    lines = [head, "|" + "---|" * (2 + len(benchmarks))]
    for name, result in results.items():
        cells = []
        for bench in benchmarks:
            metrics = result.get("benchmarks", {}).get(bench)
            if metrics is None:
                cells.append("—")
                continue
            p, problems, samples = accuracy(metrics)
            per = samples // problems if problems else 0
            cut = metrics.get("truncated") or 0.0
            cells.append(f"{p:.3f} ± {standard_error(p, problems):.3f} ({problems} × {per})"
                         + (f"; {cut:.3f} cut" if cut > 0 else ""))
        lines.append(f"| {name} | {model_origin(name, config)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def truncation_lines(results: dict[str, dict[str, Any]]) -> list[str]:
    """What the token limit cut: a line saying none was cut, or the share per model and benchmark, and a warning
    line for each share past ``molrl.eval.report.TRUNCATION_WARNING`` (results from before answers recorded
    whether they were cut: nothing)."""
    from molrl.eval.report import truncation_warnings

    shares = {(name, bench): m["truncated"] for name, r in results.items()
              for bench, m in r.get("benchmarks", {}).items() if isinstance(m.get("truncated"), (int, float))}
    if not shares:
        return []
    limits = sorted({r.get("sampling", {}).get("max_new_tokens") for r in results.values()} - {None})
    limit = f" of {', '.join(map(str, limits))} new tokens" if limits else ""
    cut = {key: share for key, share in shares.items() if share > 0}
    if not cut:
        return [f"No answer was cut at the token limit{limit}.", ""]
    lines = [f"Answers cut at the token limit{limit} (share of samples): "
             + ", ".join(f"{name} {bench} {share:.3f}" for (name, bench), share in cut.items()) + ".", ""]
    warnings = [w for name, r in results.items() for w in truncation_warnings(
        r.get("benchmarks", {}), r.get("sampling", {}).get("max_new_tokens"), f"{name}, ")]
    return lines + ([*warnings, ""] if warnings else [])


def findings(results: dict[str, dict[str, Any]], config: dict[str, Any]) -> list[str]:
    """Plain statements of the measured differences: each model against the base, each GRPO run against its start."""
    if BASE not in results:
        return ["- The base model was not evaluated, so no model is compared against it."]
    out = []
    starts = {r["name"]: r.get("start") for r in config.get("rl_runs", [])}
    for bench, base_metrics in results[BASE].get("benchmarks", {}).items():
        base_p, n, _ = accuracy(base_metrics)
        scores = {name: accuracy(r["benchmarks"][bench])[0] for name, r in results.items() if bench in r.get("benchmarks", {})}
        best = max(scores, key=lambda k: scores[k])
        out.append(f"- **{bench}** ({n} problems): base {base_p:.3f}; best {best} {scores[best]:.3f} "
                   f"({scores[best] - base_p:+.3f} vs base).")
        for name, p in scores.items():
            if name == BASE:
                continue
            note = f"  - {name}: {p:.3f} ({p - base_p:+.3f} vs base, {_in_standard_errors(p, base_p, n)}"
            start = starts.get(name)
            if start in scores:
                note += f", {p - scores[start]:+.3f} vs its start {start}"
            out.append(note + ")")
    mol_names = [r["name"] for r in config.get("mol_runs", []) if r["name"] in results]
    if len(mol_names) > 1:
        for bench in results[BASE].get("benchmarks", {}):
            ranked = sorted(mol_names, key=lambda k: -accuracy(results[k]["benchmarks"].get(bench, {}))[0])
            out.append(f"- MoL-stage ablation on {bench}, best first: "
                       + ", ".join(f"{k} {accuracy(results[k]['benchmarks'].get(bench, {}))[0]:.3f}" for k in ranked))
    return out


def _in_standard_errors(p: float, q: float, n: int) -> str:
    """How many standard errors of the difference ``p - q`` apart two pass@1 scores on ``n`` problems are."""
    se = (standard_error(p, n) ** 2 + standard_error(q, n) ** 2) ** 0.5
    return f"{(p - q) / se:+.1f} s.e." if se > 0 else "no spread"


def reward_findings(run_dir: Path, window: int = 10) -> list[str]:
    """Each GRPO run's mean training reward over its first and its last ``window`` logged steps."""
    out = []
    for path in sorted(rl_runs(run_dir).glob("*/metrics.jsonl")):
        _, rewards = metric_series(read_metrics(path), "reward")
        if len(rewards) >= 2 * window:
            first, last = sum(rewards[:window]) / window, sum(rewards[-window:]) / window
            out.append(f"- GRPO training reward of {path.parent.name}: {first:.3f} over its first {window} steps, "
                       f"{last:.3f} over its last {window} ({len(rewards)} steps)")
    return out


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a ``metrics.jsonl`` (missing file: none)."""
    return read_records(path) if path.is_file() else []


def plot_mol(run_dir: Path, path: Path) -> Path | None:
    """CE on feedback tokens and KL on decision tokens per step, one line per MoL run."""
    runs = {p.parent.name: read_metrics(p) for p in sorted((run_dir / "mol").glob("*/metrics.jsonl"))}
    runs = {k: v for k, v in runs.items() if v}
    if not runs:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, title, scale in ((axes[0], "ce_feedback", "CE on feedback tokens (nats/token)", "log"),
                                  (axes[1], "kl_decision", "KL(policy || base) on decision tokens (nats/token)", "linear")):
        for name, rows in runs.items():
            steps, values = metric_series(rows, key)
            if steps:
                ax.plot(steps, values, marker=".", label=name)
        ax.set_title(title)
        ax.set_xlabel("optimiser step")
        ax.set_yscale(scale)
        ax.grid(alpha=0.3)
        ax.legend()
    return save_figure(fig, path)


def plot_grpo(run_dir: Path, path: Path) -> Path | None:
    """Mean reward per step (and its running mean over 5 steps), one colour per GRPO run."""
    runs = {p.parent.name: read_metrics(p) for p in sorted(rl_runs(run_dir).glob("*/metrics.jsonl"))}
    runs = {k: v for k, v in runs.items() if metric_series(v, "reward")[0]}
    if not runs:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    for name, rows in runs.items():
        steps, values = metric_series(rows, "reward")
        line = ax.plot(steps, values, alpha=0.35)[0]
        smooth = [sum(values[max(0, i - 4) : i + 1]) / len(values[max(0, i - 4) : i + 1]) for i in range(len(values))]
        ax.plot(steps, smooth, color=line.get_color(), linewidth=2, label=f"{name} (5-step mean)")
    ax.set_title("GRPO mean reward per step")
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("reward")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend()
    return save_figure(fig, path)


def plot_eval(results: dict[str, dict[str, Any]], path: Path) -> Path | None:
    """Grouped bars: single-step pass@1 of every model on every benchmark, with standard-error bars."""
    if not results:
        return None
    plt = pyplot()
    benchmarks = benchmark_names(results)
    names = list(results)
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(min(12, max(6, 0.8 * len(names) * len(benchmarks))), 5))
    for i, name in enumerate(names):
        xs, ps, errs = [], [], []
        for j, bench in enumerate(benchmarks):
            metrics = results[name].get("benchmarks", {}).get(bench)
            if metrics is None:
                continue
            p, n, _ = accuracy(metrics)
            xs.append(j + (i - (len(names) - 1) / 2) * width)
            ps.append(p)
            errs.append(standard_error(p, n))
        bars = ax.bar(xs, ps, width, yerr=errs, capsize=2, label=name)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(range(len(benchmarks)), [f"{b}\n(n={accuracy(next(iter(results.values()))['benchmarks'].get(b, {}))[1]})" for b in benchmarks])
    ax.set_ylabel("single-step pass@1")
    ax.set_ylim(0, 1.1)
    ax.set_title("Single-step accuracy (no execution feedback)")
    ax.legend(fontsize=8, ncol=min(4, len(names)), loc="upper center", bbox_to_anchor=(0.5, -0.15))
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)


def collection_summary(run_dir: Path) -> list[str]:
    """A paragraph on the collected traces: how many, how many solved, and how many carry feedback."""
    traces = run_dir / "collect" / "traces.jsonl"
    if not traces.is_file():
        return []
    records = read_records(traces)
    if not records:
        return []
    metas = [r.get("meta", {}) for r in records]
    solved = sum(bool(m.get("success")) for m in metas)
    turns = sum(int(m.get("turns", 0)) for m in metas) / len(metas)
    feedback = [sum(m.get("role") == "tool" for m in r.get("messages", [])) for r in records]
    with_feedback = sum(n > 0 for n in feedback)
    return ["## Collected traces", "",
            f"{len(metas)} episodes of the base model in the sandbox; {solved} solved "
            f"({solved / len(metas):.3f}); mean {turns:.2f} model turns per episode. "
            f"A low solve rate is expected and harmless: MoL learns from the environment's feedback, not from "
            f"solved episodes, and {with_feedback} of {len(records)} episodes carry feedback "
            f"({sum(feedback)} tool messages).", ""]


def stage_times(run_dir: Path, config: dict[str, Any]) -> list[tuple[str, float]]:
    """(stage, wall-clock seconds) of every stage the run holds, in pipeline order: the base model's making when its
    directory records it (the demo's base: ``timing.json``), then each finished stage, as long as the invocation
    that finished it took (its ``DONE`` marker), so a re-run that skipped it does not show it as free."""
    times = []
    made = Path(str(config.get("model", ""))) / "timing.json"
    if config.get("model") and made.is_file():
        times.append(("base model (made before the pipeline)", float(json.loads(made.read_text())["seconds"])))
    rank = {name: i for i, name in enumerate(run_order(config))}
    evaluated = sorted((p.parent.name for p in (run_dir / "eval").glob("*/DONE")), key=lambda n: (rank.get(n, len(rank)), n))
    stages = ["collect", *(f"mol/{r['name']}" for r in config.get("mol_runs", [])),
              *(f"{rl_runs(run_dir).name}/{r['name']}" for r in config.get("rl_runs", [])), *(f"eval/{name}" for name in evaluated)]
    for stage in stages:
        marker = run_dir / stage / "DONE"
        if marker.is_file():
            times.append((stage, float(json.loads(marker.read_text()).get("seconds", float("nan")))))
    return times


def timing_table(times: list[tuple[str, float]]) -> list[str]:
    """The report's timing section: one row per stage and their total."""
    if not times:
        return []
    lines = ["## Stage wall-clock times (seconds)", "", "| stage | s |", "|---|---:|"]
    lines += [f"| {stage} | {seconds:.1f} |" for stage, seconds in times]
    return lines + [f"| total | {sum(s for _, s in times):.1f} |", ""]


def reproducibility(run_dir: Path) -> list[str]:
    """What a reader may expect when running this config again, here and elsewhere."""
    env_path = run_dir / "environment.json"
    env = json.loads(env_path.read_text()) if env_path.is_file() else {}
    versions = ", ".join(f"{k} {v}" for k, v in env.get("versions", {}).items() if v)
    where = f"{env.get('cpu', 'unknown CPU')}, {env.get('cores', '?')} cores" + (f", {env['cuda']}" if env.get("cuda") else "")
    return ["## Reproducibility", "",
            f"Measured on {where}; {versions}. Every seed is fixed in the configuration below, so the same "
            "machine and the same configuration give the same table. Another machine gives other numbers: its "
            "BLAS kernels round differently, a small difference early in training changes which completions RL "
            "samples, and the scores drift apart while the comparisons between runs usually hold. Compare runs "
            "over seeds (the demo's `--seeds 3`), not exact numbers across machines.", ""]
