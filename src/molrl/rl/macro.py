"""Macro actions (MA-RLHF, arXiv 2410.02743): tokens grouped into macro actions, and credit assigned per group.

A completion's loss tokens are split into macro actions (MAs) by a termination rule; every token
then carries the index of its MA (``ma_ids`` [T], -1 off the loss mask). On those groups:

- ``macro_gae``: generalised advantage estimation over MAs instead of tokens. An MA's reward is the
  sum of its tokens' rewards (so returns are unchanged), its value the pooled value of its tokens;
  ``delta_m = r_m + gamma V_{m+1} - V_m``, ``A_m = delta_m + gamma lam A_{m+1}``, return ``A_m + V_m``;
  every token of an MA gets the MA's advantage and return. Rule ``fixed:1`` is token-level GAE.
- ``pool_advantages``: any per-token advantage replaced by its MA's pooled advantage.

Pooling weights within an MA of k tokens (the paper's value functions): ``equal`` 1/k each,
``unit`` all on the last token, ``position`` proportional to 1/(i+1) for the i-th token.
The authors' code pools an MA's rewards with the same weights as its values; summing them instead
keeps the return of a sequence whatever the segmentation (they agree when the final reward sits
alone in the last MA, which the authors' note asks for).

Termination rules (``segment``): ``fixed:N`` every N tokens; ``randomized`` lengths drawn from
{1, 2, 3, 5, 10}; ``ppl`` a new MA where the reference model's per-token perplexity rises;
``parsing`` a new MA after each line of code or sentence of prose; ``turn`` one MA per turn
(a single-turn completion is one MA).
"""

from __future__ import annotations

import random
import re
from typing import Literal, Sequence

import torch

Pooling = Literal["equal", "unit", "position"]
RANDOM_LENGTHS = (1, 2, 3, 5, 10)
"""MA lengths of the ``randomized`` rule (the paper's)."""
_SENTENCE_END = re.compile(r"(\n|[.!?][\"')\]]?\s*$)")


def _ids_from_lengths(mask: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
    """[T] MA index of each loss token, MAs of the given lengths in order (the last one takes the rest)."""
    ids = torch.full_like(mask, -1, dtype=torch.long)
    positions = mask.nonzero().flatten().tolist()
    ma, used, k = 0, 0, 0
    for pos in positions:
        if k < len(lengths) and used == lengths[k]:
            ma, used, k = ma + 1, 0, k + 1
        ids[pos] = ma
        used += 1
    return ids


def fixed_segments(mask: torch.Tensor, n: int) -> torch.Tensor:
    """[T] MA ids: every ``n`` loss tokens."""
    if n < 1:
        raise ValueError(f"macro rule fixed:{n}: N must be at least 1")
    count = int(mask.sum().item())
    return _ids_from_lengths(mask, [n] * (count // n + 1))


def randomized_segments(mask: torch.Tensor, rng: random.Random) -> torch.Tensor:
    """[T] MA ids: lengths drawn uniformly from ``RANDOM_LENGTHS`` until the completion is covered."""
    count, lengths = int(mask.sum().item()), []
    while sum(lengths) < count:
        lengths.append(rng.choice(RANDOM_LENGTHS))
    return _ids_from_lengths(mask, lengths)


def ppl_segments(mask: torch.Tensor, reference_logps: torch.Tensor) -> torch.Tensor:
    """[T] MA ids: a new MA starts at each loss token whose reference perplexity exp(-logp) exceeds the previous one's."""
    ids = torch.full_like(mask, -1, dtype=torch.long)
    ma, previous = -1, None
    for pos in mask.nonzero().flatten().tolist():
        ppl = float(torch.exp(-reference_logps[pos]))
        if previous is None or ppl > previous:
            ma += 1
        ids[pos] = ma
        previous = ppl
    return ids


def parsing_segments(mask: torch.Tensor, token_texts: Sequence[str]) -> torch.Tensor:
    """[T] MA ids: a new MA after each token that ends a line (code) or a sentence (prose)."""
    ids = torch.full_like(mask, -1, dtype=torch.long)
    ma, close = 0, False
    for pos in mask.nonzero().flatten().tolist():
        if close:
            ma += 1
        ids[pos] = ma
        close = bool(_SENTENCE_END.search(token_texts[pos]))
    return ids


def segment(rule: str, mask: torch.Tensor, *, rng: random.Random | None = None,
            reference_logps: torch.Tensor | None = None, token_texts: Sequence[str] | None = None) -> torch.Tensor:
    """[T] MA ids of one completion's loss tokens (``mask`` [T]) under ``rule``; -1 off the mask."""
    if rule.startswith("fixed:"):
        return fixed_segments(mask, int(rule.split(":", 1)[1]))
    if rule == "token":
        return fixed_segments(mask, 1)
    if rule == "randomized":
        return randomized_segments(mask, rng or random.Random(0))
    if rule == "ppl":
        if reference_logps is None:
            raise ValueError("macro rule ppl needs the reference model's log-probs of the completion")
        return ppl_segments(mask, reference_logps)
    if rule == "parsing":
        if token_texts is None:
            raise ValueError("macro rule parsing needs the text of each completion token")
        return parsing_segments(mask, token_texts)
    if rule == "turn":
        return _ids_from_lengths(mask, [])
    raise ValueError(f"unknown macro rule {rule!r}; expected token, fixed:N, randomized, ppl, parsing or turn")


def pool_weights(k: int, pooling: Pooling) -> torch.Tensor:
    """[k] weights of an MA's k tokens, summing to 1."""
    if pooling == "equal":
        return torch.full((k,), 1.0 / k)
    if pooling == "unit":
        weights = torch.zeros(k)
        weights[-1] = 1.0
        return weights
    if pooling == "position":
        weights = 1.0 / torch.arange(1, k + 1, dtype=torch.float32)
        return weights / weights.sum()
    raise ValueError(f"unknown pooling {pooling!r}; expected equal, unit or position")


def _pooled(values: torch.Tensor, ma_ids: torch.Tensor, pooling: Pooling) -> torch.Tensor:
    """[M] pooled value of each MA of one completion."""
    count = int(ma_ids.max().item()) + 1 if (ma_ids >= 0).any() else 0
    out = torch.zeros(count, dtype=values.dtype)
    for m in range(count):
        members = values[ma_ids == m]
        out[m] = (members * pool_weights(members.numel(), pooling).to(values.dtype)).sum()
    return out


def macro_gae(rewards: torch.Tensor, values: torch.Tensor, ma_ids: torch.Tensor, gamma: float = 1.0,
              lam: float = 0.95, pooling: Pooling = "equal") -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages [T], returns [T]) of one completion: GAE over its MAs, spread back to their tokens.

    ``rewards`` and ``values`` are per token [T]; tokens with ``ma_ids`` -1 get 0.
    """
    count = int(ma_ids.max().item()) + 1 if (ma_ids >= 0).any() else 0
    ma_rewards = torch.zeros(count, dtype=rewards.dtype)
    for m in range(count):
        ma_rewards[m] = rewards[ma_ids == m].sum()
    ma_values = _pooled(values, ma_ids, pooling)
    ma_advantages = torch.zeros(count, dtype=rewards.dtype)
    running = 0.0
    for m in reversed(range(count)):
        following = ma_values[m + 1] if m + 1 < count else 0.0
        delta = ma_rewards[m] + gamma * following - ma_values[m]
        running = delta + gamma * lam * running
        ma_advantages[m] = running
    ma_returns = ma_advantages + ma_values
    inside = ma_ids >= 0
    advantages, returns = torch.zeros_like(rewards), torch.zeros_like(rewards)
    advantages[inside] = ma_advantages[ma_ids[inside]]
    returns[inside] = ma_returns[ma_ids[inside]]
    return advantages, returns


def pool_advantages(advantages: torch.Tensor, ma_ids: torch.Tensor, pooling: Pooling = "equal") -> torch.Tensor:
    """[B, T] each token's advantage replaced by its MA's pooled advantage (rows of ``ma_ids`` [B, T])."""
    out = torch.zeros_like(advantages)
    for row in range(advantages.size(0)):
        inside = ma_ids[row] >= 0
        pooled = _pooled(advantages[row], ma_ids[row], pooling)
        out[row, inside] = pooled[ma_ids[row][inside]]
    return out
