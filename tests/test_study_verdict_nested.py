"""The two-level bootstrap for seeds that scored problems of their own (each seed its own world): its standard error
against the closed forms it must approach."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from molrl.study.verdict import claim_line, nested_bootstrap_se, paired_se, problem_grid, problem_groups


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


def test_a_claim_line_uses_the_two_level_bootstrap_only_where_a_report_asks_for_it():
    from molrl.study.claims import Claim

    claim = Claim(text="side beats other", what="held-out", min_effect=0.05)
    side = [{f"{s}/{i}": float(i % 2) for i in range(20)} for s in range(3)]  # each seed its own problems
    other = [{k: 0.0 for k in seed} for seed in side]
    means = [0.5, 0.5, 0.5]
    plain = claim_line(claim, means, [0.0] * 3, (side, other))
    nested = claim_line(claim, means, [0.0] * 3, (side, other), nested=True)
    assert "each seed's problems" not in plain and "+0.500 ± 0.000" in plain  # the seeds agree exactly
    assert "s.e. over seeds and each seed's problems" in nested
    se = float(nested.split("± ")[1].split(",")[0])
    assert se == pytest.approx(math.sqrt(0.25 / 20 / 3), rel=0.15)  # the problems' noise, three seeds of 20


def test_seeds_pair_problems_by_content_not_by_id(tmp_path):
    """The same id in two seeds' worlds is two problems: per-problem scores are keyed by the content key the
    evaluation records (by id in records that kept none), so the two-way bootstrap pairs only the same problems."""
    from molrl.study.headline import problem_scores
    from molrl.study.verdict import problem_grid

    def write(seed: int, model: str, keys: list[str | None]) -> Path:
        folder = tmp_path / f"seed-{seed}" / "eval" / model / "general"
        folder.mkdir(parents=True)
        rows = [{"id": f"general/{i}", "correct": bool(i % 2), **({"task_key": k} if k else {})}
                for i, k in enumerate(keys)]
        (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return tmp_path / f"seed-{seed}"

    same_ids_other_contents = [[f"s{seed}-{i}" for i in range(4)] for seed in range(2)]
    dirs = [write(s, m, same_ids_other_contents[s]) for s in range(2) for m in ("a", "b")][::2]
    scores = [[problem_scores(d, m, "general") for d in dirs] for m in ("a", "b")]
    assert problem_grid(*scores) is None
    assert problem_groups(*scores) is not None and sorted(scores[0][1]) == same_ids_other_contents[1]
    legacy = [write(s + 2, m, [None] * 4) for s in range(2) for m in ("a", "b")][::2]
    kept = [[problem_scores(d, m, "general") for d in legacy] for m in ("a", "b")]
    assert sorted(kept[0][0]) == [f"general/{i}" for i in range(4)] and problem_grid(*kept).shape == (2, 4)


def test_a_side_written_before_content_keys_pairs_by_id_within_a_seed_and_never_across_seeds(tmp_path):
    from molrl.study.headline import paired_problem_scores

    def write(seed: int, model: str, keyed: bool) -> None:
        folder = tmp_path / f"seed-{seed}" / "eval" / model / "heldout"
        folder.mkdir(parents=True)
        rows = [{"id": f"t/{i}", "correct": i < 2, **({"task_key": f"s{seed}-{i}"} if keyed else {})}
                for i in range(4)]
        (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    for seed in range(2):
        write(seed, "new", keyed=True)
        write(seed, "old", keyed=False)
    dirs = [tmp_path / f"seed-{s}" for s in range(2)]
    side, other = paired_problem_scores(dirs, "new", "old", "heldout")
    assert [sorted(s) for s in side] == [sorted(o) for o in other]  # each seed's sides pair problem by problem
    assert not set(side[0]) & set(side[1])  # the same id in two seeds is not taken for one problem
    assert problem_grid(side, other) is None and problem_groups(side, other) is not None
    (one,), (two,) = paired_problem_scores(dirs[:1], "new", "old", "heldout")
    assert sorted(one) == sorted(two) == ["t/0", "t/1", "t/2", "t/3"]
