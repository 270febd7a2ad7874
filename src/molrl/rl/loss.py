"""The RL loss: the clipped policy-gradient term with its aggregation, and the terms beside it.

The loss of a token is ``-min(r A, clip(r, 1-eps_low, 1+eps_high) A) + beta * r * KL3`` with
``r = pi_theta / pi_behaviour`` and ``KL3 = exp(ref - logp) - (ref - logp) - 1``; ``r`` on the KL term
is 1 in value on-policy, and its gradient makes the KL gradient the unbiased reverse-KL gradient
(DeepSeek-V3.2, arXiv 2512.02556). Aggregation (Dr.GRPO paper, arXiv 2503.20783):

- ``sequence_mean``: mean over each completion's tokens, then over completions (GRPO);
- ``constant``: sum over all tokens / (B * T_max) (Dr.GRPO);
- ``token_mean``: mean over all loss tokens (on-policy distillation, PPO).

Every mean is over the optimiser step, not the micro-batch: a micro-batch's loss is its sum (of token losses,
or of completion means) divided by the step's count (``policy_normaliser`` of ``StepCounts``: loss tokens,
completions, or completions x T_max), so the micro-batches' losses add up to the step's and its gradient does
not depend on how the step is split. An algorithm's extra term (PPO's value loss) is its own component with
its own normaliser (the step's loss tokens), added with its weight, so it never dilutes the policy term.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import torch

from molrl.rl.batch import LossInputs, LossOutputs, StepCounts

Aggregation = Literal["sequence_mean", "constant", "token_mean"]

SAMPLER_CAP = 3.0
"""vLLM correction: a completion whose pi_trainer / pi_vLLM exceeds this is left out (TRL's default,
``sequence_mask`` at 3.0)."""


@dataclass
class PolicyLossSettings:
    """How token losses become the step's loss."""

    aggregation: Aggregation
    """sequence_mean: mean over each completion's tokens, then over completions (GRPO);
    constant: sum over all tokens / (B * max_completion_length) (Dr.GRPO); token_mean: mean over all tokens;
    B and the tokens being the optimiser step's."""
    max_completion_length: int
    """The constant normaliser's T_max."""
    epsilon_low: float = 0.2
    """Lower clip: the ratio is clipped below at 1 - epsilon_low."""
    epsilon_high: float = 0.2
    """Upper clip: the ratio is clipped above at 1 + epsilon_high."""
    beta: float = 0.0
    """Weight of the per-token KL to the reference (0: no reference term)."""


def share(total: torch.Tensor, normaliser: torch.Tensor | float) -> torch.Tensor:
    """[] ``total`` / ``normaliser``: a micro-batch's sum as its share of the step's mean (0 when the step has none)."""
    return total / torch.as_tensor(normaliser, dtype=total.dtype, device=total.device).clamp(min=1.0)


@dataclass(frozen=True)
class Aggregator:
    """How one aggregation turns a micro-batch's token losses into its share of the step's loss."""

    total: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """(token losses [B, T], mask [B, T]) -> [] the micro-batch's sum: of completion means, or of token losses."""
    normaliser: Callable[[StepCounts, int], torch.Tensor]
    """(the step's counts, T_max) -> [] what the step's sum is divided by."""


def _completion_means(token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return ((token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).sum()  # sum of completion means


def _token_sum(token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (token_loss * mask).sum()  # sum of token losses


AGGREGATORS: dict[str, Aggregator] = {
    "sequence_mean": Aggregator(_completion_means, lambda counts, t_max: counts.completions),
    "constant": Aggregator(_token_sum, lambda counts, t_max: counts.completions * t_max),
    "token_mean": Aggregator(_token_sum, lambda counts, t_max: counts.tokens),
}
"""The aggregations by name (``PolicyLossSettings.aggregation``; an algorithm names its own): adding one is an entry."""


def aggregator(aggregation: str) -> Aggregator:
    """The registered aggregation ``aggregation``, or a one-line error naming the known ones."""
    if aggregation not in AGGREGATORS:
        raise ValueError(f"unknown aggregation {aggregation!r}; expected {', '.join(AGGREGATORS)}")
    return AGGREGATORS[aggregation]


def policy_normaliser(aggregation: Aggregation, counts: StepCounts, max_completion_length: int) -> torch.Tensor:
    """[] what the step's policy term divides its sum by: completions (``sequence_mean``), completions x
    ``max_completion_length`` (``constant``) or loss tokens (``token_mean``)."""
    return aggregator(aggregation).normaliser(counts, max_completion_length)


def policy_loss(logps: torch.Tensor, inputs: LossInputs, settings: PolicyLossSettings,
                normaliser: torch.Tensor | float | None = None) -> LossOutputs:
    """The clipped policy-gradient loss of one micro-batch (its share of the step's) and its statistics.

    ``logps`` [B, T] are the policy's log-probs of ``inputs.completion_ids``; from ``inputs`` the loss reads the
    advantages, the loss mask (``completion_mask``, all 0 on a row whose grading failed), the behaviour log-probs (None: the batch was sampled by the
    policy being trained: ratio 1 in value, gradient of log pi), the reference log-probs and the weights ([B, 1] or
    [B, T], multiplying each token's loss). ``normaliser`` is the step's ``policy_normaliser`` (None: this batch's
    own, as if it were the whole step). Ratios and the KL are formed in float32 (bf16 log-probs would round exp()
    of their differences).
    """
    advantages, mask, weights = inputs.advantages, inputs.completion_mask, inputs.weights
    logps = logps.float()
    behaviour = logps.detach() if inputs.behaviour_logps is None else inputs.behaviour_logps.float()
    ratio = torch.exp(logps - behaviour)  # [B, T]
    clipped = torch.clamp(ratio, 1 - settings.epsilon_low, 1 + settings.epsilon_high)
    token_loss = -torch.min(ratio * advantages, clipped * advantages)  # [B, T]
    if weights is not None:
        token_loss = token_loss * weights
    kl = torch.zeros_like(logps)
    if settings.beta != 0.0:
        if inputs.reference_logps is None:
            raise ValueError("policy_loss: beta > 0 needs reference_logps")
        delta = inputs.reference_logps.float() - logps
        kl = torch.exp(delta) - delta - 1  # [B, T], KL3 estimator of KL(pi_theta || pi_ref)
        token_loss = token_loss + settings.beta * ratio * kl  # the ratio (1 in value) makes the gradient unbiased
    rule = aggregator(settings.aggregation)
    if normaliser is None:
        normaliser = rule.normaliser(StepCounts.of(mask, None, inputs.verdict_mask), settings.max_completion_length)
    loss = share(rule.total(token_loss, mask), normaliser)
    with torch.no_grad():
        low = (ratio < 1 - settings.epsilon_low) & (advantages < 0)
        high = (ratio > 1 + settings.epsilon_high) & (advantages > 0)
        return LossOutputs(loss, tokens=mask.sum().float(), kl=(kl * mask).sum(),
                           clipped_low=(low * mask).sum().float(), clipped_high=(high * mask).sum().float())


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float, normaliser: torch.Tensor | float | None = None) -> torch.Tensor:
    """The clipped value loss ``0.5 max((V - R)^2, (clip(V, V_old +- clip) - R)^2)`` summed over loss tokens / the
    step's loss tokens ``normaliser`` (None: this batch's own, a mean); all [B, T]."""
    clipped = torch.clamp(values, old_values - clip, old_values + clip)
    loss = 0.5 * torch.max((values - returns) ** 2, (clipped - returns) ** 2)
    return share((loss * mask).sum(), mask.sum() if normaliser is None else normaliser)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var(R - V) / Var(R)`` over loss tokens: 1 for a perfect critic, 0 for a constant one."""
    inside = mask.bool()
    target = returns[inside]
    if target.numel() < 2 or target.var() == 0:
        return float("nan")
    return (1 - (target - values[inside]).var() / target.var()).item()


def sampler_weights(trainer_logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor,
                    cap: float = SAMPLER_CAP) -> torch.Tensor:
    """[B, 1] per completion pi_trainer / pi_sampler (product over its tokens), 0 where it exceeds ``cap``.

    Corrects for vLLM sampling from slightly other probabilities than the trained model computes;
    tokens whose sampler log-prob is unknown (NaN) count as ratio 1.
    """
    diff = torch.nan_to_num((trainer_logps.float() - sampler_logps) * mask, nan=0.0)  # [B, T]
    ratio = torch.exp(diff.sum(dim=-1, keepdim=True))  # [B, 1]
    return ratio.masked_fill(ratio > cap, 0.0)



def truncated_importance_weights(trainer_logps: torch.Tensor, sampler_logps: torch.Tensor,
                                 cap: float) -> torch.Tensor:
    """[B, T] truncated importance sampling (TIS): ``min(pi_trainer / pi_sampler, cap)`` per token, 1 where the
    sampler's log-prob is unknown (NaN).

    ``trainer_logps`` [B, T]: the trained policy's log-probs of the tokens before the step's update (the loss's old
    log-probs, at the sampling temperature); ``sampler_logps`` [B, T]: those of the policy that sampled them (an
    engine's processed log-probs, or a resumed partial rollout's recorded ones). Multiplying each token's loss, the
    weights correct its expectation to the trained policy's, with the variance bounded by ``cap``.
    """
    log_ratio = torch.nan_to_num(trainer_logps.float() - sampler_logps.float(), nan=0.0)  # [B, T]
    return torch.exp(log_ratio).clamp(max=cap)
