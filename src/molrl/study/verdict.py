"""The study's verdict rule, in pure functions: a claim against paired per-seed differences.

A claim (``molrl.study.claims.Claim``) is tested on d_i = (the claim's side) - (the other side) on seed i, paired
because both runs of a seed share its world, base and traces. With n seeds, mean m and standard error s:

- **undecided** under ``MIN_SEEDS`` (3) seeds, whatever d is;
- **no effect found** when the whole interval m ± t s lies inside ± the claim's smallest effect worth reporting
  (``Claim.min_effect``), t Student's two-sided 95% point at n - 1 degrees of freedom (4.30 at 3 seeds, 2.78 at 5):
  the effect, if any, is too small to report;
- **holds** when m is at least the smallest effect and m > t s, and every seed has d > 0;
- **refuted** when the same holds the other way;
- **undecided** otherwise (a mean under the smallest effect with a wide interval included), with a forecast: the
  chance the rule would say what m points to (holds or refuted by its sign, or no effect found when |m| is under the
  smallest effect) at more seeds, were m the truth, simulated from the measured spread.

The standard error is the seeds' own (sample standard deviation / sqrt(n)). Where every seed scored the same
problems (the code task's fixed MBPP and HumanEval tasks) and the per-problem scores are given, it is a paired
bootstrap over seeds and problems (seeds drawn with replacement, then one draw of problems shared by every seed),
and never less than the seeds' own: the seeds' spread leaves out how much the result depends on which problems were
chosen, and the problems' spread counts it. Seeds that scored problems of their own (each chain-world seed draws its
own) already carry that noise in their spread.

Simplifications: the forecast draws each future seed's d from a normal with the measured mean and spread (task noise
folded into it), and every random draw comes from a fixed generator seed, so a report is the same each time it is
built. Verdicts are as measured: they say what these seeds show.
"""

from __future__ import annotations

import math
import re
from typing import Mapping, Sequence

import numpy as np

from molrl.demo.seeds import mean_se
from molrl.study.claims import Claim

MIN_SEEDS = 3
"""Fewer seeds than this decide nothing: two seeds' standard error is too unsure to stand on."""
NO_MEAN = 1e-9
"""A mean paired difference this close to 0 is 0 (float sums of equal scores leave a few 1e-17 behind)."""
T_95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
"""Student's t two-sided 95% points for 1 to 30 degrees of freedom; past 30 the rule keeps 30's (a little strict)."""
DRAWS = 2000
"""Bootstrap and forecast draws."""
RANDOM_SEED = 0
"""The fixed generator seed of every bootstrap and forecast."""
FORECAST_SEEDS = (5, 10)
"""Seed counts an undecided claim is forecast at (each at least two more than were run)."""
DECISIVE = ("holds", "refuted")
"""The verdicts that decide a claim."""
CLAIM_LINE = re.compile(r"^- \*\*(Primary: )?(.*?)\*\*: (holds|refuted|undecided|no effect found) \(")
"""A verdict line as ``claim_line`` writes it (group 1 marks the primary claim)."""

RULE = ("*holds* when at least 3 seeds were run, the mean paired difference is at least the claim's smallest effect "
        "worth reporting, over t standard errors (Student's two-sided 95% point at seeds − 1 degrees of freedom: "
        "4.30 at 3 seeds, 2.78 at 5) and of the same sign on every seed; *refuted* when that holds the other way; "
        "*no effect found* when the mean ± t standard errors lies inside ± the claim's smallest effect; *undecided* "
        "otherwise, with the chance that more seeds would decide it were the measured mean the truth. Where every seed scored the same problems "
        "the standard error is a paired bootstrap over seeds and problems, so the choice of problems counts. Every "
        "verdict is as measured on these seeds.")
"""The rule in the words the report prints."""


def t_point(seeds: int) -> float:
    """Student's two-sided 95% t point at ``seeds - 1`` degrees of freedom (inf under 2 seeds).

    >>> t_point(3), t_point(5), t_point(100)
    (4.303, 2.776, 2.042)
    """
    if seeds < 2:
        return math.inf
    return T_95[min(seeds - 1, len(T_95)) - 1]


def verdict(diffs: Sequence[float], min_effect: float, se: float | None = None) -> str:
    """holds / refuted / no effect found / undecided for paired per-seed differences (the claim's side minus the
    other), with the claim's smallest effect worth reporting and, where given, a standard error that counts more
    than the seeds' spread (``paired_se``).

    >>> verdict([0.2, 0.3, 0.25], 0.05), verdict([0.2, 0.3], 0.05), verdict([0.01, 0.01, 0.01], 0.05)
    ('holds', 'undecided', 'no effect found')
    """
    if len(diffs) < MIN_SEEDS:
        return "undecided"
    mean, seed_se = mean_se(diffs)
    se = seed_se if se is None else se
    reach = t_point(len(diffs)) * se
    if abs(mean) + reach <= min_effect:
        return "no effect found"
    if abs(mean) >= min_effect and abs(mean) > max(reach, NO_MEAN):
        if mean > 0 and all(d > 0 for d in diffs):
            return "holds"
        if mean < 0 and all(d < 0 for d in diffs):
            return "refuted"
    return "undecided"


def problem_grid(side: Sequence[Mapping[str, float]], other: Sequence[Mapping[str, float]]) -> np.ndarray | None:
    """Per seed and problem, side's score minus other's ([seeds, problems]), where every seed scored the same problems
    on both sides; None where they did not (then the seeds' spread already carries the problems' noise)."""
    ids = set(side[0]) if side else set()
    if not ids or any(set(s) != ids for s in (*side, *other)):
        return None
    order = sorted(ids)
    return np.array([[s[i] - o[i] for i in order] for s, o in zip(side, other)], dtype=float)  # [seeds, problems]


def bootstrap_se(grid: np.ndarray, draws: int = DRAWS, seed: int = RANDOM_SEED) -> float:
    """Standard error of the grid's mean by a paired two-way bootstrap: each draw takes seeds with replacement, then
    problems with replacement (one draw for every seed, as every seed scored the same problems)."""
    rng = np.random.default_rng(seed)
    n, m = grid.shape
    seeds = rng.integers(0, n, size=(draws, n))
    problems = rng.integers(0, m, size=(draws, m))
    means = grid[seeds[:, :, None], problems[:, None, :]].mean(axis=(1, 2))  # [draws]
    return float(means.std(ddof=1))


def problem_groups(side: Sequence[Mapping[str, float]], other: Sequence[Mapping[str, float]]
                   ) -> list[np.ndarray] | None:
    """Per seed, side's score minus other's on each of that seed's problems, where the seeds scored problems of their
    own (each its own world) and both sides the same ones within a seed; None where a seed's sides differ."""
    if not side or any(not s or set(s) != set(o) for s, o in zip(side, other)):
        return None
    return [np.array([s[i] - o[i] for i in sorted(s)], dtype=float) for s, o in zip(side, other)]


def nested_bootstrap_se(groups: Sequence[np.ndarray], draws: int = DRAWS, seed: int = RANDOM_SEED) -> float:
    """Standard error of the mean over seeds of each seed's mean by a two-level bootstrap, for seeds that scored
    problems of their own: each draw takes seeds with replacement, then each drawn seed's problems with replacement.

    >>> round(nested_bootstrap_se([np.array([1.0, 1.0]), np.array([1.0])]), 6)  # no spread anywhere
    0.0
    """
    rng = np.random.default_rng(seed)
    n = len(groups)
    means = np.empty(draws)
    for d in range(draws):
        picked = rng.integers(0, n, size=n)
        means[d] = np.mean([groups[k][rng.integers(0, len(groups[k]), size=len(groups[k]))].mean() for k in picked])
    return float(means.std(ddof=1))


def paired_se(diffs: Sequence[float], grid: np.ndarray | None = None,
              groups: Sequence[np.ndarray] | None = None) -> float:
    """The standard error the rule uses: the seeds' own, or the larger of that and a bootstrap's over seeds and
    problems: the two-way one where ``grid`` (``problem_grid``: every seed scored the same problems) is given, the
    two-level one where ``groups`` (``problem_groups``: each seed its own problems) is."""
    seed_se = mean_se(diffs)[1] if diffs else 0.0
    if grid is not None:
        return max(seed_se, bootstrap_se(grid))
    return seed_se if groups is None else max(seed_se, nested_bootstrap_se(groups))


def forecast(diffs: Sequence[float], min_effect: float, seeds: int, se: float | None = None,
             draws: int = DRAWS, seed: int = RANDOM_SEED) -> float:
    """The chance the rule says what the measured mean points to (holds, refuted for a negative mean, no effect found
    for a mean under ``min_effect``) at ``seeds`` seeds, were the measured mean the truth: each draw takes ``seeds`` values from a normal with that mean and the measured per-seed spread (se * sqrt(n),
    so task noise counts where ``se`` carries it) and applies ``verdict``.

    >>> forecast([0.2, 0.2, 0.2], 0.05, 5), forecast([0.2, 0.2, 0.2], 0.5, 5)
    (1.0, 1.0)
    """
    n = len(diffs)
    mean, seed_se = mean_se(diffs) if n else (0.0, 0.0)
    spread = (seed_se if se is None else se) * math.sqrt(n)
    wanted = "no effect found" if abs(mean) < min_effect else "holds" if mean > 0 else "refuted"
    rng = np.random.default_rng(seed)
    sample = rng.normal(mean, spread, size=(draws, seeds)) if spread > 0 else np.full((draws, seeds), mean)
    return sum(verdict(list(row), min_effect) == wanted for row in sample) / draws


def outlook(diffs: Sequence[float], min_effect: float, se: float) -> str:
    """What more seeds would likely say of an undecided claim: the forecast at ``FORECAST_SEEDS`` (or more)."""
    n = len(diffs)
    if n < 2:
        return f"{MIN_SEEDS} seeds are the least the rule decides on"
    mean = mean_se(diffs)[0]
    if abs(mean) < NO_MEAN and min_effect <= 0:
        return "the mean difference is 0 and the claim has no smallest effect: no number of seeds would decide it"
    counts = sorted({max(c, n + 2) for c in FORECAST_SEEDS})
    word = "no effect found" if abs(mean) < min_effect else "holds" if mean > 0 else "refuted"
    chances = ", ".join(f"{forecast(diffs, min_effect, c, se):.2f} at {c} seeds" for c in counts)
    return f"were the measured mean the truth, the rule would say {word} with chance {chances}"


def claim_line(claim: Claim, side: Sequence[float], other: Sequence[float],
               problems: tuple[Sequence[Mapping[str, float]], Sequence[Mapping[str, float]]] | None = None,
               primary: bool = False, nested: bool = False) -> str:
    """A verdict line: the claim, its verdict, the paired difference with its standard error and per seed, and for
    an undecided claim its forecast. ``problems`` (side's and other's per-problem scores, per seed, keyed by the
    problem's content) let the standard error count the problems' noise: by the two-way bootstrap where every seed
    scored the same problems, and, with ``nested`` (a report that pre-registered it), by the two-level one where each
    seed scored problems of its own; ``primary`` marks the report's pre-registered primary claim."""
    diffs = [a - b for a, b in zip(side, other)]
    mean, _ = mean_se(diffs)
    grid = problem_grid(*problems) if problems is not None else None
    groups = problem_groups(*problems) if problems is not None and grid is None and nested else None
    se = paired_se(diffs, grid, groups)
    said = verdict(diffs, claim.min_effect, se)
    how = ("; s.e. over seeds and problems" if grid is not None
           else "; s.e. over seeds and each seed's problems" if groups is not None else "")
    line = (f"- **{'Primary: ' if primary else ''}{claim.text}**: {said} ({claim.what}: {mean:+.3f} ± {se:.3f}, per "
            f"seed " + ", ".join(f"{d:+.3f}" for d in diffs) + f"; smallest effect {claim.min_effect:g}{how})")
    if said == "undecided":
        return line + f"; to decide: {outlook(diffs, claim.min_effect, se)}."
    return line + "."


def mcnemar_p(only_side: int, only_other: int) -> float:
    """Exact two-sided McNemar p-value of one seed's paired problems: ``only_side`` problems right on the claim's side
    alone, ``only_other`` right on the other alone. Under no difference each such problem goes either way with chance
    1/2, so the count on one side is Binomial(b + c, 1/2); the p-value doubles the smaller tail (at most 1).

    >>> mcnemar_p(0, 5), mcnemar_p(3, 3), mcnemar_p(0, 0), round(mcnemar_p(10, 1), 5)
    (0.0625, 1.0, 1.0, 0.01172)
    """
    n, low = only_side + only_other, min(only_side, only_other)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(low + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def primary_note(lines: Sequence[str], count: int = 1) -> str:
    """The sentence that says which claims are the report's primary ones and how many secondary claims it tests
    beside them; refuses a report without exactly ``count`` primary claims (its ``PRIMARY`` entry's)."""
    found = [m for m in (CLAIM_LINE.match(line) for line in lines) if m]
    primary = [m for m in found if m.group(1)]
    if len(primary) != count:
        raise ValueError(f"a report names exactly {'one' if count == 1 else count} primary claim"
                         f"{'s' * (count != 1)}; this one names {len(primary)}")
    others = len(found) - count
    named = " and ".join(f"**{m.group(2)}** ({m.group(3)})" for m in primary)
    head = (f"The pre-registered primary claim is {named}." if count == 1 else
            f"The pre-registered primary claims are {named}, each read under the rule on its own.")
    return (f"{head} The other {others} claims are secondary: they are {others} tests beside the "
            f"primar{'y' if count == 1 else 'ies'}, so read a decisive secondary verdict as a lead to test again, not "
            "a finding (with no real effect the rule still says holds or refuted on about 1 claim in 20 or fewer, so "
            f"among these about {others / 20:.1f} could be chance).")


def closing_weight(rows: Sequence[tuple[float, str, str]]) -> str:
    """Which RL decision-KL weight closes GRPO's general-task drop without losing its held-out gain.

    ``rows`` are (weight, drop verdict, held-out loss verdict) in increasing weight, the first at weight 0:
    the drop verdict is that of "general accuracy falls in GRPO" (MoL's general minus the run's), the loss
    verdict that of "the weight costs held-out accuracy" (the weight-0 run's held-out minus the run's). A weight
    closes the drop when its drop is under the smallest effect worth reporting (no effect found: an undecided drop
    is not closed, only unmeasured) and its loss does not hold.

    >>> closing_weight([(0.0, "holds", "undecided"), (0.1, "undecided", "undecided"),
    ...                 (1.0, "no effect found", "undecided")])
    'weight 1: the general drop is under the smallest effect worth reporting and the held-out accuracy is not measurably lost'
    """
    if not rows or rows[0][0] != 0:
        raise ValueError("closing_weight: the first row must be the run at weight 0")
    if rows[0][1] != "holds":
        return (f"no weight needed: GRPO without the term shows no measured general drop ({rows[0][1]}), "
                "so there is nothing to close")
    for weight, drop, loss in rows[1:]:
        if drop == "no effect found" and loss != "holds":
            return (f"weight {weight:g}: the general drop is under the smallest effect worth reporting and the "
                    "held-out accuracy is not measurably lost")
    reasons = ", ".join(f"{w:g}: {'held-out lost' if d == 'no effect found' else 'drop ' + d}" for w, d, _ in rows[1:])
    return f"no weight tried closes it without losing held-out accuracy ({reasons})"
