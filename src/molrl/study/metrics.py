"""What the study's report reads back from each seed's pipeline directory: scores, and logged training metrics."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Sequence

from molrl.demo.seeds import mean_se
from molrl.errors import MolrlError
from molrl.records.layout import rl_runs
from molrl.logs.plots import metric_series
from molrl.report import accuracy, eval_results, read_metrics

KL = "kl_decision"
"""MoL's logged decision-token KL(model || base) per step."""
RL_KL = "loss/decision_kl"
"""RL's logged decision-KL term (``loss.kl_weight``: KL(policy || base) per sampled token) per step."""

Score = Callable[[str, str], list[float]]
"""score(model, benchmark) -> pass@1 per seed."""


def scorer(run_dirs: Sequence[Path]) -> Score:
    """score(model, benchmark) over seeds from each seed's evaluation results (``eval/*/results.json``)."""
    results = [eval_results(Path(d)) for d in run_dirs]

    def score(model: str, bench: str) -> list[float]:
        missing = [str(d) for d, r in zip(run_dirs, results) if bench not in r.get(model, {}).get("benchmarks", {})]
        if missing:
            raise MolrlError(f"{missing[0]}: no {bench} score of {model}; finish the study there (run the same "
                             "molrl demo --study command again) before building its report")
        return [accuracy(r[model]["benchmarks"][bench])[0] for r in results]
    return score


def last_quarter_mean(values: Sequence[float]) -> float:
    """Mean of the last quarter of ``values`` (at least the last one); nan for none.

    >>> last_quarter_mean([9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 1.0, 3.0])
    2.0
    """
    late = values[len(values) - max(1, len(values) // 4):]
    return sum(late) / len(late) if late else math.nan


def quarter_rise(values: Sequence[float]) -> tuple[float, float, float]:
    """(first-quarter mean, last-quarter mean, standard error of their difference) of one run's logged values.

    The quarters are ``len // 4`` values each (at least one); the standard error treats each logged step as an
    independent sample: sqrt(se_first^2 + se_last^2), each sample standard deviation / sqrt(quarter). It says whether
    one run's curve rose, where there are no seeds to pair.

    >>> quarter_rise([0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 1.0, 1.0])  # quarters [0, 1] and [1, 1]: se sqrt(0.25 + 0)
    (0.5, 1.0, 0.5)
    """
    size = max(1, len(values) // 4)
    (first, se_first), (last, se_last) = mean_se(values[:size]), mean_se(values[len(values) - size:])
    return first, last, math.sqrt(se_first ** 2 + se_last ** 2)


def logged(run_dir: Path, group: str, run: str, key: str) -> list[float]:
    """Every logged value of ``key`` in a run's metrics.jsonl (``group``: mol or rl), in step order."""
    folder = rl_runs(run_dir) if group == "rl" else run_dir / group
    return metric_series(read_metrics(folder / run / "metrics.jsonl"), key)[1]


def mol_late_mean(run_dir: Path, run: str, key: str = KL) -> float:
    """Mean of ``key`` over the last quarter of a MoL run's logged steps (nan if never logged)."""
    return last_quarter_mean(logged(run_dir, "mol", run, key))


def last_value(run_dir: Path, group: str, run: str, key: str) -> float:
    """The last logged value of ``key`` in a run's metrics.jsonl (nan if never logged)."""
    values = logged(run_dir, group, run, key)
    return values[-1] if values else math.nan


def summed_series(run_dir: Path, run: str, keys: Sequence[str]) -> tuple[list[float], list[float]]:
    """(steps, values): per training step of a GRPO run, the sum of ``keys`` (a key not logged at a step counts 0)."""
    rows = read_metrics(rl_runs(run_dir) / run / "metrics.jsonl")
    steps, _ = metric_series(rows, "reward")
    series = [dict(zip(*metric_series(rows, key))) for key in keys]
    return steps, [sum(s.get(step, 0.0) for s in series) for step in steps]


def late_mean(run_dir: Path, run: str, *keys: str) -> float:
    """Mean of ``summed_series`` over the last quarter of the logged steps (nan if none is logged)."""
    return last_quarter_mean(summed_series(run_dir, run, keys)[1])
