"""A run says what goes wrong while it runs: each check of ``molrl.rl.watch`` on fabricated step metrics, the callback
saying each line once, and a tiny run whose every completion scores 0."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest

from molrl.rl.watch import CHECKS, RunWatch, WatchSettings, no_signal, tis_at_cap

SETTINGS = WatchSettings(data="data/mbpp.jsonl", code_mode="staged", temperature=0.7,
                         max_turns=3, max_new_tokens=512, learning_rate=5e-3, group_relative=True, tis_cap=2.0)
ALL_ZERO = {"loss": 0.0, "grad_norm": 0.0, "reward": 0.0, "reward_std": 0.0, "frac_reward_zero_std": 1.0,
            "reward_stage/code/no_code": 0.75, "reward_stage/code/compile_error": 0.25}
AT_CAP = {"rollout/tis_weight_max": 2.0, "rollout/tis_weight_mean": 0.69, "rollout/tis_capped_fraction": 0.031}


def test_every_group_of_one_reward_names_the_grade_and_what_to_check():
    line = no_signal(4, ALL_ZERO, SETTINGS)
    assert line == (
        "step 4: every group's completions got one reward (mean 0, 75% graded code/no_code), so every advantage is 0 "
        "and the policy gradient trains nothing (loss 0, grad_norm 0). Check the tasks (data/mbpp.jsonl: can the "
        "model solve some of them, not all?), the reward (reward.code_mode=staged), the "
        "temperature (sampling.temperature=0.7; a higher one spreads a group), the turn budget (episode.max_turns=3) "
        "and the token budget (sampling.max_new_tokens=512); completions.jsonl holds every completion with its grade")


@pytest.mark.parametrize("logs", [
    {**ALL_ZERO, "frac_reward_zero_std": 0.875},  # one group of eight told its completions apart: it trains
    {**ALL_ZERO, "frac_reward_zero_std": math.nan},  # no finding rests on a NaN
    {k: v for k, v in ALL_ZERO.items() if k != "frac_reward_zero_std"},  # a step that logged no rewards
    {f"eval_{k}": v for k, v in ALL_ZERO.items()},  # evaluation's metrics, not training's
])
def test_a_step_with_some_signal_or_no_reward_metrics_says_nothing(logs):
    assert no_signal(4, logs, SETTINGS) is None


def test_an_advantage_that_is_not_group_relative_is_not_judged_by_its_groups():
    # a critic's (PPO) or a teacher's (OPD) advantage is not 0 where a group's rewards are equal
    assert no_signal(4, ALL_ZERO, WatchSettings(**{**vars(SETTINGS), "group_relative": False})) is None


def test_a_tis_weight_at_the_cap_names_the_learning_rate():
    assert tis_at_cap(2, AT_CAP, SETTINGS) == (
        "step 2: rollout/tis_weight_max=2 reached rollout.tis_cap=2 (mean 0.69, 3.1% of sampled tokens at the cap): "
        "one optimiser step moves the policy further than the one-step-off correction weighs, so those tokens train "
        "with a clipped weight. Lower the learning rate (train.learning_rate=0.005) until the max stays well under "
        "the cap, or train synchronously (rollout.max_staleness=0)")


@pytest.mark.parametrize("logs, settings", [
    ({**AT_CAP, "rollout/tis_weight_max": 1.4}, SETTINGS),  # well under the cap
    ({**AT_CAP, "rollout/tis_weight_max": math.inf}, SETTINGS),  # not a finite weight: the non-finite guard's case
    (AT_CAP, WatchSettings(**{**vars(SETTINGS), "tis_cap": None})),  # a synchronous run weighs nothing
])
def test_a_tis_weight_under_the_cap_or_without_one_says_nothing(logs, settings):
    assert tis_at_cap(2, logs, settings) is None


def _state(step: int, main: bool = True) -> SimpleNamespace:
    return SimpleNamespace(global_step=step, is_world_process_zero=main)


def test_the_watch_says_each_line_once_a_run_and_only_on_the_main_process(caplog):
    watch = RunWatch(SETTINGS)
    with caplog.at_level(logging.WARNING, logger="molrl.rl.watch"):
        watch.on_log(None, _state(1, main=False), None, logs={**ALL_ZERO, **AT_CAP})
        assert caplog.records == []
        for step in (1, 2, 3):
            watch.on_log(None, _state(step), None, logs={**ALL_ZERO, **(AT_CAP if step > 1 else {})})
    assert [r.getMessage()[:7] for r in caplog.records] == ["step 1:", "step 2:"]
    assert set(watch.said) == set(CHECKS) == {"no_signal", "tis_at_cap"}


def test_settings_from_a_config_name_its_keys():
    from molrl.config import load_config
    from molrl.rl.config import RlConfig

    cfg = load_config(RlConfig, None, ["engine=vllm_server", "engine_servers=[http://127.0.0.1:8001]",
                                       "rollout.max_staleness=1", "train.learning_rate=5e-3", "algorithm=grpo",
                                       "data.path=mbpp.jsonl", "data.format=mbpp"])
    settings = WatchSettings.from_config(cfg)
    assert (settings.tis_cap, settings.learning_rate, settings.group_relative, settings.data) == \
        (2.0, 5e-3, True, "mbpp.jsonl")
    assert WatchSettings.from_config(load_config(RlConfig, None, ["algorithm=ppo"])).group_relative is False
    assert WatchSettings.from_config(load_config(RlConfig, None, [])).tis_cap is None


def test_a_run_whose_every_completion_scores_zero_says_so_once(tmp_path, caplog):
    from grpo_helpers import save_tiny_model, toy_config
    from molrl.rl.config import TaskSource
    from molrl.rl.run import run_rl

    tasks = tmp_path / "math.jsonl"
    tasks.write_text('{"id": "a", "prompt": "What is 17 * 23?", "answer": "391"}\n')  # a tiny model never answers
    base = save_tiny_model(tmp_path / "base")
    cfg = toy_config(tmp_path / "run", base, max_steps=2, n=2, max_new_tokens=4, micro_batch_size=2,
                     data=TaskSource(path=tasks, format="jsonl"))
    cfg.data.spec.kind = "math"
    with caplog.at_level(logging.WARNING, logger="molrl.rl.watch"):
        run_rl(cfg)
    said = [r.getMessage() for r in caplog.records if r.name == "molrl.rl.watch"]
    assert len(said) == 1 and said[0].startswith("step 1: every group's completions got one reward (mean 0, 100% "
                                                 "graded math/no_answer)")
