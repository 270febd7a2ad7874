"""Loss terms beside the policy gradient, each a sum over its own tokens divided by their count.

- ``FeedbackCE`` (``terms.feedback_ce``): cross-entropy on the feedback tokens of multi-turn completions, so
  the policy learns what the environment answers while RL trains its decisions (ECHO, arXiv 2605.24517). It
  reads the log-probs the policy term already computed: no extra forward pass.
- ``DecisionKL`` (``terms.decision_kl``): the full-vocabulary KL(policy || base) on decision tokens, MoL's
  term (``molrl.mol.losses``), the base being the policy with its adapter disabled. It needs the whole next-token
  distributions, so it runs one more forward pass of the policy (with grad) and one of the base (without).

Each term is normalised over its own tokens of the micro-batch (prime-rl's separate normalisers), so feedback
tokens never dilute the policy term nor decisions the CE; under several processes DDP averages their gradients
as it does the policy term's. With both terms on, MoL's loss (CE on feedback, KL on decisions) is part of RL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from trl.trainer.utils import use_adapter

from molrl.rl.batch import LossInputs, join
from molrl.rl.config import TermSettings


class Term(Protocol):
    """A loss term: its weight, the metric it logs under, and its value on a micro-batch."""

    weight: float
    metric: str

    def loss(self, trainer: Any, model: Any, batch: LossInputs, logps: torch.Tensor) -> torch.Tensor:
        """[] the term on ``batch``; ``logps`` [B, T] are the policy's log-probs of the completion tokens (with grad)."""
        ...


def feedback_cross_entropy(logps: torch.Tensor, feedback_mask: torch.Tensor) -> torch.Tensor:
    """[] mean over feedback tokens of -log p(token); ``logps`` and ``feedback_mask`` [B, T]; 0 without feedback."""
    mask = feedback_mask.to(logps.dtype)
    return -(logps * mask).sum() / mask.sum().clamp(min=1.0)


def decision_kl(policy_logits: torch.Tensor, base_logits: torch.Tensor, decision_mask: torch.Tensor) -> torch.Tensor:
    """[] mean over decision tokens of KL(softmax(policy) || softmax(base)); logits [B, T, V], mask [B, T]."""
    policy = torch.log_softmax(policy_logits.float(), dim=-1)  # [B, T, V]
    base = torch.log_softmax(base_logits.float(), dim=-1)  # [B, T, V]
    kl = (policy.exp() * (policy - base)).sum(-1)  # [B, T]
    mask = decision_mask.to(kl.dtype)
    return (kl * mask).sum() / mask.sum().clamp(min=1.0)


@dataclass
class FeedbackCE:
    """CE on feedback tokens (ECHO)."""

    weight: float
    metric: str = "loss/feedback_ce"

    def loss(self, trainer: Any, model: Any, batch: LossInputs, logps: torch.Tensor) -> torch.Tensor:
        """[] the mean CE over the batch's feedback tokens (0 when it has none)."""
        if batch.feedback_mask is None:
            return logps.sum() * 0.0
        return feedback_cross_entropy(logps.float(), batch.feedback_mask)


@dataclass
class DecisionKL:
    """Full-vocabulary KL(policy || base) on decision tokens (MoL's term)."""

    weight: float
    metric: str = "loss/decision_kl"

    def loss(self, trainer: Any, model: Any, batch: LossInputs, logps: torch.Tensor) -> torch.Tensor:
        """[] the mean KL over the batch's decision tokens (the policy gradient's tokens)."""
        ids, attention = join(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.attention())
        width = batch.completion_ids.size(1)
        policy = completion_logits(model, ids, attention, width)  # [B, T, V]
        with torch.no_grad(), use_adapter(trainer.accelerator.unwrap_model(model), adapter_name=None):
            base = completion_logits(model, ids, attention, width)  # [B, T, V], the adapter disabled
        return decision_kl(policy, base, batch.completion_mask)


def completion_logits(model: Any, ids: torch.Tensor, attention: torch.Tensor, width: int) -> torch.Tensor:
    """[B, T, V] the next-token logits at the positions that predict the last ``width`` tokens of ``ids``."""
    logits = model(input_ids=ids, attention_mask=attention).logits  # [B, P+T, V]
    return logits[:, -width - 1:-1]


def build_terms(settings: TermSettings) -> list[Term]:
    """The terms with a weight above 0, in a fixed order."""
    terms: list[Term] = []
    if settings.feedback_ce > 0:
        terms.append(FeedbackCE(settings.feedback_ce))
    if settings.decision_kl > 0:
        terms.append(DecisionKL(settings.decision_kl))
    return terms
