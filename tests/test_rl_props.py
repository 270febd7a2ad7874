"""PROPS's behaviour objective and the sampling error, in closed form."""

from __future__ import annotations

import math

import pytest
import torch

from molrl.rl.rollouts.props_math import behaviour_objective, sampling_error


def _objective(phi_logits, theta_logits, actions, eps=0.3, lambda_kl=0.3):
    """The objective on one state with several buffered actions (a [1, T] batch of the same state)."""
    T = len(actions)
    phi = phi_logits.expand(1, T, -1)
    theta = theta_logits.expand(1, T, -1)
    index = torch.tensor(actions)[None, :, None]
    phi_logps = torch.log_softmax(phi, -1).gather(-1, index).squeeze(-1)
    theta_logps = torch.log_softmax(theta, -1).gather(-1, index).squeeze(-1)
    return behaviour_objective(phi_logps, theta_logps, phi, theta, torch.ones(1, T), eps, lambda_kl)


def test_at_phi_equal_theta_the_loss_is_one_and_the_kl_zero():
    logits = torch.tensor([0.3, -0.2, 0.5, 0.0])
    loss, kl = _objective(logits.clone().requires_grad_(True), logits, [0, 0, 1])
    assert loss.item() == pytest.approx(1.0) and kl.item() == pytest.approx(0.0, abs=1e-7)


def test_the_clip_keeps_rho_above_one_minus_eps_but_not_below_one_plus_eps():
    # rho = 0.5 -> max(0.5, clip = 0.7) = 0.7; rho = 2 -> max(2, 1.3) = 2
    mask = torch.ones(1, 2)
    theta = torch.log(torch.tensor([[0.4, 0.2]]))
    phi = torch.log(torch.tensor([[0.2, 0.4]]))
    logits = torch.zeros(1, 2, 3)
    loss, _ = behaviour_objective(phi, theta, logits, logits, mask, eps=0.3, lambda_kl=0.0)
    assert loss.item() == pytest.approx((0.7 + 2.0) / 2)


def test_a_step_lowers_what_was_sampled_twice_and_raises_what_was_never_sampled():
    theta = torch.tensor([0.0, 0.0, 0.0, 0.0])
    phi = theta.clone().requires_grad_(True)
    loss, _ = _objective(phi, theta, [0, 0, 1])
    loss.backward()
    before = torch.softmax(phi.detach(), -1)
    after = torch.softmax(phi.detach() - 0.5 * phi.grad, -1)
    assert after[0] < before[0]  # sampled twice: less likely under phi
    assert after[3] > before[3] and after[2] > before[2]  # never sampled: more likely
    assert after[0] < after[1]  # sampled twice falls further than sampled once


def test_sampling_error_is_the_kl_of_the_sample_from_the_policy():
    policy = {"3": 0.5, "5": 0.25, "7": 0.25}
    assert sampling_error(["3", "3", "5", "7"], policy) == pytest.approx(0.0)
    # sample 3, 3, 3, 5: p = (0.75, 0.25) -> 0.75 ln(0.75 / 0.5) + 0.25 ln(0.25 / 0.25)
    assert sampling_error(["3", "3", "3", "5"], policy) == pytest.approx(0.75 * math.log(1.5))
    assert sampling_error(["9"], policy) == math.inf


def test_shared_state_sampling_error_in_closed_form():
    import math

    import torch

    from molrl.rl.rollouts.props_math import shared_state_sampling_error

    # one prompt, 4 completions: first tokens 5, 5, 5, 7 (policy: p(5) = 0.5, p(7) = 0.25); after 5 the
    # three continue 1, 1, 2 (policy: p(1) = 0.5, p(2) = 0.5); the state after 7 is reached once (left out)
    ids = torch.tensor([[5, 1], [5, 1], [5, 2], [7, 3]])
    logps = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5], [0.25, 0.9]]))
    mask = torch.ones_like(ids)
    root = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.25)
    after5 = (2 / 3) * math.log((2 / 3) / 0.5) + (1 / 3) * math.log((1 / 3) / 0.5)
    error, states = shared_state_sampling_error(ids, logps, mask, group=4)
    assert states == 2
    assert error == pytest.approx((4 * root + 3 * after5) / 7)
    # a second prompt whose 4 samples match the policy exactly (two 1s, two 2s at p = 0.5): error 0; mean of the two
    ids2 = torch.cat([ids, torch.tensor([[1, 0], [1, 0], [2, 0], [2, 0]])])
    logps2 = torch.cat([logps, torch.log(torch.full((4, 2), 0.5))])
    mask2 = torch.cat([mask, torch.tensor([[1, 0]] * 4)])
    error2, states2 = shared_state_sampling_error(ids2, logps2, mask2, group=4)
    assert states2 == 3 and error2 == pytest.approx(((4 * root + 3 * after5) / 7 + 0.0) / 2)


def test_props_settings_are_checked():
    from molrl.rl.config import RlConfig, RolloutSettings, rl_sampling

    with pytest.raises(ValueError, match="must divide sampling.n"):
        RlConfig(rollout=RolloutSettings(rounds=3), sampling=rl_sampling(n=8))
    with pytest.raises(ValueError, match="stale"):
        RlConfig(rollout=RolloutSettings(behaviour="props"), algorithm="opd", beta=0.0)
    assert RlConfig(rollout=RolloutSettings(behaviour="props"), algorithm="grpo").rollout.resolved_buffer() == 2


def run_props(root, behaviour: str, base):
    import json

    import torch

    from grpo_helpers import toy_config
    from molrl.rl import run_rl

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = toy_config(root / behaviour, base, algorithm="grpo", max_steps=3, prompts_per_step=2,
                         max_new_tokens=16)
        cfg.rollout.behaviour, cfg.rollout.rounds, cfg.rollout.buffer_batches = behaviour, 2, 2
        cfg.props.update_epochs = 0
        out = run_rl(cfg)
    finally:
        torch.set_num_threads(threads)
    lines = [json.loads(x) for x in (out / "completions.jsonl").read_text().splitlines()]
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if "reward" in x]
    from safetensors.torch import load_file

    return lines, metrics, load_file(str(out / "adapter" / "adapter_model.safetensors"))


def test_props_with_zero_behaviour_steps_equals_on_policy_sampling_with_the_same_buffer(tmp_path):
    import torch

    from grpo_helpers import save_tiny_model

    base = save_tiny_model(tmp_path / "base")
    props_lines, props_metrics, props_weights = run_props(tmp_path, "props", base)
    policy_lines, policy_metrics, policy_weights = run_props(tmp_path, "policy", base)
    assert [x["completion"] for x in props_lines] == [x["completion"] for x in policy_lines]
    for a, b in zip(props_metrics, policy_metrics):
        for key in ("reward", "loss", "grad_norm", "sampling_error", "buffer/rows"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key
    assert props_metrics[-1]["buffer/rows"] == 32  # two steps' batches of 16
    assert props_weights.keys() == policy_weights.keys()  # the behaviour adapter is not saved with the policy
    for name in props_weights:
        torch.testing.assert_close(props_weights[name], policy_weights[name])


def test_sampling_error_splits_by_the_entropy_at_the_state():
    import math

    import torch

    from molrl.rl.rollouts.props_math import sampling_error_by_entropy, shared_state_sampling_error

    # one prompt, 4 completions of 2 tokens: all start with token 5 (a near-deterministic state, pi(5) = 0.99,
    # entropy 0.06), then 2 x token 7 and 2 x token 8 at a spread state (pi 0.5 each, entropy log 2)
    ids = torch.tensor([[5, 7], [5, 7], [5, 8], [5, 8]])
    logps = torch.log(torch.tensor([[0.99, 0.5]] * 4))
    entropies = torch.tensor([[0.06, math.log(2)]] * 4)
    mask = torch.ones(4, 2)
    split = sampling_error_by_entropy(ids, logps, entropies, mask, 4, threshold=0.3)
    # low: KL(empirical {5: 1} || pi) = log(1 / 0.99); high: KL({7: .5, 8: .5} || {.5, .5}) = 0
    assert split["low"][0] == pytest.approx(math.log(1 / 0.99)) and split["low"][1] == 1
    assert split["high"] == (pytest.approx(0.0, abs=1e-6), 1)
    # together they are the unsplit error: both states reached by 4 completions, so weighted equally
    total, states = shared_state_sampling_error(ids, logps, mask, 4)
    assert states == 2 and total == pytest.approx((split["low"][0] + split["high"][0]) / 2)


def test_min_entropy_must_not_be_negative():
    from molrl.rl.config import PropsSettings, RlConfig

    with pytest.raises(ValueError, match="min_entropy"):
        RlConfig(props=PropsSettings(min_entropy=-1.0))
