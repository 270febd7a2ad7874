"""The MoL per-token mixture of losses, computed only where a loss is carried.

For a domain trace, the token at position t+1 is predicted from the hidden state at position t:
- feedback tokens (environment / tool output) carry cross-entropy: -log p_theta(token);
- decision tokens (the assistant's own turns) carry a full-vocabulary KL between the policy's and
  the frozen base model's next-token distributions, reverse KL(p_theta || p_base) by default or
  forward KL(p_base || p_theta), both at an optional temperature T (CE always uses T = 1).
General-tagged examples (a general corpus mixed in, as the MoL recipe does) carry KL on all their
tokens. Modes ``ce`` (CE on decision + feedback, plain SFT) and ``ce_feedback`` (CE on feedback
only) drop the KL term; general examples then carry CE on all their tokens.

Each term is a sum over its tokens divided by its own token count over the whole optimiser step
(all micro-batches, all data-parallel ranks): ``StepCounts``. Splitting a step differently
therefore changes neither the loss nor the gradients.

The base's distribution at the KL's tokens comes from its final hidden states and head (live, or cached:
``molrl.mol.base_cache``), or from its cached top-K log-probs and tail (``molrl.mol.topk``): then the KL is taken
over those K + 1 classes, and the CE part is unchanged.

Memory: hidden states are gathered at the positions that carry a loss, and logits are made from
them chunk by chunk inside one autograd function that also produces the gradients of each chunk
on the spot, so no [tokens, vocab] tensor outlives its chunk (the fused linear cross-entropy idea
of Liger-Kernel, for CE and KL together).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from molrl.mol.config import Direction, LossSettings  # the loss's settings live torch-free, for the CLI
from molrl.mol.topk import TopK, coarse_kl_terms

# Logit elements per chunk when the chunk size is automatic (~128 MiB of fp32 per temporary).
_AUTO_CHUNK_ELEMENTS = 2**25


@dataclass(frozen=True)
class TokenMasks:
    """Which predicted tokens of a micro-batch carry what; all [B, L-1], aligned with targets."""

    targets: torch.Tensor  # [B, L-1] long: input_ids shifted left by one
    feedback: torch.Tensor  # [B, L-1] bool: domain feedback tokens
    decision: torch.Tensor  # [B, L-1] bool: domain decision tokens
    general: torch.Tensor  # [B, L-1] bool: every real token of a general-tagged example


@dataclass
class LossMetrics:
    """Detached sums of one micro-batch; divide by the step's counts for means."""

    ce_feedback_sum: float
    """Sum of -log p over feedback tokens."""
    ce_decision_sum: float
    """Sum of -log p over decision tokens."""
    kl_decision_sum: float
    """Sum of KL over decision tokens (0 when not measured)."""
    kl_general_sum: float
    """Sum of KL over general tokens (0 when not measured)."""


def token_masks(
    input_ids: torch.Tensor,  # [B, L]
    feedback_mask: torch.Tensor,  # [B, L] 1 where the token is environment feedback
    decision_mask: torch.Tensor,  # [B, L] 1 where the token is a decision
    attention_mask: torch.Tensor,  # [B, L] 1 on real tokens, 0 on padding
    is_general: torch.Tensor,  # [B] bool: example tagged general
) -> TokenMasks:
    """Shift token-aligned masks to the prediction positions (position t predicts token t+1)."""
    real = attention_mask[:, 1:].bool()  # [B, L-1]
    general_rows = is_general.bool()[:, None]  # [B, 1]
    return TokenMasks(
        targets=input_ids[:, 1:],
        feedback=feedback_mask[:, 1:].bool() & real & ~general_rows,
        decision=decision_mask[:, 1:].bool() & real & ~general_rows,
        general=real & general_rows,
    )


def step_counts(masks: TokenMasks) -> torch.Tensor:
    """[3] float64: (feedback, decision, general) token counts of a micro-batch, summed over a step."""
    return torch.stack([masks.feedback.sum(), masks.decision.sum(), masks.general.sum()]).double()


def position_coefficients(
    masks: TokenMasks, counts: torch.Tensor, settings: LossSettings
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-position CE and KL coefficients [B, L-1] and the mask of positions where KL is measured.

    ``counts`` are the step's (feedback, decision, general) counts over all micro-batches and
    ranks; a term with no tokens in the step gets coefficient 0 instead of a division by zero.
    """
    n_feedback, n_decision, n_general = (float(c) for c in counts)
    if settings.mode == "mol":
        ce_tokens, kl_tokens = masks.feedback, masks.decision | masks.general
        n_ce, n_kl = n_feedback, n_decision + n_general
    elif settings.mode == "ce":
        ce_tokens, kl_tokens = masks.feedback | masks.decision | masks.general, None
        n_ce, n_kl = n_feedback + n_decision + n_general, 0.0
    else:
        ce_tokens, kl_tokens = masks.feedback | masks.general, None
        n_ce, n_kl = n_feedback + n_general, 0.0
    ce_coef = ce_tokens.float() * (settings.ce_weight / n_ce if n_ce > 0 else 0.0)  # [B, L-1]
    kl_coef = torch.zeros_like(ce_coef)  # [B, L-1]
    if kl_tokens is not None:
        kl_coef = kl_tokens.float() * (settings.kl_weight / n_kl if n_kl > 0 else 0.0)
    kl_measured = masks.decision | masks.general if settings.needs_base else torch.zeros_like(masks.decision)
    return ce_coef, kl_coef, kl_measured


@dataclass
class LossOutput:
    """The differentiable loss of one micro-batch and its detached metrics."""

    loss: torch.Tensor  # [] this micro-batch's share of the step loss
    metrics: LossMetrics
    kl: torch.Tensor  # [N_kl] detached KL at each KL-measured position, row-major over [B, L-1]


def mol_loss(
    hidden: torch.Tensor,  # [B, L, H] policy final hidden states (after the last norm)
    base_hidden: torch.Tensor | None,  # [B, L, H] base hidden states (no grad), None if not needed
    head: tuple[torch.Tensor, torch.Tensor | None],  # policy lm_head (weight [V, H], bias [V] | None)
    base_head: tuple[torch.Tensor, torch.Tensor | None],  # base lm_head, often the same tensors
    masks: TokenMasks,
    counts: torch.Tensor,  # [3] step counts (feedback, decision, general)
    settings: LossSettings,
    base_topk: TopK | None = None,  # [N_kl] the base's cached top K at the KL-measured positions, row-major
) -> LossOutput:
    """This micro-batch's share of the MoL step loss, from hidden states, never full logits. The base enters as
    ``base_hidden`` (with ``base_head``) or, when given, as ``base_topk`` (then ``base_hidden`` is unused)."""
    ce_coef, kl_coef, kl_measured = position_coefficients(masks, counts, settings)
    carries_ce = masks.feedback | masks.decision | masks.general  # CE is measured wherever cheap
    B, L, H = hidden.shape
    # KL rows first (they need base hidden states), then rows with CE only.
    kl_rows = kl_measured.flatten().nonzero().squeeze(1)  # [N_kl] flat indices into [B*(L-1)]
    ce_rows = (carries_ce & ~kl_measured).flatten().nonzero().squeeze(1)  # [N_ce]
    rows = torch.cat([kl_rows, ce_rows])  # [N]
    # Row r = b*(L-1) + t of the shifted grid is hidden position b*L + t.
    flat_pos = rows + rows // (L - 1)  # [N]
    h_sel = hidden.reshape(B * L, H).index_select(0, flat_pos)  # [N, H]
    hb_sel = None
    if base_topk is not None:
        if base_topk.indices.shape[0] != kl_rows.numel():
            raise ValueError(f"base_topk holds {base_topk.indices.shape[0]} positions, the batch measures KL at "
                             f"{kl_rows.numel()}")
        if settings.temperature != 1.0:
            raise ValueError(f"a top-K base is the base at temperature 1, not at loss.temperature={settings.temperature}")
    elif base_hidden is not None and kl_rows.numel():
        hb_sel = base_hidden.reshape(B * L, H).index_select(0, flat_pos[: kl_rows.numel()])  # [N_kl, H]
    weight, bias = head
    base_weight, base_bias = base_head
    loss, ce_vals, kl_vals = ChunkedHeadLoss.apply(
        h_sel, weight, bias, hb_sel, base_weight, base_bias,
        masks.targets.flatten()[rows], ce_coef.flatten()[rows], kl_coef.flatten()[rows],
        settings.kl_direction, settings.temperature, _chunk_size(settings.chunk_size, weight.shape[0]),
        base_topk if kl_rows.numel() else None,
    )
    metrics = _metrics(masks, rows, kl_rows.numel(), ce_vals, kl_vals)
    return LossOutput(loss=loss, metrics=metrics, kl=kl_vals[: kl_rows.numel()])


def _metrics(masks: TokenMasks, rows: torch.Tensor, n_kl: int, ce_vals, kl_vals) -> LossMetrics:
    def total(mask: torch.Tensor, vals: torch.Tensor, upto: int | None = None) -> float:
        sel = mask.flatten()[rows[:upto]]  # [N] or [N_kl]
        return float(vals[: sel.numel()][sel].sum())

    return LossMetrics(
        ce_feedback_sum=total(masks.feedback, ce_vals),
        ce_decision_sum=total(masks.decision, ce_vals),
        kl_decision_sum=total(masks.decision, kl_vals, n_kl),
        kl_general_sum=total(masks.general, kl_vals, n_kl),
    )


def _chunk_size(requested: int, vocab: int) -> int:
    if requested > 0:
        return requested
    return max(16, min(4096, _AUTO_CHUNK_ELEMENTS // vocab))


class ChunkedHeadLoss(torch.autograd.Function):
    """sum_i ce_coef_i * CE_i + kl_coef_i * KL_i over gathered positions, in vocabulary-sized chunks.

    The first ``N_kl`` rows also get a KL against the base: its head applied to ``base_hidden`` [N_kl, H], or its
    cached top K (``base_topk``, N_kl rows: the KL over K + 1 classes, ``molrl.mol.topk``). Gradients
    with respect to hidden states (and the head, when it is trained) are formed per chunk in the
    forward pass, so backward stores [N, H] and [V, H] tensors, never [N, V].
    Returns (loss [], ce [N] detached, kl [N] detached, zero beyond N_kl).
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, base_hidden, base_weight, base_bias,
                targets, ce_coef, kl_coef, direction, temperature, chunk, base_topk=None):
        N = hidden.shape[0]
        n_kl = base_topk.indices.shape[0] if base_topk is not None else 0 if base_hidden is None else base_hidden.shape[0]
        grad_hidden = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)  # [N, H]
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if weight.requires_grad else None
        grad_bias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if bias is not None and bias.requires_grad else None
        ce_vals = torch.zeros(N, dtype=torch.float32, device=hidden.device)  # [N]
        kl_vals = torch.zeros(N, dtype=torch.float32, device=hidden.device)  # [N]
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        # Chunks never straddle the KL / CE-only boundary.
        bounds = [(s, min(s + chunk, n_kl)) for s in range(0, n_kl, chunk)]
        bounds += [(s, min(s + chunk, N)) for s in range(n_kl, N, chunk)]
        for s, e in bounds:
            h = hidden[s:e]  # [C, H]
            logits = _linear(h, weight, bias)  # [C, V] fp32
            if s < n_kl and base_topk is not None:
                d_logits, ce, kl = _chunk_terms_topk(logits, base_topk, s, e, targets[s:e], ce_coef[s:e],
                                                     kl_coef[s:e], direction)  # [C, V], [C], [C]
            else:
                hb = base_hidden[s:e] if s < n_kl else None
                base_logits = _linear(hb, base_weight, base_bias) if hb is not None else None
                d_logits, ce, kl = _chunk_terms(logits, base_logits, targets[s:e], ce_coef[s:e], kl_coef[s:e],
                                                direction, temperature)  # [C, V], [C], [C]
            ce_vals[s:e], kl_vals[s:e] = ce, kl
            loss += (ce_coef[s:e] * ce).sum() + (kl_coef[s:e] * kl).sum()
            grad_hidden[s:e] = d_logits.to(weight.dtype) @ weight  # [C, H]
            if grad_weight is not None:
                grad_weight += d_logits.t() @ h.float()  # [V, H]
            if grad_bias is not None:
                grad_bias += d_logits.sum(0)
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.hidden_dtype = hidden.dtype
        ctx.mark_non_differentiable(ce_vals, kl_vals)
        return loss, ce_vals, kl_vals

    @staticmethod
    def backward(ctx, grad_loss, _grad_ce, _grad_kl):
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        g_h = (grad_hidden * grad_loss).to(ctx.hidden_dtype)
        g_w = None if grad_weight is None else grad_weight * grad_loss
        g_b = None if grad_bias is None else grad_bias * grad_loss
        return g_h, g_w, g_b, None, None, None, None, None, None, None, None, None, None


def _linear(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = h @ weight.t()  # [C, V] in the head's dtype
    if bias is not None:
        out = out + bias
    # softmax, CE and KL in float32: a bf16 log-prob near -10 is off by up to 0.03, as much as a typical KL
    return out.float()


def _chunk_terms(
    logits: torch.Tensor,  # [C, V] fp32 policy logits (overwritten)
    base_logits: torch.Tensor | None,  # [C, V] fp32 base logits (overwritten), or None: no KL in this chunk
    targets: torch.Tensor,  # [C]
    ce_coef: torch.Tensor,  # [C]
    kl_coef: torch.Tensor,  # [C]
    direction: Direction,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """d(loss)/d(logits) [C, V], CE [C] and KL [C] for one chunk, in closed form.

    CE_i = -log softmax(z_i)[y_i];  dCE/dz = softmax(z) - onehot(y).
    With p = softmax(z/T), q = softmax(z_base/T):
      reverse KL = sum p (log p - log q);  dKL/dz = p * (log p - log q - KL) / T
      forward KL = sum q (log q - log p);  dKL/dz = (p - q) / T
    Works in place so that at most four [C, V] tensors are alive at once; the KL's row sums reuse
    the log-ratio's buffer for the product, so they add no [C, V] tensor either.
    """
    at_t1 = temperature == 1.0
    logits_t = logits / temperature if base_logits is not None and not at_t1 else None  # [C, V]
    logp = _log_softmax_(logits)  # [C, V]
    ce = -logp.gather(1, targets[:, None]).squeeze(1)  # [C]
    coef = ce_coef[:, None]  # [C, 1]
    if base_logits is None:
        d_logits = logp.exp_().mul_(coef)  # [C, V]
        return d_logits.scatter_add_(1, targets[:, None], -coef), ce, torch.zeros_like(ce)
    p = logp.exp()  # [C, V]
    logp_t = logp if at_t1 else _log_softmax_(logits_t)  # [C, V]
    logq_t = _log_softmax_(base_logits if at_t1 else base_logits.div_(temperature))  # [C, V]
    scale = (kl_coef / temperature)[:, None]  # [C, 1]
    if direction == "reverse":
        ratio = torch.sub(logp_t, logq_t, out=logq_t)  # [C, V] log p_t - log q_t
        p_t = p if at_t1 else logp_t.exp_()  # [C, V]
        weighted = ratio.mul_(p_t)  # [C, V] p_t * (log p_t - log q_t), in the ratio's buffer
        kl = _row_sum(weighted)  # [C]
        # d = p * ce_coef + scale * p_t * (ratio - kl), built in the same buffer
        d_logits = weighted.addcmul_(p_t, kl[:, None], value=-1.0).mul_(scale).addcmul_(p, coef)
    else:
        q_t = logq_t.exp()  # [C, V]
        kl = _row_sum(torch.sub(logq_t, logp_t, out=logq_t).mul_(q_t))  # [C] sum q_t (log q_t - log p_t)
        if at_t1:  # d = ce_coef * p + scale * (p - q)
            d_logits = p.mul_(coef + scale).sub_(q_t.mul_(scale))
        else:
            d_logits = p.mul_(coef).add_(logp_t.exp_().sub_(q_t).mul_(scale))
    return d_logits.scatter_add_(1, targets[:, None], -coef), ce, kl


def _chunk_terms_topk(
    logits: torch.Tensor,  # [C, V] fp32 policy logits (overwritten)
    base_topk: TopK,  # the base's top K at all N_kl KL rows
    s: int, e: int,  # this chunk's rows of base_topk
    targets: torch.Tensor,  # [C]
    ce_coef: torch.Tensor,  # [C]
    kl_coef: torch.Tensor,  # [C]
    direction: Direction,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_chunk_terms`` with the base as its cached top K: CE as there, the KL and its gradient over the base's
    K + 1 classes (``molrl.mol.topk.coarse_kl_terms``), at temperature 1."""
    device = logits.device
    d_kl, kl = coarse_kl_terms(logits, base_topk.indices[s:e].to(device).long(), base_topk.logprobs[s:e].to(device),
                               base_topk.tail[s:e].to(device), kl_coef, direction)  # [C, V], [C]
    d_ce, ce, _ = _chunk_terms(logits, None, targets, ce_coef, kl_coef, direction, 1.0)  # [C, V], [C]
    return d_ce.add_(d_kl), ce, kl


def _log_softmax_(x: torch.Tensor) -> torch.Tensor:
    """log_softmax over the last dim, in place."""
    return x.sub_(torch.logsumexp(x, dim=-1, keepdim=True))


def _row_sum(x: torch.Tensor) -> torch.Tensor:
    """sum_v x[c, v] -> [C] in float32 by torch's tree reduction.

    Not a ``bmm`` row dot product: at a real vocabulary (V = 151,936) the matrix-multiply kernel
    accumulates sequentially, which puts a relative error of ~1e-4 on the KL and its gradient
    (and TF32 matmuls on GPU would make it far worse); the reduction stays near 1e-7.
    """
    return x.sum(dim=-1)


def mean_or_nan(total: float, count: float) -> float:
    """``total / count``, NaN when there were no tokens (logged as missing, not as zero)."""
    return total / count if count > 0 else math.nan
