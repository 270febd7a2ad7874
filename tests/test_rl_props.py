"""PROPS's behaviour objective and the sampling error, in closed form."""

from __future__ import annotations

import math

import pytest
import torch

from molrl.rl.props import behaviour_objective, sampling_error


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
