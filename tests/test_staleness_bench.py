"""``benchmarks/staleness.py``: the reward curve at staleness 1 against 0, read from each seed's runs."""

from __future__ import annotations

import json
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import staleness  # noqa: E402


def write_run(pipeline, name, rewards, heldout, general, staleness_value=None):
    run = pipeline / "rl" / name
    run.mkdir(parents=True)
    lines = []
    for step, reward in enumerate(rewards, 1):
        line = {"step": step, "reward": reward, "step_time": 2.0}
        if staleness_value is not None:
            line.update({"rollout/staleness": staleness_value, "rollout/mismatch_kl": 1e-9, "rollout/is_ess": 1.0})
        lines.append(line)
    lines.append({"step": len(rewards), "train_runtime": 1.0})  # the trainer's closing line: no reward
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    ev = pipeline / "eval" / name
    ev.mkdir(parents=True)
    (ev / "results.json").write_text(json.dumps({"benchmarks": {"heldout": {"pass@1": heldout},
                                                               "general": {"pass@1": general}}}))


def test_the_report_pairs_staleness_one_with_zero_by_seed_over_reward_windows_and_accuracy(tmp_path):
    pipelines = []
    for seed, (r0, r1) in enumerate([(0.5, 0.4), (0.6, 0.6), (0.7, 0.5)]):
        p = tmp_path / f"seed-{seed}" / "pipeline"
        write_run(p, "sync_local", [0.1] * 20, 0.5, 0.9)
        write_run(p, "server_s0", [r0] * 10 + [r0 + 0.2] * 10, 0.5 + seed / 10, 0.9, 0.0)
        write_run(p, "server_s1", [r1] * 10 + [r1 + 0.1] * 10, 0.4 + seed / 10, 0.9, 1.0)
        pipelines.append(p)
    text, data = staleness.report(pipelines, 20, 60.0)
    # whole-run reward: s0 is r0 + 0.1, s1 is r1 + 0.05, so s1 - s0 = (r1 - r0) - 0.05 per seed
    assert data["paired"]["reward, whole run"] == pytest.approx([-0.15, -0.05, -0.25])
    assert data["paired"]["reward, last window"] == pytest.approx([-0.2, -0.1, -0.3])
    assert data["paired"]["held-out"] == pytest.approx([-0.1, -0.1, -0.1])
    assert data["arms"]["server_s1"]["reward_windows"][0] == pytest.approx([0.4, 0.5])
    assert "| sync_local | 0.500 ± 0.000" in text and "| - | - | - |" in text  # no engine metrics in-process
    assert "- held-out: -0.100 ± 0.000 [-0.100, -0.100, -0.100]" in text
    assert "| server_s1 | 0.500 ± 0.058 | 0.600 ± 0.058 |" in text  # the reward windows' row, s.e. over seeds


def test_the_control_arms_are_paired_alike_when_reported(tmp_path):
    pipelines = []
    for seed in range(2):
        p = tmp_path / f"seed-{seed}" / "pipeline"
        for name, heldout in (("sync_local", 0.5), ("server_s0", 0.8), ("server_s1", 0.6), ("server_s0_lr", 0.7),
                              ("server_s1_lr", 0.65)):
            write_run(p, name, [0.5] * 10, heldout, 1.0, None if name == "sync_local" else float(name[8] == "1"))
        pipelines.append(p)
    text, data = staleness.report(pipelines, 10, 1.0, (*staleness.ARMS, *staleness.CONTROL))
    assert data["paired"]["held-out"] == pytest.approx([-0.2, -0.2])
    assert data["paired_lr"]["held-out"] == pytest.approx([-0.05, -0.05])
    assert "Paired difference server_s1_lr - server_s0_lr" in text
    assert "train.learning_rate=0.00025" in staleness.arm_overrides("server_s1_lr", "http://127.0.0.1:1")


def test_the_report_counts_the_rows_by_the_step_of_the_adapter_that_sampled_them(tmp_path):
    pipelines = []
    for seed in range(2):
        p = tmp_path / f"seed-{seed}" / "pipeline"
        for name in staleness.ARMS:
            write_run(p, name, [0.5] * 3, 0.5, 1.0, None if name == "sync_local" else float(name == "server_s1"))
        # server_s0: steps 1-3 on the weights each starts from, but seed 1's step 3 on step 1's (a stale server)
        lags = {"server_s0": [0, 0, 0 if seed == 0 else 1], "server_s1": [0, 1, 1]}
        for name, per_step in lags.items():
            rows = [{"step": step, "engine_adapter": f"a-{step - 1 - lag}", "engine_adapter_step": step - 1 - lag}
                    for step, lag in enumerate(per_step, 1) for _ in range(4)]
            (staleness.rl_runs(p) / name / "completions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        pipelines.append(p)
    text, data = staleness.report(pipelines, 3, 1.0)
    assert data["sampled_under"]["server_s0"] == [{"rows": 12, "lag 0": 12, "lag 1": 0, "other": 0},
                                                   {"rows": 12, "lag 0": 8, "lag 1": 4, "other": 0}]
    assert "| server_s0 | 12, 12 | 12, 8 | 0, 4 | 0, 0 |" in text
    assert "| server_s1 | 12, 12 | 4, 4 | 8, 8 | 0, 0 |" in text
    assert "sync_local" not in data["sampled_under"]  # an in-process run's rows name no adapter
