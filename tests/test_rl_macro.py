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
