"""The RL stage logs like MoL: ``train.report_to`` (tensorboard by default) gets the figures of ``metrics.jsonl``."""

from __future__ import annotations

import json
import math

import pytest

from grpo_helpers import save_tiny_model, toy_config
from molrl.config import ConfigError, load_config
from molrl.rl.config import RlConfig
from molrl.rl.run import run_rl


def test_a_two_step_rl_run_writes_reward_and_loss_to_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = run_rl(toy_config(tmp_path / "run", save_tiny_model(tmp_path / "base"), max_steps=2))
    events = sorted(out.rglob("events.out.tfevents.*"))
    assert len(events) == 1
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    for tag in ("train/reward", "train/loss"):
        values = [e.value for e in acc.Scalars(tag)]
        assert [e.step for e in acc.Scalars(tag)] == [1, 2] and all(math.isfinite(v) for v in values), tag
    # the same figures as metrics.jsonl, under train/
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = {k for row in rows for k, v in row.items() if isinstance(v, float) and k not in ("step", "epoch")}
    assert {f"train/{k}" for k in logged} <= set(tags)
    reward = {row["step"]: row["reward"] for row in rows if "reward" in row}
    assert [e.value for e in acc.Scalars("train/reward")] == pytest.approx([reward[1], reward[2]])


def test_a_backend_that_is_not_installed_stops_the_run_by_name(tmp_path):
    pytest.importorskip("tensorboard")
    if __import__("importlib").util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    cfg = load_config(RlConfig, None, [f"output_dir={tmp_path}", "train.report_to=[wandb]"])
    with pytest.raises(ConfigError, match=r"^train.report_to: wandb is not installed; pip install wandb"):
        run_rl(cfg)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())  # stopped before it wrote anything
