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


def shared_states(completion_ids: torch.Tensor, logps: torch.Tensor, mask: torch.Tensor, group: int,
                  entropies: torch.Tensor | None = None) -> list[tuple[int, int, float, float]]:
    """Every state two or more of a prompt's completions reach: (prompt, n, KL, entropy) each.

    Rows ``g*group .. g*group+group-1`` are one prompt's completions. A state is a prompt plus a completion
    prefix; n completions reach it, and KL(empirical || policy) = sum_a (n_a / n) log((n_a / n) / pi(a)) compares
    the empirical distribution of their next tokens with the policy's (``logps`` [B, T]: the policy's log-prob of
    each row's token, the same for every row at a shared state). ``entropies`` [B, T], when given, is the
    policy's entropy at each row's state (NaN without it).
    """
    rows, out = completion_ids.size(0), []
    for first in range(0, rows, group):
        # a prefix tree: children[state] = {next token: [count, log-prob, child state]}; state 0 is the prompt
        children: list[dict[int, list]] = [{}]
        entropy_at: list[float] = [math.nan]
        for r in range(first, min(first + group, rows)):
            inside = mask[r].bool()
            tokens, values = completion_ids[r][inside].tolist(), logps[r][inside].tolist()
            states = entropies[r][inside].tolist() if entropies is not None else [math.nan] * len(tokens)
            state = 0
            for token, logp, entropy in zip(tokens, values, states):
                entropy_at[state] = entropy
                entry = children[state].get(token)
                if entry is None:
                    children.append({})
                    entropy_at.append(math.nan)
                    entry = children[state][token] = [0, logp, len(children) - 1]
                entry[0] += 1
                state = entry[2]
        for state, nxt in enumerate(children):
            n = sum(entry[0] for entry in nxt.values())
            if n >= 2:
                kl = sum((c / n) * (math.log(c / n) - logp) for c, logp, _ in nxt.values())
                out.append((first // group, n, kl, entropy_at[state]))
    return out


def mean_over_prompts(states: Sequence[tuple[int, int, float, float]]) -> float:
    """Per prompt, the states' KL averaged weighted by how many completions reach them; then the mean over
    prompts (0.0 when there is no state)."""
    totals: dict[int, list[float]] = {}
    for prompt, n, kl, _ in states:
        total = totals.setdefault(prompt, [0.0, 0.0])
        total[0] += n * kl
        total[1] += n
    return sum(t / w for t, w in totals.values()) / len(totals) if totals else 0.0


def shared_state_sampling_error(completion_ids: torch.Tensor, logps: torch.Tensor, mask: torch.Tensor,
                                group: int) -> tuple[float, int]:
    """Token-level sampling error of a batch: (mean KL, number of states it is measured at).

    The KL of every ``shared_states`` state, averaged per prompt weighted by how many completions reach it,
    then over prompts with a shared state (0.0, 0 when none has one). States reached once carry no frequency
    and are left out. Where completions reach their answer by the same prefix, the KL at the state before the
    answer is the answer-level KL.
    """
    states = shared_states(completion_ids, logps, mask, group)
    return mean_over_prompts(states), len(states)


def sampling_error_by_entropy(completion_ids: torch.Tensor, logps: torch.Tensor, entropies: torch.Tensor,
                              mask: torch.Tensor, group: int, threshold: float) -> dict[str, tuple[float, int]]:
    """``shared_state_sampling_error`` split by the policy's entropy at the state: ``low`` (< ``threshold``
    nats: near-deterministic states, format tokens) and ``high`` (spread distributions), (mean KL, states) each."""
    states = shared_states(completion_ids, logps, mask, group, entropies)
    low = [s for s in states if s[3] < threshold]
    high = [s for s in states if not s[3] < threshold]
    return {"low": (mean_over_prompts(low), len(low)), "high": (mean_over_prompts(high), len(high))}
