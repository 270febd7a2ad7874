"""Eval metrics in closed form: unbiased pass@k, majority vote, aggregation, breakdowns."""

import itertools

import pytest

from molrl.eval.metrics import aggregate, breakdown, majority_vote, pass_at_k, problem_metrics


@pytest.mark.parametrize(
    "n,c,k,expected",
    [
        # pass@1 is the fraction correct: 1 - C(3,1)/C(5,1) = 1 - 3/5
        (5, 2, 1, 0.4),
        # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (5, 2, 2, 0.7),
        # 1 - C(3,3)/C(5,3) = 1 - 1/10
        (5, 2, 3, 0.9),
        # n - c = 3 < k = 4: every 4-subset contains a correct sample
        (5, 2, 4, 1.0),
        # no correct sample: C(4,2)/C(4,2) = 1, so pass@2 = 0
        (4, 0, 2, 0.0),
        # 1 - C(7,5)/C(10,5) = 1 - 21/252 = 11/12
        (10, 3, 5, 11 / 12),
        # all correct
        (3, 3, 3, 1.0),
    ],
)
def test_pass_at_k_closed_form(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_equals_subset_enumeration():
    # pass@k is the probability that a uniformly drawn k-subset of the n samples holds a correct one
    for n in range(1, 7):
        for c in range(n + 1):
            verdicts = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(verdicts, k))
                hit = sum(any(s) for s in subsets) / len(subsets)
                assert pass_at_k(n, c, k) == pytest.approx(hit, abs=1e-12)


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError, match="c <= n"):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(3, 1, 4)


def test_majority_vote_groups_equivalent_answers():
    # "0.5" and "1/2" are one class (2 votes) beating "3" (1 vote) even though "3" came first
    same = lambda a, b: {a, b} <= {"0.5", "1/2"} or a == b  # noqa: E731
    answer, ok = majority_vote(["3", "0.5", None, "1/2"], [False, True, False, True], same)
    assert (answer, ok) == ("0.5", True)


def test_majority_vote_tie_goes_to_first_and_none_abstains():
    same = str.__eq__
    assert majority_vote(["7", "8", None, None], [False, True, False, False], same) == ("7", False)
    assert majority_vote([None, ""], [False, False], same) == (None, False)


def test_aggregate_means_over_problems():
    # problem A: 4 samples, 1 correct -> pass@1 1/4, pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 1/2
    # problem B: 4 samples, 4 correct -> pass@1 1, pass@2 1
    a = problem_metrics([True, False, False, False], [1.0, 0.5, 0.0, 0.0], ks=[1, 2, 8])
    b = problem_metrics([True] * 4, [1.0] * 4, ks=[1, 2, 8])
    a["majority"], b["majority"] = 0.0, 1.0
    out = aggregate([a, b], ks=[1, 2, 8])
    assert out["problems"] == 2 and out["samples"] == 8
    assert out["pass@1"] == pytest.approx((0.25 + 1.0) / 2)
    assert out["pass@2"] == pytest.approx((0.5 + 1.0) / 2)
    assert out["avg@4"] == out["pass@1"]
    # score averages graded scores (partial credit): A has mean 1.5/4, B has 1
    assert out["score"] == pytest.approx((0.375 + 1.0) / 2)
    assert out["maj@4"] == pytest.approx(0.5)
    assert "pass@8" not in out  # k larger than the samples drawn is not reported


def test_breakdown_by_label():
    probs = [{"pass@1": 1.0}, {"pass@1": 0.0}, {"pass@1": 0.5}]
    out = breakdown(probs, ["Algebra", "Geometry", "Algebra"])
    assert out == {"Algebra": {"problems": 2, "pass@1": 0.75}, "Geometry": {"problems": 1, "pass@1": 0.0}}
