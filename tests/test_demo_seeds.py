"""The demo's headline over seeds: which runs are paired, and the summary's arithmetic."""

from __future__ import annotations

import json

import yaml

from molrl.demo.seeds import headline_pairs, mean_se, seed_summary

RUNS = {"rl_runs": [
    {"name": "mol+grpo", "start": "mol", "overrides": ["algorithm=grpo"]},
    {"name": "mol+dr", "start": "mol", "overrides": ["algorithm=dr_grpo"]},
    {"name": "base+grpo", "start": "base", "overrides": ["algorithm=grpo"]},
]}


def test_base_started_run_is_paired_with_the_mol_started_run_of_the_same_rl():
    assert headline_pairs(RUNS) == [("mol+grpo", "base+grpo")]
    assert headline_pairs({"rl_runs": RUNS["rl_runs"][:2]}) == []


def test_mean_and_standard_error_over_seeds():
    # values 0.2, 0.4, 0.9: mean 0.5, sample sd sqrt(((-.3)^2 + (-.1)^2 + .4^2) / 2) = sqrt(0.13), se = sd / sqrt(3)
    mean, se = mean_se([0.2, 0.4, 0.9])
    assert abs(mean - 0.5) < 1e-12 and abs(se - (0.13 / 3) ** 0.5) < 1e-12
    assert mean_se([0.7]) == (0.7, 0.0)


def _seed_run(root, seed: int, mol: float, base: float):
    run = root / f"s{seed}" / "pipeline"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(RUNS))
    for name, p in (("base", 0.05), ("mol+grpo", mol), ("mol+dr", 0.5), ("base+grpo", base)):
        (run / "eval" / name).mkdir(parents=True)
        result = {"benchmarks": {"heldout": {"pass@1": p, "problems": 100, "samples": 100}}}
        (run / "eval" / name / "results.json").write_text(json.dumps(result))
    return run


def test_summary_lists_per_seed_scores_means_and_the_paired_difference(tmp_path):
    runs = [_seed_run(tmp_path, 0, 0.9, 0.2), _seed_run(tmp_path, 1, 0.7, 0.3), _seed_run(tmp_path, 2, 0.8, 0.1)]
    text = seed_summary(runs)
    assert "| heldout | mol+grpo | 0.800 ± 0.058 | 0.700–0.900 | 0.900, 0.700, 0.800 |" in text
    assert "| heldout | base+grpo | 0.200 ± 0.058 | 0.100–0.300 | 0.200, 0.300, 0.100 |" in text
    # differences 0.7, 0.4, 0.7: mean 0.6, se = sd / sqrt(3) = sqrt(0.03) / sqrt(3) = 0.1
    assert "mol+grpo − base+grpo = +0.600 ± 0.100 (paired over seeds); mol+grpo higher in 3 of 3 seeds." in text
