"""Eval outputs: ``results.json``, a markdown table, and side-by-side comparison of several runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from molrl.errors import MolrlError

HEADLINE = ("pass@1",)  # first columns of every table; the rest follow in a fixed order


def write_results(run_dir: Path, results: dict[str, Any]) -> None:
    """Write ``results.json`` and ``results.md`` for a finished run."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (run_dir / "results.md").write_text(results_markdown(results))


def metric_names(benchmarks: dict[str, dict[str, Any]]) -> list[str]:
    """The numeric metrics present in any benchmark, headline first, then pass@k, avg@n, maj@n."""
    names = {k for m in benchmarks.values() for k, v in m.items() if "@" in k and isinstance(v, (int, float))}

    def order(name: str) -> tuple[int, str, int]:
        kind, _, k = name.partition("@")
        rank = {"pass": 0, "avg": 1, "maj": 2}.get(kind, 3)
        return (rank, kind, int(k) if k.isdigit() else 0)

    return sorted(names, key=order)


def results_markdown(results: dict[str, Any]) -> str:
    """A markdown summary: one row per benchmark, then MATH-500-style breakdowns where present."""
    benchmarks = results["benchmarks"]
    cols = metric_names(benchmarks)
    lines = [f"# Evaluation: {results.get('label', '')}", ""]
    lines += [f"mode: {results.get('mode', '')}", ""]
    lines.append("| benchmark | problems | samples | " + " | ".join(cols) + " |")
    lines.append("|---|---:|---:|" + "---:|" * len(cols))
    for name, m in benchmarks.items():
        cells = [_pct(m.get(c)) for c in cols]
        lines.append(f"| {name} | {m.get('problems', 0)} | {m.get('samples', 0)} | " + " | ".join(cells) + " |")
    for name, m in benchmarks.items():
        for key in ("by_subject", "by_level"):
            if key in m:
                lines += ["", f"## {name} {key.replace('_', ' ')}", "", "| group | problems | pass@1 |", "|---|---:|---:|"]
                lines += [f"| {g} | {v['problems']} | {_pct(v['pass@1'])} |" for g, v in m[key].items()]
    return "\n".join(lines) + "\n"


def load_run(run_dir: str | Path) -> dict[str, Any]:
    """The ``results.json`` of a finished run directory."""
    path = Path(run_dir) / "results.json"
    if not path.is_file():
        raise MolrlError(f"{run_dir}: no results.json; is this an eval run directory that finished?")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise MolrlError(f"{path}: not valid JSON ({err.msg}); re-run the eval to rewrite it") from None


def compare_table(runs: Sequence[tuple[str, dict[str, Any]]], metric: str = "pass@1") -> str:
    """A markdown table of ``metric``: one row per benchmark, one column per run."""
    benchmarks = _benchmark_union(runs)
    lines = ["| benchmark | " + " | ".join(label for label, _ in runs) + " |", "|---|" + "---:|" * len(runs)]
    for b in benchmarks:
        cells = [_pct(r["benchmarks"].get(b, {}).get(metric)) for _, r in runs]
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def compare_chart(runs: Sequence[tuple[str, dict[str, Any]]], path: Path, metric: str = "pass@1") -> Path:
    """A grouped bar chart of ``metric`` per benchmark, one bar per run, saved as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    benchmarks = _benchmark_union(runs)
    width = 0.8 / len(runs)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(benchmarks) + 2), 4.5))
    for i, (label, r) in enumerate(runs):
        values = [100 * (r["benchmarks"].get(b, {}).get(metric) or 0.0) for b in benchmarks]
        xs = [j + (i - (len(runs) - 1) / 2) * width for j in range(len(benchmarks))]
        bars = ax.bar(xs, values, width=width, label=label)
        ax.bar_label(bars, fmt="%.1f", fontsize=8, padding=2)
    ax.set_xticks(range(len(benchmarks)), benchmarks)
    ax.set_ylabel(f"{metric} (%)")
    ax.set_ylim(0, 105)
    ax.set_title(f"{metric} by benchmark")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=min(len(runs), 3), fontsize=8, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _benchmark_union(runs: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    seen: dict[str, None] = {}
    for _, r in runs:
        seen.update(dict.fromkeys(r["benchmarks"]))
    return list(seen)


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.1f}"
