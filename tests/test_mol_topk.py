"""``molrl.mol.topk``: the base kept as its top K and the tail, and the KL over those K + 1 classes."""

from __future__ import annotations

import pytest
import torch

from molrl.mol.topk import coarse_kl_terms, covered_mass, normalised, topk_targets


def full_kl(p_logits, q_logits, direction):
    """The full vocabulary's KL, the reference."""
    logp, logq = torch.log_softmax(p_logits, -1), torch.log_softmax(q_logits, -1)
    if direction == "forward":
        return (logq.exp() * (logq - logp)).sum(-1)
    return (logp.exp() * (logp - logq)).sum(-1)


def coarse_by_autograd(logits, topk, direction):
    """The K + 1 class KL written plainly, differentiated by autograd."""
    logits = logits.clone().requires_grad_(True)
    logp = torch.log_softmax(logits, -1)
    idx = topk.indices.long()
    logp_k = logp.gather(1, idx)
    logp_tail = torch.log1p(-logp_k.exp().sum(-1))
    logq_k, logq_tail = normalised(topk.logprobs, topk.tail)
    if direction == "forward":
        kl = (logq_k.exp() * (logq_k - logp_k)).sum(-1) + logq_tail.exp() * (logq_tail - logp_tail)
    else:
        kl = (logp_k.exp() * (logp_k - logq_k)).sum(-1) + logp_tail.exp() * (logp_tail - logq_tail)
    kl.sum().backward()
    return kl.detach(), logits.grad


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_the_closed_form_gradient_is_autograds(direction):
    torch.manual_seed(0)
    logits, base = torch.randn(5, 40) * 2, torch.randn(5, 40) * 2
    topk = topk_targets(base, torch.zeros(5, dtype=torch.long), k=6)
    d, kl = coarse_kl_terms(logits, topk.indices.long(), topk.logprobs, topk.tail, torch.ones(5), direction)
    want_kl, want_grad = coarse_by_autograd(logits, topk, direction)
    assert torch.allclose(kl, want_kl, atol=1e-5) and torch.allclose(d, want_grad, atol=1e-5)


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_with_one_token_in_the_tail_the_coarse_kl_is_the_full_one(direction):
    torch.manual_seed(1)
    logits, base = torch.randn(4, 12), torch.randn(4, 12)
    topk = topk_targets(base, torch.zeros(4, dtype=torch.long), k=11)  # K = V - 1: the partition is the vocabulary
    _, kl = coarse_kl_terms(logits, topk.indices.long(), topk.logprobs, topk.tail, torch.ones(4), direction)
    # the float16 log-probs cost a few 1e-4 of the KL at these magnitudes
    assert torch.allclose(kl, full_kl(logits, base, direction), atol=2e-3)


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_grouping_the_tail_never_raises_the_kl_and_weights_scale_the_gradient(direction):
    torch.manual_seed(2)
    logits, base = torch.randn(64, 50) * 3, torch.randn(64, 50) * 3
    topk = topk_targets(base, torch.zeros(64, dtype=torch.long), k=5)
    weights = torch.rand(64)
    d, kl = coarse_kl_terms(logits, topk.indices.long(), topk.logprobs, topk.tail, weights, direction)
    assert (kl <= full_kl(logits, base, direction) + 2e-3).all()  # a lower bound (data processing inequality)
    d1, _ = coarse_kl_terms(logits, topk.indices.long(), topk.logprobs, topk.tail, torch.ones(64), direction)
    assert torch.allclose(d, d1 * weights[:, None], atol=1e-6)


def test_the_top_k_keep_the_mass_and_the_trace_tokens_log_prob():
    base = torch.tensor([[4.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    topk = topk_targets(base, torch.tensor([3, 1]), k=1)
    e4 = torch.exp(torch.tensor(4.0))
    # row 0: the top token holds e^4 / (e^4 + 3); row 1: a quarter
    assert torch.allclose(covered_mass(topk), torch.stack([e4 / (e4 + 3), torch.tensor(0.25)]), atol=1e-6)
    assert torch.allclose(topk.token, torch.log(torch.stack([1 / (e4 + 3), torch.tensor(0.25)])), atol=1e-6)
