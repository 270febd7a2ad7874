"""PROPS (arXiv 2311.08290) as pure functions: the behaviour policy's objective and the sampling error.

A finite on-policy sample rarely matches the policy's distribution. PROPS samples from a behaviour
policy phi that lowers the probability of what the data so far over-samples, so that the buffered
data matches the current policy theta better than fresh on-policy samples do. phi starts from theta
and minimises, over the buffered (state, action) pairs,

    E_D[ max(rho, clip(rho, 1 - eps, 1 + eps)) ] + lambda_kl * KL(pi_theta || pi_phi),  rho = pi_phi / pi_theta

(the authors' defaults: eps 0.3, lambda_kl 0.3, stopping once the KL passes delta = 0.05).
``behaviour_objective`` is that loss for token actions (the KL over the full vocabulary of each
buffered state); ``sampling_error`` measures how far the data used for an update is from the policy.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Hashable, Mapping, Sequence

import torch


def behaviour_objective(phi_logps: torch.Tensor, theta_logps: torch.Tensor, phi_logits: torch.Tensor,
                        theta_logits: torch.Tensor, mask: torch.Tensor, eps: float = 0.3,
                        lambda_kl: float = 0.3) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, mean KL) of the behaviour update on buffered tokens.

    ``phi_logps`` / ``theta_logps`` [B, T] are the log-probs of the buffered tokens under phi (with grad)
    and theta; ``phi_logits`` / ``theta_logits`` [B, T, V] their full next-token logits; ``mask`` [B, T].
    """
    rho = torch.exp(phi_logps - theta_logps.detach())
    clipped = torch.max(rho, torch.clamp(rho, 1 - eps, 1 + eps))
    theta = torch.log_softmax(theta_logits.detach().float(), -1)
    phi = torch.log_softmax(phi_logits.float(), -1)
    kl = (theta.exp() * (theta - phi)).sum(-1)  # [B, T] KL(pi_theta || pi_phi) at each state
    tokens = mask.sum().clamp(min=1.0)
    mean_kl = (kl * mask).sum() / tokens
    return ((clipped * mask).sum() / tokens) + lambda_kl * mean_kl, mean_kl.detach()


def sampling_error(answers: Sequence[Hashable], policy: Mapping[Hashable, float]) -> float:
    """KL(empirical || policy) of one prompt's sampled answers against the policy's answer distribution.

    0 when the sample's frequencies equal the policy's probabilities; answers the policy gives no
    probability make it infinite.
    """
    counts, n = Counter(answers), len(answers)
    total = 0.0
    for answer, count in counts.items():
        p = count / n
        q = policy.get(answer, 0.0)
        if q <= 0.0:
            return math.inf
        total += p * math.log(p / q)
    return total
