"""Exact per-token KL between the policy and the base, for the periodic evaluation hook.

Training logs TRL's sampled k3 estimate against the *reference*; the hook instead reports the
exact divergence over the whole vocabulary at each completion position,
``KL_t = sum_v p(v) (log p(v) - log q(v))`` with p the policy and q the base, averaged over the
completion tokens, so forgetting is visible even when beta is 0.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from molrl.content import encode_content
from molrl.divergence import token_kl
from molrl.engines.generation import prompt_ids


def mean_token_kl(policy_logits: torch.Tensor, base_logits: torch.Tensor, completion_mask: torch.Tensor) -> float:
    """Mean over completion positions of KL(softmax(policy) || softmax(base)).

    ``policy_logits``/``base_logits``: [B, T, V]; ``completion_mask``: [B, T], 1 on the positions
    whose next-token distribution is scored.
    """
    kl = token_kl(policy_logits, base_logits)  # [B, T]
    mask = completion_mask.to(kl.dtype)
    return float((kl * mask).sum() / mask.sum().clamp(min=1.0))


@torch.no_grad()
def policy_base_kl(policy: Any, base: Any, tokenizer: Any, prompts: Sequence[str], completions: Sequence[str]) -> float:
    """Mean per-token KL(policy || base) on ``completions`` of ``prompts`` (one completion each).

    ``base`` is either a model or a context-manager factory that, entered, turns ``policy`` into
    the base (a PEFT model's ``disable_adapter``).
    """
    device = next(policy.parameters()).device
    rows, masks = [], []
    for prompt, completion in zip(prompts, completions):
        p_ids = prompt_ids(tokenizer, prompt)
        c_ids = encode_content(tokenizer, completion)[0] + [tokenizer.eos_token_id]
        ids = p_ids + c_ids
        # position t predicts token t + 1: score the positions that predict completion tokens
        scored = [0] * (len(p_ids) - 1) + [1] * len(c_ids) + [0]
        rows.append(ids)
        masks.append(scored)
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)  # [B, L] right-padded
    attention_mask = torch.zeros_like(input_ids)
    completion_mask = torch.zeros_like(input_ids)
    for i, (ids, scored) in enumerate(zip(rows, masks)):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention_mask[i, : len(ids)] = 1
        completion_mask[i, : len(ids)] = torch.tensor(scored)
    batch = {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device)}
    was_training = policy.training
    policy.eval()
    try:
        policy_logits = policy(**batch).logits  # [B, L, V]
        if callable(base) and not isinstance(base, torch.nn.Module):
            with base():
                base_logits = policy(**batch).logits  # [B, L, V]
        else:
            base_logits = base(**batch).logits  # [B, L, V]
    finally:
        policy.train(was_training)
    return mean_token_kl(policy_logits, base_logits, completion_mask.to(device))
