"""Macro actions in closed form: segmentation rules, GAE over macro actions, pooling of advantages."""

from __future__ import annotations

import random

import pytest
import torch

from molrl.rl.macro import (RANDOM_LENGTHS, fixed_segments, macro_gae, parsing_segments, pool_advantages,
                            pool_weights, ppl_segments, randomized_segments, segment)

MASK = torch.tensor([1, 1, 1, 1, 1, 0, 0])  # 5 loss tokens, then padding


def test_fixed_segments_group_every_n_loss_tokens():
    assert fixed_segments(MASK, 2).tolist() == [0, 0, 1, 1, 2, -1, -1]
    assert fixed_segments(MASK, 1).tolist() == [0, 1, 2, 3, 4, -1, -1]
    assert segment("fixed:5", MASK).tolist() == [0, 0, 0, 0, 0, -1, -1]
    assert segment("turn", MASK).tolist() == [0, 0, 0, 0, 0, -1, -1]


def test_randomized_segments_use_the_papers_lengths():
    ids = randomized_segments(torch.ones(200, dtype=torch.long), random.Random(3))
    lengths = torch.bincount(ids).tolist()
    assert all(length in RANDOM_LENGTHS for length in lengths[:-1]) and lengths[-1] <= max(RANDOM_LENGTHS)
    assert len(set(lengths)) > 2  # really drawn, not one length


def test_ppl_segments_start_where_perplexity_rises():
    # perplexities exp(-logp): 1.0, 2.7, 1.6, 1.1, 7.4 -> rises at tokens 1 and 4
    logps = torch.tensor([0.0, -1.0, -0.5, -0.1, -2.0, 0.0, 0.0])
    assert ppl_segments(MASK, logps).tolist() == [0, 1, 1, 1, 2, -1, -1]


def test_parsing_segments_close_after_lines_and_sentences():
    texts = ["x = 1", "\n", "y", " = 2.", " Done", "", ""]
    assert parsing_segments(MASK, texts).tolist() == [0, 0, 1, 1, 2, -1, -1]


def test_pool_weights():
    assert pool_weights(4, "equal").tolist() == [0.25] * 4
    assert pool_weights(3, "unit").tolist() == [0.0, 0.0, 1.0]
    torch.testing.assert_close(pool_weights(3, "position"), torch.tensor([1.0, 0.5, 1 / 3]) / (11 / 6))


def _token_gae(rewards, values, gamma, lam):
    advantages, running = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        following = values[t + 1] if t + 1 < len(rewards) else 0.0
        running = rewards[t] + gamma * following - values[t] + gamma * lam * running
        advantages[t] = running
    return advantages


def test_fixed_one_is_token_level_gae_exactly():
    rewards = torch.tensor([-0.1, 0.0, -0.2, 0.05, 1.0])
    values = torch.tensor([0.3, 0.4, 0.2, 0.6, 0.8])
    mask = torch.ones(5, dtype=torch.long)
    advantages, returns = macro_gae(rewards, values, segment("fixed:1", mask), gamma=0.9, lam=0.95)
    expected = torch.tensor(_token_gae(rewards.tolist(), values.tolist(), 0.9, 0.95))
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, expected + values)


def test_gae_over_macro_actions_matches_the_hand_computation():
    # MAs {0,1}, {2,3,4}; MA rewards (sums) r0 = -0.1, r1 = 0.85; equal pooling: V0 = 0.35, V1 = 1.6 / 3
    rewards = torch.tensor([-0.1, 0.0, -0.2, 0.05, 1.0, 0.0, 0.0])
    values = torch.tensor([0.3, 0.4, 0.2, 0.6, 0.8, 0.0, 0.0])
    ids = fixed_segments(MASK, 2)
    ids[4] = 1  # merge the last lone token into the second MA: {2, 3, 4}
    gamma, lam = 1.0, 0.95
    v0, v1 = 0.35, 1.6 / 3
    a1 = 0.85 - v1  # last MA: delta = r1 - V1
    a0 = (-0.1 + gamma * v1 - v0) + gamma * lam * a1
    advantages, returns = macro_gae(rewards, values, ids, gamma, lam, "equal")
    torch.testing.assert_close(advantages, torch.tensor([a0, a0, a1, a1, a1, 0.0, 0.0]))
    torch.testing.assert_close(returns, torch.tensor([a0 + v0, a0 + v0, a1 + v1, a1 + v1, a1 + v1, 0.0, 0.0]))
    # unit pooling takes each MA's last token's value: V0 = 0.4, V1 = 0.8
    unit, _ = macro_gae(rewards, values, ids, gamma, lam, "unit")
    u1 = 0.85 - 0.8
    assert unit[0].item() == pytest.approx((-0.1 + 0.8 - 0.4) + lam * u1) and unit[2].item() == pytest.approx(u1)


def test_pooling_advantages_gives_each_token_its_macro_actions_value():
    advantages = torch.tensor([[1.0, 3.0, 2.0, 4.0, 6.0, 9.0, 9.0]])
    ids = fixed_segments(MASK, 2)[None]  # MAs {0,1} {2,3} {4}
    assert pool_advantages(advantages, ids, "equal").tolist() == [[2.0, 2.0, 3.0, 3.0, 6.0, 0.0, 0.0]]
    assert pool_advantages(advantages, ids, "unit").tolist() == [[3.0, 3.0, 4.0, 4.0, 6.0, 0.0, 0.0]]
    # token-level segmentation leaves advantages as they are
    torch.testing.assert_close(pool_advantages(advantages, fixed_segments(MASK, 1)[None]),
                               advantages * MASK)


def test_unknown_rules_and_missing_inputs_are_named():
    with pytest.raises(ValueError, match="unknown macro rule 'sentences'"):
        segment("sentences", MASK)
    with pytest.raises(ValueError, match="ppl needs the reference model"):
        segment("ppl", MASK)


# --- PPO with a critic over macro actions --------------------------------------------------------

def test_token_rewards_put_the_outcome_on_the_last_loss_token_and_the_kl_on_each():
    from molrl.rl.algorithms.ppo import token_rewards

    policy = torch.tensor([[-1.0, -2.0, -1.0, 0.0], [-0.5, -0.5, 0.0, 0.0]])
    reference = torch.tensor([[-1.5, -1.0, -1.0, 0.0], [-0.5, -1.5, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0]])
    rewards = token_rewards(torch.tensor([1.0, 0.0]), policy, reference, mask, beta=0.1)
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, 0.1, 1.0, 0.0], [0.0, -0.1, 0.0, 0.0]]))


def test_value_loss_clips_and_explained_variance_measures_the_critic():
    from molrl.rl.loss import explained_variance, value_loss

    old = torch.tensor([[0.0, 0.0]])
    returns = torch.tensor([[1.0, -1.0]])
    mask = torch.ones(1, 2)
    # new values 0.5 and -0.1: clipped to 0.2 and -0.1 (clip 0.2): max((0.5-1)^2, (0.2-1)^2) = 0.64; (0.9)^2 = 0.81
    assert value_loss(torch.tensor([[0.5, -0.1]]), old, returns, mask, 0.2).item() == pytest.approx(0.5 * (0.64 + 0.81) / 2)
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.zeros(1, 2), returns, mask) == pytest.approx(0.0)


def test_a_ppo_run_over_macro_actions_trains_policy_and_critic(tmp_path):
    import json

    from grpo_helpers import save_tiny_model, toy_config
    from molrl.rl.config import MacroSettings
    from molrl.rl.run import run_rl

    base = save_tiny_model(tmp_path / "base")
    out = run_rl(toy_config(tmp_path / "run", base, algorithm="ppo", beta=0.01, max_steps=30, max_new_tokens=6,
                            macro=MacroSettings(rule="fixed:3")))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "reward" in line]
    rewards = [r["reward"] for r in rows]
    assert sum(rewards[-10:]) / 10 > sum(rewards[:10]) / 10  # the policy improves
    assert all(r["critic/macro_actions_per_completion"] <= 2 for r in rows)  # 6 tokens in MAs of 3
    assert all("critic/value_loss" in r and "critic/explained_variance" in r for r in rows)
    critic = __import__("torch").load(out / "value_head.pt")
    assert critic["head"]["weight"].abs().sum() > 0  # the critic trained (its head starts at zero)
    assert critic["adapter"] and (out / "adapter" / "adapter_config.json").is_file()  # its own adapter, beside


def _ppo_run(tmp_path, name, max_steps=2, save_steps=1000, **ppo):
    from grpo_helpers import save_tiny_model, toy_config
    from molrl.rl.config import PpoSettings
    from molrl.rl.run import run_rl

    base = tmp_path / "base"
    if not base.is_dir():
        save_tiny_model(base)
    cfg = toy_config(tmp_path / name, base, algorithm="ppo", max_steps=max_steps, max_new_tokens=6,
                     ppo=PpoSettings(**ppo), save_steps=save_steps)
    return cfg, run_rl(cfg)


def _advantages(out, step=1):
    import json

    lines = [json.loads(x) for x in (out / "completions.jsonl").read_text().splitlines()]
    return [x["advantage"] for x in lines if x["step"] == step]


def test_a_group_mean_critic_with_lambda_one_gives_dr_grpos_advantages(tmp_path):
    # V = the group's mean reward on every state, gamma = lam = 1, beta = 0: every token's GAE advantage is
    # R - mean, Dr.GRPO's; the same seed samples the same first batch, so the advantages agree exactly
    from grpo_helpers import toy_config
    from molrl.rl.run import run_rl

    _, ppo = _ppo_run(tmp_path, "ppo", max_steps=1, critic="group_mean", gamma=1.0, lam=1.0)
    dr = run_rl(toy_config(tmp_path / "dr", tmp_path / "base", algorithm="dr_grpo", max_steps=1,
                           max_new_tokens=6))
    assert _advantages(ppo) == pytest.approx(_advantages(dr), abs=1e-6)
    assert any(abs(a) > 0 for a in _advantages(dr))  # the batch has signal


def test_critic_warmup_fits_the_critic_while_the_policy_stays(tmp_path):
    import torch
    from safetensors.torch import load_file

    _, out = _ppo_run(tmp_path, "warm", max_steps=2, critic="separate", critic_warmup_steps=2, critic_init="fresh")
    weights = load_file(out / "adapter" / "adapter_model.safetensors")
    assert all(torch.count_nonzero(w) == 0 for name, w in weights.items() if "lora_B" in name)  # policy unchanged
    critic = torch.load(out / "value_head.pt")
    assert critic["head"]["weight"].abs().sum() > 0  # the critic moved


def test_a_resumed_ppo_run_gets_its_critic_back(tmp_path):
    import torch

    cfg, out = _ppo_run(tmp_path, "run", max_steps=2, critic="separate", save_steps=1)
    saved = torch.load(out / "checkpoints" / "checkpoint-2" / "critic.pt")
    from molrl.rl.run import build_trainer

    cfg.train.max_steps = 3
    trainer, _, pool = build_trainer(cfg)
    try:
        trainer.algorithm.load_state(out / "checkpoints" / "checkpoint-2")
        torch.testing.assert_close(trainer.algorithm.head.state_dict()["weight"], saved["head"]["weight"])
    finally:
        if pool is not None:
            pool.close()
