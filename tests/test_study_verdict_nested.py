"""The two-level bootstrap for seeds that scored problems of their own (each seed its own world): its standard error
against the closed forms it must approach."""

from __future__ import annotations

import math

import numpy as np
import pytest

from molrl.study.verdict import nested_bootstrap_se, paired_se, problem_groups


def test_one_seed_gives_the_standard_error_of_its_problems_mean():
    values = np.array([0.0, 1.0] * 50)  # variance 0.25 (population), 100 problems
    assert nested_bootstrap_se([values], draws=4000) == pytest.approx(math.sqrt(0.25 / 100), rel=0.08)


def test_constant_problems_give_the_bootstrap_of_the_seed_means():
    groups = [np.full(5, v) for v in (0.1, 0.3, 0.5, 0.7)]  # seed means with population variance 0.05
    assert nested_bootstrap_se(groups, draws=4000) == pytest.approx(math.sqrt(0.05 / 4), rel=0.08)


def test_problem_groups_pair_each_seeds_own_problems_and_refuse_a_mismatch():
    side = [{"a": 1.0, "b": 0.0}, {"c": 1.0}]
    other = [{"a": 0.0, "b": 0.0}, {"c": 0.0}]
    got = problem_groups(side, other)
    assert [g.tolist() for g in got] == [[1.0, 0.0], [1.0]]
    assert problem_groups(side, [{"a": 0.0}, {"c": 0.0}]) is None
    assert paired_se([0.5, 1.0], groups=got) >= paired_se([0.5, 1.0])
