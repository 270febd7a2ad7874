"""The study's verdict rule, in pure functions: a claim against paired per-seed differences.

A claim is tested on d_i = (the claim's side) - (the other side) on seed i, paired because both runs of a
seed share its world, base and traces:

- **holds** when the mean of d is over twice its standard error and every seed has d > 0;
- **refuted** when the same holds the other way (mean below minus twice its standard error, every d < 0);
- **undecided** otherwise, with the figure that would decide it (``decider``).

One seed has no standard error, so it decides nothing. Verdicts are as measured: they say what these
seeds show, not what more seeds would.
"""

from __future__ import annotations

import math
from typing import Sequence

from molrl.demo.seeds import mean_se

NO_MEAN = 1e-9
"""A mean paired difference this close to 0 is 0 (float sums of equal scores leave a few 1e-17 behind): no number of
seeds decides it."""
MOST_SEEDS = 1000
"""Past this many seeds the decider says "over 1000" rather than a number nobody will run."""

RULE = ("*holds* when the mean paired difference over seeds is over 2 standard errors and has the same sign "
        "on every seed; *refuted* when that holds the other way; *undecided* otherwise, with the figure that "
        "would decide it. One seed decides nothing. Every verdict is as measured on these seeds.")
"""The rule in the words the report prints."""


def verdict(diffs: Sequence[float]) -> str:
    """holds / refuted / undecided for paired per-seed differences (the claim's side minus the other).

    >>> verdict([0.2, 0.3, 0.25]), verdict([-0.2, -0.3, -0.25]), verdict([0.2, -0.1, 0.1])
    ('holds', 'refuted', 'undecided')
    """
    if len(diffs) < 2:
        return "undecided"
    mean, se = mean_se(diffs)
    if mean > 2 * se and all(d > 0 for d in diffs):
        return "holds"
    if -mean > 2 * se and all(d < 0 for d in diffs):
        return "refuted"
    return "undecided"


def seeds_needed(diffs: Sequence[float]) -> int | None:
    """Seeds at which |mean| would pass 2 standard errors if the mean and spread stayed as measured: the least n
    with |mean| > 2 sd / sqrt(n), that is n > 4 sd^2 / mean^2 (at least 2); None when the mean is 0.

    >>> seeds_needed([0.1, 0.1, 0.7])  # mean 0.3, sd^2 0.12: n > 4 * 0.12 / 0.09 = 5.33
    6
    """
    if len(diffs) < 2:
        return 2
    mean, se = mean_se(diffs)
    if abs(mean) < NO_MEAN:
        return None
    variance = se * se * len(diffs)  # sd^2
    return max(2, math.floor(4 * variance / (mean * mean)) + 1)


def decider(diffs: Sequence[float]) -> str:
    """What would decide an undecided claim: the seeds its spread needs, and the seeds against its mean's sign.

    >>> decider([0.1, 0.1, 0.7])
    'mean +0.300 under 2 s.e. = 0.400; at this spread about 6 seeds would put it past 2 s.e.'
    >>> decider([0.5, 0.5, 0.5, -0.01])
    'mean +0.372 over 2 s.e. = 0.255, but 1 of 4 seeds has the other sign'
    """
    n = len(diffs)
    if n < 2:
        return "one seed has no standard error: run a second seed"
    mean, se = mean_se(diffs)
    if abs(mean) < NO_MEAN:
        return "the mean difference is 0: no number of seeds would decide it"
    against = sum(1 for d in diffs if d * mean <= 0)
    sign = f"{against} of {n} seeds {'has' if against == 1 else 'have'} the other sign"
    if abs(mean) > 2 * se:
        return f"mean {mean:+.3f} over 2 s.e. = {2 * se:.3f}, but {sign}"
    needed = seeds_needed(diffs)
    about = f"about {needed}" if needed is not None and needed <= MOST_SEEDS else f"over {MOST_SEEDS}"
    text = f"mean {mean:+.3f} under 2 s.e. = {2 * se:.3f}; at this spread {about} seeds would put it past 2 s.e."
    return text if against == 0 else f"{text}, and {sign}"


def claim_line(claim: str, side: Sequence[float], other: Sequence[float], what: str) -> str:
    """A verdict line: the claim, its verdict, the paired difference with its standard error and per seed, and
    for an undecided claim what would decide it."""
    diffs = [a - b for a, b in zip(side, other)]
    mean, se = mean_se(diffs)
    said = verdict(diffs)
    line = (f"- **{claim}**: {said} ({what}: {mean:+.3f} ± {se:.3f}, per seed "
            + ", ".join(f"{d:+.3f}" for d in diffs) + ")")
    return line + (f"; to decide: {decider(diffs)}." if said == "undecided" else ".")


def closing_weight(rows: Sequence[tuple[float, str, str]]) -> str:
    """Which RL decision-KL weight closes GRPO's general-task drop without losing its held-out gain.

    ``rows`` are (weight, drop verdict, held-out loss verdict) in increasing weight, the first at weight 0:
    the drop verdict is that of "general accuracy falls in GRPO" (MoL's general minus the run's), the loss
    verdict that of "the weight costs held-out accuracy" (the weight-0 run's held-out minus the run's). A weight
    closes the drop when its drop no longer holds and its loss does not hold.

    >>> closing_weight([(0.0, "holds", "undecided"), (0.1, "holds", "undecided"), (1.0, "undecided", "undecided")])
    'weight 1: the general drop no longer holds and the held-out accuracy is not measurably lost'
    """
    if not rows or rows[0][0] != 0:
        raise ValueError("closing_weight: the first row must be the run at weight 0")
    if rows[0][1] != "holds":
        return (f"no weight needed: GRPO without the term shows no measured general drop ({rows[0][1]}), "
                "so there is nothing to close")
    for weight, drop, loss in rows[1:]:
        if drop != "holds" and loss != "holds":
            return f"weight {weight:g}: the general drop no longer holds and the held-out accuracy is not measurably lost"
    reasons = ", ".join(f"{w:g}: {'drop holds' if d == 'holds' else 'held-out lost'}" for w, d, _ in rows[1:])
    return f"no weight tried closes it without losing held-out accuracy ({reasons})"
