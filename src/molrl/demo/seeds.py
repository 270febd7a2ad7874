"""The demo's headline over seeds: MoL + RL against the same RL from the base, per seed and in summary.

The headline pairs are read from each run's config: every GRPO run that starts from the base is
paired with each GRPO run that starts from a MoL run with the same overrides (the same RL, only
the starting point differs). For each pair and benchmark the summary gives both scores per seed,
their means with the standard error over seeds, the range, and the mean paired difference.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import yaml

from molrl.config.renames import current_names
from molrl.pipeline.config import PipelineConfig
from molrl.report import accuracy, eval_results

BASE = "base"


def headline_pairs(config: dict[str, Any]) -> list[tuple[str, str]]:
    """(MoL-start run, base-start run) names of RL runs that differ only in where they start."""
    runs = config.get("rl_runs", [])
    from_base = [r for r in runs if r.get("start") == BASE]
    return [(mol["name"], base["name"]) for base in from_base for mol in runs
            if mol.get("start") != BASE and list(mol.get("overrides", [])) == list(base.get("overrides", []))]


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error (sample standard deviation / sqrt(n); 0 for one value).

    >>> [round(x, 6) for x in mean_se([0.5, 0.7, 0.9])]
    [0.7, 0.11547]
    """
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def cell(values: Sequence[float], digits: int = 3) -> str:
    """``mean ± se [v1, v2, ...]`` of per-seed values.

    >>> cell([0.5, 0.7, 0.9], 2)
    '0.70 ± 0.12 [0.50, 0.70, 0.90]'
    """
    mean, se = mean_se(values)
    return f"{mean:.{digits}f} ± {se:.{digits}f} [" + ", ".join(f"{v:.{digits}f}" for v in values) + "]"


def seed_summary(run_dirs: Sequence[Path]) -> str:
    """Markdown: the headline pairs' scores per seed and over seeds, for the demo runs in ``run_dirs``.

    Each of ``run_dirs`` is one seed's ``pipeline/`` directory (config.yaml and eval/ inside).
    """
    configs = [current_names(PipelineConfig, yaml.safe_load((Path(d) / "config.yaml").read_text()))
               for d in run_dirs]
    results = [eval_results(Path(d)) for d in run_dirs]
    pairs = headline_pairs(configs[0])
    lines = [f"## Headline over {len(run_dirs)} seeds", "",
             "World and training seeds 0 to {} (seed 0 is the run above). Scores are single-step pass@1; "
             "± is the standard error over seeds.".format(len(run_dirs) - 1), ""]
    if not pairs:
        return "\n".join(lines + ["_No RL run from the base has a MoL-started twin to compare with._", ""])
    benchmarks = list(results[0].get(BASE, next(iter(results[0].values())))["benchmarks"])
    lines += ["| benchmark | model | mean ± s.e. | range | per seed |", "|---|---|---|---|---|"]
    verdicts = []
    for mol_run, base_run in pairs:
        for bench in benchmarks:
            scores = {name: [accuracy(r[name]["benchmarks"][bench])[0] for r in results] for name in (mol_run, base_run)}
            for name, values in scores.items():
                mean, se = mean_se(values)
                lines.append(f"| {bench} | {name} | {mean:.3f} ± {se:.3f} | {min(values):.3f}–{max(values):.3f} | "
                             + ", ".join(f"{v:.3f}" for v in values) + " |")
            diff, diff_se = mean_se([a - b for a, b in zip(scores[mol_run], scores[base_run])])
            wins = sum(a > b for a, b in zip(scores[mol_run], scores[base_run]))
            verdicts.append(f"- {bench}: {mol_run} − {base_run} = {diff:+.3f} ± {diff_se:.3f} (paired over seeds); "
                            f"{mol_run} higher in {wins} of {len(run_dirs)} seeds.")
    return "\n".join(lines + ["", *verdicts, ""])
