"""The study's verdict rule (``molrl.study.verdict``) in closed form, its standard error over seeds and problems, its
forecast, its rate of decisive verdicts with no real effect, and the table of claims it reads."""

from __future__ import annotations

import numpy as np
import pytest

from molrl.study.claims import CLAIMS, PRIMARY, Claim
from molrl.study.verdict import (DECISIVE, bootstrap_se, claim_line, forecast, paired_se, problem_grid, t_point,
                                 primary_note, verdict)

ACC = 0.05  # the claims' smallest accuracy effect


def test_nothing_is_decided_under_three_seeds():
    # d = [0.2, 0.3]: mean 0.25, se 0.05, 5 s.e. and both seeds positive: the old rule said holds
    assert verdict([0.2, 0.3], ACC) == "undecided"
    assert verdict([-0.2, -0.3], ACC) == "undecided"
    assert verdict([0.9], ACC) == "undecided"


def test_a_mean_under_the_claims_smallest_effect_is_no_effect_found_not_holds():
    # d = [0.01, 0.01, 0.01]: se 0, every seed positive: the old rule said holds; 0.01 < 0.05
    assert verdict([0.01, 0.01, 0.01], ACC) == "no effect found"
    assert verdict([-0.04, -0.04, -0.04], ACC) == "no effect found"
    assert verdict([0.0, 0.0, 0.0], 0.0) == "no effect found"  # a zero mean is under any minimum
    assert verdict([0.06, 0.06, 0.06], ACC) == "holds"  # se 0, over the minimum
    # a mean under the minimum whose interval reaches past it is undecided: the chain study's "MoL learns more than
    # CE on feedback only", d = [0.45, -0.11, -0.42]: mean -0.027, se 0.255, 4.303 se = 1.10
    assert verdict([0.45, -0.11, -0.42], ACC) == "undecided"
    # d = [0.03, 0.04, 0.05]: mean 0.04 under 0.05, se 0.00577, 4.303 se = 0.0248: 0.04 + 0.0248 > 0.05
    assert verdict([0.03, 0.04, 0.05], ACC) == "undecided"
    # d = [0.005, 0.01, 0.015]: mean 0.01, 0.01 + 0.0248 = 0.035 <= 0.05: inside the minimum
    assert verdict([0.005, 0.01, 0.015], ACC) == "no effect found"


def test_a_claim_holds_past_students_t_point_with_every_seed_on_its_side():
    # d = [0.2, 0.3, 0.4]: mean 0.3, sd 0.1, se 0.0577; t at 2 degrees of freedom 4.303: 0.3 > 0.248
    assert verdict([0.2, 0.3, 0.4], ACC) == "holds"
    assert verdict([-0.2, -0.3, -0.4], ACC) == "refuted"
    # d = [0.1, 0.2, 0.4]: mean 0.2333, sd 0.1528, se 0.0882; 4.303 se = 0.380 > 0.233 (the old 2 s.e.: 0.176)
    assert verdict([0.1, 0.2, 0.4], ACC) == "undecided"
    # d = [0.5, 0.5, 0.5, -0.01]: mean 0.3725, se 0.1275, t(3) 3.182: 0.406 > 0.3725, and one seed the other way
    assert verdict([0.5, 0.5, 0.5, -0.01], ACC) == "undecided"
    # d = [0.3, 0.3, 0.3, 0.3, -0.01]: mean 0.238 over t(4) se = 2.776 * 0.062 = 0.172, but one seed the other way
    assert verdict([0.3, 0.3, 0.3, 0.3, -0.01], ACC) == "undecided"
    assert (t_point(2), t_point(3), t_point(5), t_point(31), t_point(1000)) == (12.706, 4.303, 2.776, 2.042, 2.042)


def test_a_given_standard_error_replaces_the_seeds_own():
    # d = [0.02, 0.02, 0.02] over a 0.05 minimum... at minimum 0.01: seeds' se 0 holds; with se 0.01, 4.303 se = 0.043
    assert verdict([0.02, 0.02, 0.02], 0.01) == "holds"
    assert verdict([0.02, 0.02, 0.02], 0.01, se=0.01) == "undecided"


def test_with_no_real_effect_the_rule_is_decisive_on_under_one_claim_in_twenty():
    # the old rule (mean over 2 s.e., every seed one sign) was decisive on 29%, 18% and 6% at 2, 3 and 5 seeds; at
    # Student's t point a one-sided test is 2.5% a side, and the every-seed condition only lowers it
    rng = np.random.default_rng(1)
    rates = {}
    for seeds in (2, 3, 5):
        draws = rng.normal(0.0, 0.1, size=(20000, seeds))  # the spread of a held-out score difference over seeds
        rates[seeds] = (sum(verdict(list(d), 0.0) in DECISIVE for d in draws) / len(draws),
                        sum(verdict(list(d), ACC) in DECISIVE for d in draws) / len(draws))
    print("decisive verdicts with no real effect (minimum 0, minimum 0.05):", rates)
    assert rates[2] == (0.0, 0.0)
    assert 0.03 < rates[3][0] < 0.055 and 0.025 < rates[5][0] < 0.05  # measured 0.048, 0.040
    assert rates[3][1] < rates[3][0] and rates[5][1] < rates[5][0]  # the minimum lowers them further


def problems(passes: list[int], count: int = 100) -> list[dict[str, float]]:
    """Per seed, a model passing the first ``passes[seed]`` of ``count`` problems (the same problems every seed)."""
    return [{f"p{i}": float(i < k) for i in range(count)} for k in passes]


def test_where_every_seed_scores_the_same_problems_the_standard_error_counts_the_problems():
    # the code task's "GRPO from MoL adds to MoL": d = +0.02, +0.02, +0.01, seeds' se 0.0033 (5 s.e.: it held);
    # the gain comes from the same two or three problems every seed, which a draw of problems keeps or drops:
    # grid rows are +1 on problems 14-15 (seed 0), 11-12 (seed 1), 15 (seed 2), so a problem draw's mean swings by
    # about sqrt(p(1 - p) / 100) with p ~ 0.017: 0.013, near the measured 0.0106
    side, other = problems([16, 13, 16]), problems([14, 11, 15])
    grid = problem_grid(side, other)
    assert grid is not None and grid.shape == (3, 100) and grid.sum() == 5
    diffs = [0.02, 0.02, 0.01]
    assert paired_se(diffs) == pytest.approx(0.0033333, abs=1e-6)
    se = paired_se(diffs, grid)
    assert 0.008 < se < 0.014 and se == paired_se(diffs, grid)  # fixed generator: the same each time
    assert verdict(diffs, 0.01) == "holds" and verdict(diffs, 0.01, se) == "undecided"


def test_the_bootstrap_of_one_seed_is_the_standard_error_of_a_mean_over_problems():
    # one seed, d in {0, 1} on half the problems each: the mean of a resampled mean has sd sqrt(0.25 / m) = 0.05
    grid = np.array([[1.0] * 50 + [0.0] * 50])
    assert bootstrap_se(grid) == pytest.approx(0.05, rel=0.06)


def test_seeds_that_scored_problems_of_their_own_keep_the_seeds_standard_error():
    side = [{"a": 1.0, "b": 0.0}, {"c": 1.0, "d": 1.0}, {"e": 0.0, "f": 1.0}]
    other = [{"a": 0.0, "b": 0.0}, {"c": 0.0, "d": 1.0}, {"e": 0.0, "f": 0.0}]
    assert problem_grid(side, other) is None
    assert problem_grid([], []) is None


def test_the_forecast_is_the_chance_the_rule_decides_at_more_seeds_were_the_mean_the_truth():
    assert forecast([0.2, 0.2, 0.2], ACC, 5) == 1.0  # no spread: every simulated seed is 0.2
    # mean 0.03 under the minimum: the chance of "no effect found"; sd 0.01, at 10 seeds 2.262 * 0.01 / sqrt(10)
    # = 0.007: 0.03 + 0.007 inside 0.05 on nearly every draw
    assert forecast([0.02, 0.03, 0.04], ACC, 10) > 0.95
    # mean 0, sd 0.1: at 10 seeds 2.262 se is about 0.07 > 0.05: "no effect found" only on a draw of small spread
    assert forecast([0.1, -0.1, 0.0], ACC, 10) < 0.2
    assert forecast([-0.2, -0.2, -0.2], ACC, 5) == 1.0  # refuted, by the mean's sign
    # the pretrained headline, +0.010, +0.070, +0.285: "about 6 seeds" by the old figure; at 6 seeds the rule
    # decides it only about a quarter of the time (the old rule: 0.26)
    chance = forecast([0.010, 0.070, 0.285], ACC, 6)
    print("the headline at 6 seeds: chance of holds", chance)
    assert 0.15 < chance < 0.35 and chance == forecast([0.010, 0.070, 0.285], ACC, 6)


def test_a_claim_line_names_its_verdict_minimum_and_forecast():
    claim = Claim("MoL absorbs the feedback", "held-out, mol − base", ACC)
    line = claim_line(claim, [0.3, 0.4, 0.5], [0.1, 0.1, 0.1])
    assert line == ("- **MoL absorbs the feedback**: holds (held-out, mol − base: +0.300 ± 0.058, per seed +0.200, "
                    "+0.300, +0.400; smallest effect 0.05).")
    undecided = claim_line(claim, [0.2, 0.1, 0.5], [0.1, 0.1, 0.1], primary=True)
    assert undecided.startswith("- **Primary: MoL absorbs the feedback**: undecided (")
    assert "to decide: were the measured mean the truth, the rule would say holds with chance" in undecided
    assert "at 5 seeds" in undecided and "at 10 seeds" in undecided
    shared = claim_line(claim, [0.16, 0.13, 0.16], [0.14, 0.11, 0.15], (problems([16, 13, 16]), problems([14, 11, 15])))
    # seeds' se 0.0033 would decide it; over seeds and problems se ~0.0106 and 0.0167 + 4.303 se passes 0.05
    assert "s.e. over seeds and problems" in shared and ": undecided (" in shared


def test_a_report_names_one_primary_claim_and_counts_the_rest_as_secondary():
    claim = Claim("X", "d", ACC)
    lines = [claim_line(claim, [0.3] * 3, [0.0] * 3, primary=True), "text",
             *(claim_line(claim, [0.1] * 3, [0.0] * 3) for _ in range(4))]
    note = primary_note(lines)
    assert note.startswith("The pre-registered primary claim is **X** (holds). The other 4 claims are secondary")
    with pytest.raises(ValueError, match="exactly one primary claim; this one names 0"):
        primary_note(lines[1:])
    with pytest.raises(ValueError, match="names 2"):
        primary_note([lines[0], *lines])
    two = primary_note([lines[0], *lines], count=2)
    assert two.startswith("The pre-registered primary claims are **X** (holds) and **X** (holds), each read under")
    assert "The other 4 claims are secondary: they are 4 tests beside the primaries" in two


def test_every_claim_declares_a_positive_smallest_effect_and_every_report_a_primary_in_the_table():
    for key, claim in CLAIMS.items():
        assert claim.min_effect > 0, key
        assert claim.text and claim.what, key
    assert {key for primaries in PRIMARY.values() for key, _ in primaries} <= set(CLAIMS)
    assert all(len(primaries) >= 1 for primaries in PRIMARY.values())
    assert CLAIMS["rl_drop"].fill(weight=0.3, start="mol").text == "GRPO at weight 0.3 drops general accuracy from MoL's"
