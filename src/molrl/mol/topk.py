"""The frozen base's next-token distribution kept as its top K log-probs and the tail's mass, and the KL against it.

At a decision token the base's distribution q over the vocabulary is kept as K classes, its K most likely tokens
with their log-probs, and one more, the tail: every other token, with the mass 1 - sum of the K. The policy's
distribution p is grouped the same way (its K probabilities at the base's K tokens, and the rest), and the KL is
taken between the two distributions over those K + 1 classes:

    forward  KL_K(q || p) = sum_c q_c (log q_c - log p_c)
    reverse  KL_K(p || q) = sum_c p_c (log p_c - log q_c)

Grouping tokens never raises a KL (the data-processing inequality), so each is a lower bound of the full
vocabulary's KL in its direction, equal to it when the tail holds one token or none, and close to it when the tail's
mass is small in both distributions. The gradient with respect to the policy's logits z, in closed form, with c(v)
the class of token v:

    forward:  dKL/dz_v = p_v - q_c(v) p_v / p_c(v)   (p_v - q_v for a top-K token)
    reverse:  dKL/dz_v = p_v (r_c(v) - KL),  r_c = log p_c - log q_c

Temperature 1 only: a base's top K at temperature 1 does not give its distribution at another.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from molrl.mol.config import Direction


@dataclass(frozen=True)
class TopK:
    """The base's distribution at N positions, kept as K classes and the tail."""

    indices: torch.Tensor  # [N, K] int32 (int64 when indexing): the base's K most likely tokens
    logprobs: torch.Tensor  # [N, K] float16: their log-probs
    tail: torch.Tensor  # [N] float32: log of the mass of every other token
    token: torch.Tensor  # [N] float32: the base's log-prob of the trace's own next token

    BYTES_PER_CLASS = 4 + 2
    """Bytes a top-K class takes (an int32 index and a float16 log-prob); the tail and the token take 8 more."""


def topk_targets(base_logits: torch.Tensor, targets: torch.Tensor, k: int) -> TopK:
    """The base's top ``k`` at each row of ``base_logits`` [N, V] (float32), the tail's log mass and the log-prob of
    ``targets`` [N]."""
    logq = torch.log_softmax(base_logits.float(), dim=-1)  # [N, V]
    top, idx = logq.topk(k, dim=-1)  # [N, K]
    rest = logq.scatter(1, idx, float("-inf"))  # [N, V] the tail's tokens alone
    tail = torch.logsumexp(rest, dim=-1)  # [N] log sum over the tail, exact even where the top K hold ~all the mass
    token = logq.gather(1, targets[:, None].long()).squeeze(1)  # [N]
    return TopK(indices=idx.to(torch.int32), logprobs=top.to(torch.float16), tail=tail, token=token)


def covered_mass(topk: TopK) -> torch.Tensor:
    """[N] the mass the top K hold at each position: 1 - the tail's."""
    return 1.0 - topk.tail.exp()


def normalised(logprobs: torch.Tensor, tail: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The K + 1 classes' log-probs ([N, K], [N]) made to sum to exactly 1: the K are kept in float16, so their
    masses and the tail's sum to 1 only up to its rounding, and the KL's closed-form gradient assumes the sum."""
    both = torch.cat([logprobs.float(), tail.float()[:, None]], dim=-1)  # [N, K + 1]
    both = both - torch.logsumexp(both, dim=-1, keepdim=True)
    return both[:, :-1], both[:, -1]


def coarse_log_probs(logp: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy's log-probs over the K + 1 classes: (at the K tokens [C, K], of the tail [C]), from its full
    log-probs ``logp`` [C, V]."""
    at_k = logp.gather(1, indices)  # [C, K]
    tail = torch.logsumexp(logp.scatter(1, indices, float("-inf")), dim=-1)  # [C]
    return at_k, tail


def coarse_kl_terms(
    logits: torch.Tensor,  # [C, V] float32 policy logits
    indices: torch.Tensor,  # [C, K] long: the base's top-K tokens
    base_logprobs: torch.Tensor,  # [C, K] float: their base log-probs
    base_tail: torch.Tensor,  # [C] float32: log of the base's tail mass
    kl_coef: torch.Tensor,  # [C] each row's weight in the loss
    direction: Direction,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(kl_coef-weighted dKL/dlogits [C, V], KL over the K + 1 classes [C]) in closed form (module docstring)."""
    logp = torch.log_softmax(logits, dim=-1)  # [C, V]
    p = logp.exp()  # [C, V]
    logp_k, logp_tail = coarse_log_probs(logp, indices)  # [C, K], [C]
    logq_k, logq_tail = normalised(base_logprobs, base_tail)  # [C, K], [C]
    in_tail = torch.ones_like(p, dtype=torch.bool).scatter_(1, indices, False)  # [C, V] tokens of the tail
    if direction == "forward":
        q_k, q_tail = logq_k.exp(), logq_tail.exp()  # [C, K], [C]
        kl = (q_k * (logq_k - logp_k)).sum(-1) + q_tail * (logq_tail - logp_tail)  # [C]
        # d = p - q_c(v) p_v / p_c(v): p_v - q_v at the K tokens, p_v (1 - q_tail / p_tail) in the tail
        d = p * torch.where(in_tail, 1.0 - (logq_tail - logp_tail).exp()[:, None], torch.ones_like(p))  # [C, V]
        d.scatter_add_(1, indices, -q_k)
    else:
        p_k, p_tail = logp_k.exp(), logp_tail.exp()  # [C, K], [C]
        r_k, r_tail = logp_k - logq_k, logp_tail - logq_tail  # [C, K], [C]
        kl = (p_k * r_k).sum(-1) + p_tail * r_tail  # [C]
        ratio = r_tail[:, None].expand_as(p).clone().scatter_(1, indices, r_k)  # [C, V] r_c(v)
        d = p * (ratio - kl[:, None])  # [C, V]
    return d * kl_coef[:, None], kl
