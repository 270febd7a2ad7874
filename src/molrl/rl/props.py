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


def shared_state_sampling_error(completion_ids: torch.Tensor, logps: torch.Tensor, mask: torch.Tensor,
                                group: int) -> tuple[float, int]:
    """Token-level sampling error of a batch: (mean KL, number of states it is measured at).

    Rows ``g*group .. g*group+group-1`` are one prompt's completions. A state is a prompt plus a completion
    prefix; at every state that two or more of the prompt's completions reach, the empirical distribution
    of their next tokens is compared with the policy's (``logps`` [B, T]: the policy's log-prob of each
    row's token, the same for every row at a shared state): KL(empirical || policy) =
    sum_a (n_a / n) log((n_a / n) / pi(a)). States reached once carry no frequency and are left out.
    Per prompt, the states' KL is averaged weighted by how many completions reach them; the result is
    the mean over prompts with a shared state (0.0, 0 when none has one). Where completions reach
    their answer by the same prefix, the KL at the state before the answer is the answer-level KL.
    """
    rows = completion_ids.size(0)
    per_prompt, measured = [], 0
    for first in range(0, rows, group):
        # a prefix tree: children[state] = {next token: [count, log-prob, child state]}; state 0 is the prompt
        children: list[dict[int, list]] = [{}]
        for r in range(first, min(first + group, rows)):
            tokens = completion_ids[r][mask[r].bool()].tolist()
            values = logps[r][mask[r].bool()].tolist()
            state = 0
            for token, logp in zip(tokens, values):
                entry = children[state].get(token)
                if entry is None:
                    children.append({})
                    entry = children[state][token] = [0, logp, len(children) - 1]
                entry[0] += 1
                state = entry[2]
        total, weight = 0.0, 0
        for nxt in children:
            n = sum(entry[0] for entry in nxt.values())
            if n < 2:
                continue
            total += n * sum((c / n) * (math.log(c / n) - logp) for c, logp, _ in nxt.values())
            weight += n
            measured += 1
        if weight:
            per_prompt.append(total / weight)
    return (sum(per_prompt) / len(per_prompt) if per_prompt else 0.0), measured
