"""Eval outputs: ``results.json``, a markdown table, and side-by-side comparison of several runs.

Scores are fractions in [0, 1] everywhere (tables, comparisons, charts), as in the pipeline report. Each
benchmark also shows the share of samples the token limit cut (``truncated``), with a warning line when it
passes ``TRUNCATION_WARNING``: a cut answer usually lost its final answer, so its score says little. Samples the
sandbox or the grader could not judge are left out of the scores and named in a note (``no_verdict_notes``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from molrl.errors import MolrlError
from molrl.records.writes import write_text

HEADLINE = ("pass@1",)  # first columns of every table; the rest follow in a fixed order

TRUNCATION_WARNING = 0.05
"""Share of samples cut at max_new_tokens above which a table is followed by a warning line."""


def write_results(run_dir: Path, results: dict[str, Any]) -> None:
    """Write ``results.json`` and ``results.md`` for a finished run, each atomically."""
    write_text(run_dir / "results.md", results_markdown(results))
    write_text(run_dir / "results.json", json.dumps(results, indent=2) + "\n")  # last: what "finished" reads


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
    cols = list(dict.fromkeys([*HEADLINE, *metric_names(benchmarks)]))  # pass@1 even where no sample was judged
    lines = [f"# Evaluation: {results.get('label', '')}", ""]
    lines += [f"mode: {results.get('mode', '')}", ""]
    limit = (results.get("sampling") or {}).get("max_new_tokens")
    lines.append("| benchmark | problems | samples | " + " | ".join(cols) + " | cut at the token limit |")
    lines.append("|---|---:|---:|" + "---:|" * (len(cols) + 1))
    for name, m in benchmarks.items():
        cells = [_fraction(m.get(c)) for c in cols] + [_fraction(m.get("truncated"))]
        lines.append(f"| {name} | {m.get('problems', 0)} | {m.get('samples', 0)} | " + " | ".join(cells) + " |")
    warnings = no_verdict_notes(benchmarks) + truncation_warnings(benchmarks, limit) + held_back_notes(benchmarks)
    if warnings:
        lines += ["", *warnings]
    for name, m in benchmarks.items():
        for key in ("by_subject", "by_level"):
            if key in m:
                lines += ["", f"## {name} {key.replace('_', ' ')}", "", "| group | problems | pass@1 |", "|---|---:|---:|"]
                lines += [f"| {g} | {v['problems']} | {_fraction(v['pass@1'])} |" for g, v in m[key].items()]
    return "\n".join(lines) + "\n"


def no_verdict_notes(benchmarks: dict[str, dict[str, Any]]) -> list[str]:
    """A note for each benchmark with samples whose grading failed (no verdict: left out of its metrics), a warning for
    one where no sample could be judged (it has no pass@1, never 0).

    >>> no_verdict_notes({"mbpp": {"sandbox_errors": 3, "grader_errors": 0, "problems_without_verdict": 1, "samples": 5}})
    ['- mbpp: 3 samples could not be judged (3 sandbox errors, 0 grader errors) and are left out of every metric, with the 1 problem that had no judged sample.']
    >>> no_verdict_notes({"mbpp": {"sandbox_errors": 4, "grader_errors": 0, "problems_without_verdict": 2, "samples": 0}})
    ['- **Warning**: mbpp: no sample could be judged (4 sandbox errors, 0 grader errors), so there is no accuracy to report; check the sandbox and run again.']
    """
    out = []
    for name, m in benchmarks.items():
        sandbox, grader = m.get("sandbox_errors") or 0, m.get("grader_errors") or 0
        if not sandbox + grader:
            continue
        counts = f"{sandbox} sandbox error{'s' * (sandbox != 1)}, {grader} grader error{'s' * (grader != 1)}"
        if not m.get("samples"):
            out.append(f"- **Warning**: {name}: no sample could be judged ({counts}), so there is no accuracy to "
                       "report; check the sandbox and run again.")
            continue
        lost = m.get("problems_without_verdict") or 0
        problems = f", with the {lost} problem{'s' * (lost != 1)} that had no judged sample" if lost else ""
        n = sandbox + grader
        out.append(f"- {name}: {n} sample{'s' * (n != 1)} could not be judged ({counts}) and "
                   f"{'are' if n != 1 else 'is'} left out of every metric{problems}.")
    return out


def held_back_notes(benchmarks: dict[str, dict[str, Any]]) -> list[str]:
    """A note for each code benchmark with problems that hold no test back (graded on all their tests, or scored apart
    where the policy saw them all), and with problems whose held-back tests a constant return passes.

    >>> held_back_notes({"mbpp": {"no_held_back": 1}, "humaneval": {"no_held_back": 0}})
    ['- mbpp: 1 problem holds no test back (shown_pass@1 and held_back_pass@1 leave it out; pass@1 grades all its tests).']
    >>> held_back_notes({"humaneval": {"no_held_back": 2, "unsplit": 2, "unsplit_pass@1": 0.5, "constant_answer": 1}})[0]
    '- humaneval: 2 problems hold no test back and the policy saw every test that decides them: left out of pass@1, scored apart (unsplit_pass@1 0.500).'
    """
    out = []
    for name, m in benchmarks.items():
        apart = m.get("unsplit") or 0
        n = (m.get("no_held_back") or 0) - apart
        if n > 0:
            it, its = ("it", "its") if n == 1 else ("them", "their")
            out.append(f"- {name}: {n} problem{' holds' if n == 1 else 's hold'} no test back (shown_pass@1 and "
                       f"held_back_pass@1 leave {it} out; pass@1 grades all {its} tests).")
        if apart:
            out.append(f"- {name}: {apart} problem{' holds' if apart == 1 else 's hold'} no test back and the policy "
                       f"saw every test that decides {'it' if apart == 1 else 'them'}: left out of pass@1, scored "
                       f"apart (unsplit_pass@1 {m.get('unsplit_pass@1', 0.0):.3f}).")
        weak = m.get("constant_answer")
        if weak:
            out.append(f"- {name}: {weak} problem{' passes' if weak == 1 else 's pass'} the held-back tests with a "
                       "constant return, the value a shown test expects (in pass@1; RL leaves such tasks out).")
    return out


def truncation_warnings(benchmarks: dict[str, dict[str, Any]], limit: int | None = None, who: str = "") -> list[str]:
    """A warning line for each benchmark whose share of samples cut at the token limit passes ``TRUNCATION_WARNING``.

    >>> truncation_warnings({"heldout": {"truncated": 0.22, "samples": 50}, "general": {"truncated": 0.0}}, 48)
    ['- **Warning**: heldout: 11 of 50 samples (0.220) hit the limit of 48 new tokens before the answer ended; raise max_new_tokens.']
    """
    out = []
    for name, m in benchmarks.items():
        share = m.get("truncated")
        if isinstance(share, (int, float)) and share > TRUNCATION_WARNING:
            count = f"{round(share * m['samples'])} of {m['samples']} samples ({share:.3f})" if m.get("samples") \
                else f"{share:.3f} of the samples"
            cap = f"the limit of {limit} new tokens" if limit else "the token limit"
            out.append(f"- **Warning**: {who}{name}: {count} hit {cap} before the answer ended; raise max_new_tokens.")
    return out


def load_run(run_dir: str | Path) -> dict[str, Any]:
    """The ``results.json`` of a finished run directory."""
    path = Path(run_dir) / "results.json"
    if not path.is_file():
        raise MolrlError(f"{run_dir}: no results.json; is this an eval run directory that finished?")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise MolrlError(f"{path}: not valid JSON ({err.msg}); re-run the eval to rewrite it") from None


def run_labels(run_dirs: Sequence[str | Path]) -> list[str]:
    """A short name for each run directory: its folder name, with as many parent folders as it takes to tell
    two runs of the same folder name apart.

    >>> run_labels(["runs/demo/pipeline/eval/base", "runs/demo/pipeline/eval/mol+grpo"])
    ['base', 'mol+grpo']
    >>> run_labels(["runs/a/eval", "runs/b/eval", "x/base"])
    ['a/eval', 'b/eval', 'base']
    """
    parts = [Path(d).resolve().parts for d in run_dirs]
    depth = [1] * len(parts)
    while True:
        labels = ["/".join(p[-n:]) for p, n in zip(parts, depth)]
        clashing = [i for i, label in enumerate(labels) if labels.count(label) > 1 and depth[i] < len(parts[i])]
        if not clashing:
            return labels
        for i in clashing:
            depth[i] += 1


def compare_table(runs: Sequence[tuple[str, dict[str, Any]]], metric: str = "pass@1") -> str:
    """A markdown table of ``metric`` (a fraction): one row per benchmark, one column per run; then a warning line
    for each run and benchmark whose samples the token limit cut too often."""
    benchmarks = _benchmark_union(runs)
    lines = ["| benchmark | " + " | ".join(label for label, _ in runs) + " |", "|---|" + "---:|" * len(runs)]
    for b in benchmarks:
        cells = [_fraction(r["benchmarks"].get(b, {}).get(metric)) for _, r in runs]
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    warnings = [w for label, r in runs for w in truncation_warnings(
        r["benchmarks"], (r.get("sampling") or {}).get("max_new_tokens"), f"{label}, ")]
    return "\n".join([*lines, *([""] + warnings if warnings else [])]) + "\n"


def compare_chart(runs: Sequence[tuple[str, dict[str, Any]]], path: Path, metric: str = "pass@1") -> Path:
    """A grouped bar chart of ``metric`` per benchmark, one bar per run, saved as PNG."""
    from molrl.logs.plots import pyplot, save_figure

    plt = pyplot()
    benchmarks = _benchmark_union(runs)
    width = 0.8 / len(runs)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(benchmarks) + 2), 4.5))
    for i, (label, r) in enumerate(runs):
        values = [r["benchmarks"].get(b, {}).get(metric) or 0.0 for b in benchmarks]
        xs = [j + (i - (len(runs) - 1) / 2) * width for j in range(len(benchmarks))]
        bars = ax.bar(xs, values, width=width, label=label)
        ax.bar_label(bars, fmt="%.3f", fontsize=8, padding=2)
    ax.set_xticks(range(len(benchmarks)), benchmarks)
    ax.set_ylabel(metric)
    ax.set_ylim(0, 1.05)
    ax.set_title(f"{metric} by benchmark")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=min(len(runs), 3), fontsize=8, frameon=False)
    return save_figure(fig, path, dpi=120)


def _benchmark_union(runs: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    seen: dict[str, None] = {}
    for _, r in runs:
        seen.update(dict.fromkeys(r["benchmarks"]))
    return list(seen)


def _fraction(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}"
