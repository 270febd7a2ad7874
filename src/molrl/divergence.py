"""MoL's two terms per token, in closed form, for every stage that trains or measures them.

- ``token_kl``: the full-vocabulary KL between the policy's and the base's next-token distributions at each
  position, reverse KL(p || q) or forward KL(q || p), both at a temperature T (MoL's decision term).
- ``token_logps``: the model's own log-prob of each token, ``log_softmax(logits)`` at temperature 1 (MoL's feedback
  cross-entropy is its negative).

RL's decision-KL and feedback-CE terms (``molrl.rl.terms``) and its evaluation hook's KL to the base
(``molrl.rl.kl``) call these. MoL's loss (``molrl.mol.losses``) computes the same two quantities chunk by chunk
inside its fused head loss, with their gradients in closed form, so that no [tokens, vocab] tensor is held; its tests
compare it with these.
"""

from __future__ import annotations

from typing import Literal

import torch


def token_kl(policy_logits: torch.Tensor, base_logits: torch.Tensor,
             direction: Literal["reverse", "forward"] = "reverse", temperature: float = 1.0) -> torch.Tensor:
    """[...] the KL at each position between softmax(policy / T) = p and softmax(base / T) = q: reverse
    sum_v p (log p - log q), forward sum_v q (log q - log p); logits [..., V], in float32."""
    logp = torch.log_softmax(policy_logits.float() / temperature, dim=-1)  # [..., V]
    logq = torch.log_softmax(base_logits.float() / temperature, dim=-1)  # [..., V]
    if direction == "reverse":
        return (logp.exp() * (logp - logq)).sum(-1)  # [...]
    return (logq.exp() * (logq - logp)).sum(-1)  # [...]


def token_logps(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] ``log_softmax(logits)`` of each token of ``ids`` where ``mask`` is 1, 0 elsewhere (the model's own
    log-probs, temperature 1; the softmax is formed only there); ``logits`` [B, T, V], ``ids`` and ``mask`` [B, T]."""
    selected = mask.bool()
    picked = torch.log_softmax(logits[selected].float(), dim=-1)  # [n, V]
    logps = picked.gather(-1, ids[selected].unsqueeze(-1)).squeeze(-1)  # [n]
    return torch.zeros(ids.shape, dtype=logps.dtype, device=logps.device).masked_scatter(selected, logps)
