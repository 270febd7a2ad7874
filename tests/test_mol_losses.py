"""The MoL loss: closed-form values, and the chunked computation against a straightforward formula."""

from __future__ import annotations

import math

import pytest
import torch

from molrl.divergence import token_kl
from molrl.mol.losses import LossSettings, _chunk_terms, mol_loss, step_counts, token_masks


def _masks(input_ids, feedback, decision, general=None):
    B, L = input_ids.shape
    general = torch.zeros(B, dtype=torch.bool) if general is None else torch.tensor(general)
    return token_masks(input_ids, torch.tensor(feedback), torch.tensor(decision), torch.ones(B, L), general)


def _identity_case():
    # Vocabulary {0, 1}, lm_head = identity, so the logits at a position are its hidden state.
    # Tokens [0, 1, 0]: position 0 predicts token 1 (feedback), position 1 predicts token 2 (decision).
    ids = torch.tensor([[0, 1, 0]])
    masks = _masks(ids, feedback=[[0, 1, 0]], decision=[[0, 0, 1]])
    hidden = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0], [5.0, 5.0]]])  # policy
    base_hidden = torch.tensor([[[1.0, 1.0], [0.0, 0.0], [5.0, 5.0]]])  # base: uniform at position 1
    head = (torch.eye(2), None)
    return hidden, base_hidden, head, masks


def test_closed_form_reverse_kl_plus_feedback_ce():
    hidden, base_hidden, head, masks = _identity_case()
    out = mol_loss(hidden, base_hidden, head, head, masks, step_counts(masks), LossSettings())
    # CE at position 0: logits [0, 0] -> p(1) = 1/2 -> ln 2 = 0.693147.
    # KL at position 1: p = softmax([ln 3, 0]) = [3/4, 1/4], q = [1/2, 1/2]
    #   KL(p||q) = 3/4 ln(3/2) + 1/4 ln(1/2) = 0.304099 - 0.173287 = 0.130812.
    # One token in each term, weights 1 and 1: loss = 0.693147 + 0.130812 = 0.823959.
    assert out.loss.item() == pytest.approx(0.823959, abs=1e-5)
    assert out.metrics.ce_feedback_sum == pytest.approx(0.693147, abs=1e-5)
    assert out.metrics.kl_decision_sum == pytest.approx(0.130812, abs=1e-5)


def test_closed_form_forward_kl():
    hidden, base_hidden, head, masks = _identity_case()
    settings = LossSettings(kl_direction="forward", ce_weight=0.0)
    out = mol_loss(hidden, base_hidden, head, head, masks, step_counts(masks), settings)
    # KL(q||p) = 1/2 ln((1/2)/(3/4)) + 1/2 ln((1/2)/(1/4)) = 1/2 ln(4/3) = 0.143841; CE weighted 0.
    assert out.loss.item() == pytest.approx(0.143841, abs=1e-5)


def test_closed_form_temperature():
    hidden, base_hidden, head, masks = _identity_case()
    settings = LossSettings(temperature=2.0, ce_weight=0.0)
    out = mol_loss(hidden, base_hidden, head, head, masks, step_counts(masks), settings)
    # At T = 2: p = softmax([ln 3 / 2, 0]) = [sqrt3/(sqrt3+1), 1/(sqrt3+1)] = [0.633975, 0.366025],
    # q = [1/2, 1/2]: KL = 0.633975 ln(1.267949) + 0.366025 ln(0.732051) = 0.150513 - 0.114172 = 0.036341.
    assert out.loss.item() == pytest.approx(0.036341, abs=1e-5)


def test_closed_form_ce_mode_covers_decision_and_feedback():
    hidden, base_hidden, head, masks = _identity_case()
    out = mol_loss(hidden, base_hidden, head, head, masks, step_counts(masks), LossSettings(mode="ce"))
    # CE at position 0: ln 2 = 0.693147; at position 1 target 0 with p = [3/4, 1/4]: -ln(3/4) = 0.287682.
    # Two CE tokens, no KL term: (0.693147 + 0.287682) / 2 = 0.490415. KL is still measured for logging.
    assert out.loss.item() == pytest.approx(0.490415, abs=1e-5)
    assert out.metrics.kl_decision_sum == pytest.approx(0.130812, abs=1e-5)


def test_closed_form_step_counts_normalise_across_micro_batches():
    hidden, base_hidden, head, masks = _identity_case()
    # The step holds this micro-batch and another one with 3 more feedback and 1 more decision token:
    # counts (4, 2, 0), so this micro-batch contributes ln 2 / 4 + 0.130812 / 2 = 0.173287 + 0.065406.
    counts = step_counts(masks) + torch.tensor([3.0, 1.0, 0.0], dtype=torch.float64)
    out = mol_loss(hidden, base_hidden, head, head, masks, counts, LossSettings())
    assert out.loss.item() == pytest.approx(0.238693, abs=1e-5)


def test_closed_form_general_example_gets_kl_on_all_tokens():
    hidden, base_hidden, head, _ = _identity_case()
    ids = torch.tensor([[0, 1, 0]])
    masks = _masks(ids, feedback=[[0, 1, 0]], decision=[[0, 0, 1]], general=[True])
    out = mol_loss(hidden, base_hidden, head, head, masks, step_counts(masks), LossSettings())
    # Both positions carry KL, feedback/decision tags are ignored. Position 0: p = [1/2, 1/2] and
    # base logits [1, 1] -> q = [1/2, 1/2]: KL 0. Position 1: 0.130812. Mean over 2 tokens: 0.065406.
    assert out.loss.item() == pytest.approx(0.065406, abs=1e-5)
    assert out.metrics.kl_general_sum == pytest.approx(0.130812, abs=1e-5)


def test_example_without_decision_tokens_contributes_zero_kl():
    hidden, base_hidden, head, _ = _identity_case()
    masks = _masks(torch.tensor([[0, 1, 0]]), feedback=[[0, 1, 0]], decision=[[0, 0, 0]])
    out = mol_loss(hidden, base_hidden, head, head, masks, step_counts(masks), LossSettings())
    # Only the feedback CE remains: ln 2; the empty KL term is 0, not NaN.
    assert out.loss.item() == pytest.approx(math.log(2), abs=1e-6)


def reference_loss(hidden, base_hidden, weight, masks, settings):
    """Straightforward formula: full logits for every position, masked means per term, the KL by the closed form RL
    calls too (``molrl.divergence``)."""
    T = settings.temperature
    logits = (hidden @ weight.t())[:, :-1].float()  # [B, L-1, V]
    base_logits = (base_hidden @ weight.detach().t())[:, :-1].float()  # the base is frozen
    ce = -torch.log_softmax(logits, -1).gather(-1, masks.targets[..., None]).squeeze(-1)  # [B, L-1]
    kl = token_kl(logits, base_logits, settings.kl_direction, T)  # [B, L-1]
    if settings.mode == "mol":
        ce_mask, kl_mask = masks.feedback, masks.decision | masks.general
    elif settings.mode == "ce":
        ce_mask, kl_mask = masks.feedback | masks.decision | masks.general, None
    else:
        ce_mask, kl_mask = masks.feedback | masks.general, None
    loss = settings.ce_weight * ce[ce_mask].sum() / ce_mask.sum() if ce_mask.any() else ce.sum() * 0
    if kl_mask is not None:
        loss = loss + settings.kl_weight * kl[kl_mask].sum() / kl_mask.sum()
    return loss


def _random_case(seed, V=50, H=8, B=3, L=12):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, L), generator=g)
    feedback = torch.rand(B, L, generator=g) < 0.4
    decision = ~feedback & (torch.rand(B, L, generator=g) < 0.6)
    masks = token_masks(ids, feedback, decision, torch.ones(B, L), torch.tensor([False, True, False]))
    hidden = torch.randn(B, L, H, generator=g, requires_grad=True)
    base_hidden = hidden.detach() + 0.3 * torch.randn(B, L, H, generator=g)
    weight = torch.randn(V, H, generator=g, requires_grad=True)
    return hidden, base_hidden, weight, masks


@pytest.mark.parametrize(
    "settings",
    [
        LossSettings(chunk_size=5),
        LossSettings(kl_direction="forward", chunk_size=7),
        LossSettings(temperature=2.0, ce_weight=0.5, kl_weight=3.0, chunk_size=4),
        LossSettings(kl_direction="forward", temperature=0.7, chunk_size=1),
        LossSettings(mode="ce", chunk_size=6),
        LossSettings(mode="ce_feedback", chunk_size=3),
    ],
    ids=["reverse", "forward", "temperature", "forward-temp", "ce", "ce_feedback"],
)
def test_chunked_matches_reference_loss_and_gradients(settings):
    hidden, base_hidden, weight, masks = _random_case(seed=1)
    ref = reference_loss(hidden, base_hidden, weight, masks, settings)
    ref_gh, ref_gw = torch.autograd.grad(ref, (hidden, weight))
    out = mol_loss(hidden, base_hidden, (weight, None), (weight.detach(), None), masks, step_counts(masks), settings)
    gh, gw = torch.autograd.grad(out.loss, (hidden, weight))
    assert out.loss.item() == pytest.approx(ref.item(), rel=1e-5)
    torch.testing.assert_close(gh, ref_gh, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(gw, ref_gw, rtol=1e-4, atol=1e-6)


def test_bias_gradient_matches_autograd():
    hidden, base_hidden, weight, masks = _random_case(seed=2)
    bias = torch.randn(weight.shape[0], requires_grad=True)
    settings = LossSettings(chunk_size=4)
    out = mol_loss(hidden, base_hidden, (weight, bias), (weight.detach(), bias.detach()), masks,
                   step_counts(masks), settings)
    (gb,) = torch.autograd.grad(out.loss, (bias,))
    # Reference: fold the bias into the weight through a constant-1 hidden feature.
    ones = torch.ones(*hidden.shape[:2], 1)
    w_aug = torch.cat([weight, bias[:, None]], 1)
    ref = reference_loss(torch.cat([hidden, ones], -1), torch.cat([base_hidden, ones], -1), w_aug, masks, settings)
    (ref_gw,) = torch.autograd.grad(ref, (w_aug,))
    torch.testing.assert_close(gb, ref_gw[:, -1], rtol=1e-4, atol=1e-6)


def test_kl_is_finite_when_probabilities_underflow():
    # Logits 200 apart: p of the losing token is exp(-200), 0 in float32. The KL must stay finite
    # (it is ~0: both distributions put all their mass on token 0).
    ids = torch.tensor([[0, 0, 0]])
    masks = _masks(ids, feedback=[[0, 0, 0]], decision=[[0, 1, 1]])
    hidden = torch.tensor([[[200.0, 0.0], [200.0, 0.0], [0.0, 0.0]]], requires_grad=True)
    base_hidden = torch.tensor([[[150.0, 0.0], [100.0, 0.0], [0.0, 0.0]]])
    head = (torch.eye(2), None)
    for direction in ("reverse", "forward"):
        out = mol_loss(hidden, base_hidden, head, head, masks, step_counts(masks), LossSettings(kl_direction=direction))
        (grad,) = torch.autograd.grad(out.loss, (hidden,))
        assert torch.isfinite(out.loss) and torch.isfinite(grad).all()
        assert out.loss.item() == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize(("direction", "temperature"), [("reverse", 1.0), ("reverse", 0.7), ("forward", 1.0)])
def test_kl_at_real_vocabulary_matches_float64(direction, temperature):
    # A Qwen3-sized vocabulary (151,936) and logits spread like a trained model's (std 3).
    C, V, T = 8, 151_936, temperature
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(C, V, generator=g) * 3
    base_logits = logits + torch.randn(C, V, generator=g)
    targets = torch.randint(0, V, (C,), generator=g)
    logp, logq = torch.log_softmax(logits.double() / T, -1), torch.log_softmax(base_logits.double() / T, -1)
    if direction == "reverse":
        kl_ref = (logp.exp() * (logp - logq)).sum(-1)
        d_ref = logp.exp() * (logp - logq - kl_ref[:, None]) / T
    else:
        kl_ref = (logq.exp() * (logq - logp)).sum(-1)
        d_ref = (logp.exp() - logq.exp()) / T
    d_logits, _, kl = _chunk_terms(logits.clone(), base_logits.clone(), targets, torch.zeros(C), torch.ones(C),
                                   direction, T)
    # The float32 log-softmax itself is off by ~1e-6 at |log p| ~ 12 (log 151936), which puts up to
    # ~5e-6 relative error on the KL and ~2e-6 on its gradient. A row sum that accumulates
    # sequentially over 151,936 entries (a bmm row dot product) adds 6e-5 to 2e-4 on the KL and
    # ~3e-5 on the reverse-KL gradient, so the tolerances sit between the two.
    assert ((kl.double() - kl_ref).abs() / kl_ref).max() < 2e-5
    assert (d_logits.double() - d_ref).norm() / d_ref.norm() < 5e-6
