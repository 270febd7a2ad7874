"""Loss terms beside the policy gradient, each a sum over its own tokens divided by the step's count of them.

- ``FeedbackCE`` (``loss.ce_weight``): cross-entropy on the feedback tokens of multi-turn completions, so
  the policy learns what the environment answers while RL trains its decisions (ECHO, arXiv 2605.24517). It is
  the model's own CE, at temperature 1: ``log_softmax(logits)`` of the policy's logits. TRL's log-probs, which
  the policy-gradient term reads, are ``log_softmax(logits / T)`` at the sampling temperature T: the sampling policy's, right for a
  ratio to it, not the model's CE that MoL and ECHO train.
- ``DecisionKL`` (``loss.kl_weight``): the full-vocabulary KL(policy || base) on decision tokens, MoL's
  term (``molrl.mol.losses``), the base being the policy with its adapter disabled, both at temperature 1.

Both terms are MoL's, under MoL's key names, computed by the one closed form of each (``molrl.divergence``).

Both read the policy's completion logits from one more forward pass of the policy (with grad), run once per
micro-batch when either term is on (``CompletionLogits``); ``DecisionKL`` adds one of the base (without).

Each term divides its micro-batch's sum by the step's count of its own tokens (``StepCounts``: the optimiser
step's, over all micro-batches and processes; prime-rl's separate normalisers, MoL's step counts), so feedback
tokens never dilute the policy term nor decisions the CE, a micro-batch without feedback adds 0 and counts for
nothing, and the step's term and its gradient are the same however the step is split. With both terms on,
MoL's loss (CE on feedback, KL on decisions) is part of RL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from trl.trainer.utils import use_adapter

from molrl.divergence import token_kl, token_logps
from molrl.rl.batch import LossInputs, StepCounts, join
from molrl.rl.config import TermSettings
from molrl.rl.loss import share


class CompletionLogits:
    """A micro-batch's next-token logits at its completion positions, at temperature 1; each model's forward
    runs once, when a term first reads it."""

    def __init__(self, trainer: Any, model: Any, batch: LossInputs):
        self.trainer, self.model, self.batch = trainer, model, batch
        self._policy: torch.Tensor | None = None
        self._base: torch.Tensor | None = None

    def policy(self) -> torch.Tensor:
        """[B, T, V] the policy's logits (with grad)."""
        if self._policy is None:
            self._policy = self._forward()
        return self._policy

    def base(self) -> torch.Tensor:
        """[B, T, V] the base's logits: the policy with its adapter disabled, without grad."""
        if self._base is None:
            with torch.no_grad(), use_adapter(self.trainer.accelerator.unwrap_model(self.model), adapter_name=None):
                self._base = self._forward()
        return self._base

    def _forward(self) -> torch.Tensor:
        batch = self.batch
        ids, attention = join(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.attention())
        with self.trainer.accelerator.autocast():  # as TRL's log-prob forward
            return completion_logits(self.model, ids, attention, batch.completion_ids.size(1))


class Term(Protocol):
    """A loss term: its weight, the metric it logs under, and its share of the step's value on a micro-batch."""

    weight: float
    metric: str

    def loss(self, logits: CompletionLogits, batch: LossInputs, counts: StepCounts) -> torch.Tensor:
        """[] the term's sum over ``batch``'s tokens of its kind / the step's count of them (``counts``)."""
        ...


def feedback_cross_entropy(logps: torch.Tensor, feedback_mask: torch.Tensor,
                           normaliser: torch.Tensor | float | None = None) -> torch.Tensor:
    """[] sum over feedback tokens of -log p(token) / ``normaliser``, the step's feedback tokens (None: this
    batch's own, a mean); ``logps`` and ``feedback_mask`` [B, T]; 0 without feedback."""
    mask = feedback_mask.to(logps.dtype)
    return share(-(logps * mask).sum(), mask.sum() if normaliser is None else normaliser)


def decision_kl(policy_logits: torch.Tensor, base_logits: torch.Tensor, decision_mask: torch.Tensor,
                normaliser: torch.Tensor | float | None = None) -> torch.Tensor:
    """[] sum over decision tokens of KL(softmax(policy) || softmax(base)) / ``normaliser``, the step's decision
    tokens (None: this batch's own, a mean); logits [B, T, V], mask [B, T]."""
    kl = token_kl(policy_logits, base_logits)  # [B, T]
    mask = decision_mask.to(kl.dtype)
    return share((kl * mask).sum(), mask.sum() if normaliser is None else normaliser)


@dataclass
class FeedbackCE:
    """CE on feedback tokens (ECHO), at temperature 1."""

    weight: float
    metric: str = "loss/feedback_ce"

    def loss(self, logits: CompletionLogits, batch: LossInputs, counts: StepCounts) -> torch.Tensor:
        """[] the CE of the policy's own (temperature-1) log-probs over the batch's feedback tokens / the step's."""
        if batch.feedback_mask is None:
            return torch.zeros((), device=batch.completion_ids.device)
        logps = token_logps(logits.policy(), batch.completion_ids, batch.feedback_mask)  # [B, T]
        return feedback_cross_entropy(logps, batch.feedback_mask, counts.feedback)


@dataclass
class DecisionKL:
    """Full-vocabulary KL(policy || base) on decision tokens (MoL's term)."""

    weight: float
    metric: str = "loss/decision_kl"

    def loss(self, logits: CompletionLogits, batch: LossInputs, counts: StepCounts) -> torch.Tensor:
        """[] the KL over the batch's decision tokens (the policy gradient's) / the step's."""
        return decision_kl(logits.policy(), logits.base(), batch.completion_mask, counts.tokens)


def completion_logits(model: Any, ids: torch.Tensor, attention: torch.Tensor, width: int) -> torch.Tensor:
    """[B, T, V] the next-token logits at the positions that predict the last ``width`` tokens of ``ids``."""
    logits = model(input_ids=ids, attention_mask=attention, logits_to_keep=width + 1).logits  # [B, T+1, V]
    return logits[:, -width - 1:-1]


def build_terms(settings: TermSettings) -> list[Term]:
    """The terms with a weight above 0, in a fixed order."""
    terms: list[Term] = []
    if settings.ce_weight > 0:
        terms.append(FeedbackCE(settings.ce_weight))
    if settings.kl_weight > 0:
        terms.append(DecisionKL(settings.kl_weight))
    return terms
