"""Forgetting beyond a world's own general problems: the NLL a model gives a general corpus none of the runs trained on.

A corpus is (prompt, answer) pairs, each posed as one chat turn (the user's prompt, then the assistant's answer),
and a model's NLL is the mean of -log p(token) over every answer token (the prompt's tokens are context, not
scored), each answer cut at ``max_tokens``. A model that forgets general text gives it a higher NLL than the base.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch


def answer_nll(model: Any, tokenizer: Any, pairs: Sequence[tuple[str, str]], max_tokens: int = 256) -> tuple[float, int]:
    """(sum of -log p over the answers' tokens, the number of those tokens) of ``model`` on ``pairs``, each answer read
    after its prompt rendered as a chat turn with the tokenizer's template, cut at ``max_tokens`` tokens."""
    from molrl.chat import render

    total, count = 0.0, 0
    for prompt, answer in pairs:
        context = tokenizer(render(tokenizer, [{"role": "user", "content": prompt}], add_generation_prompt=True),
                            add_special_tokens=False)["input_ids"]
        target = tokenizer(answer, add_special_tokens=False)["input_ids"][:max_tokens]
        if not target:
            continue
        ids = torch.tensor([context + target])
        with torch.no_grad():
            logits = model(ids).logits[0, len(context) - 1:-1].float()  # [answer tokens, vocab]
        total += float(torch.nn.functional.cross_entropy(logits, ids[0, len(context):], reduction="sum"))
        count += len(target)
    return total, count


def mean_nll(total: float, count: int) -> float:
    """NLL per token (nan for no tokens).

    >>> mean_nll(6.0, 3), math.isnan(mean_nll(0.0, 0))
    (2.0, True)
    """
    return total / count if count else math.nan
