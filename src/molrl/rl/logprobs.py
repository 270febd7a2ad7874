"""The policy's log-probs, in one place: the sampling temperature and the one rule that applies it.

Every log-prob the RL stage sets beside a sampled token is ``log_softmax(logits / T)[token]``, where T is the
rollouts' sampling temperature (``RlConfig.sampling.temperature``, read from the trainer's config here and nowhere
else). ``LogProbs`` computes them for:

- the loss (``of``: with grad, through TRL's computation, which reads them off the fused head);
- the behaviour policy, the reference, an algorithm's teacher, partial rollouts' recorded tokens and the engine-gap
  metric (``completion``: without grad, in micro-batches);
- PROPS' behaviour objective, from logits it already holds (``tempered``);
- frozen models that TRL's computation reads (``fuse_head``: their head at the same temperature).

The CE and KL terms (``molrl.rl.terms``) read the policy at temperature 1: the model's own distribution, as the MoL
stage trains it; they are not sampling log-probs.
"""

from __future__ import annotations

from typing import Any

import torch
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import add_fused_lm_head

from molrl.rl.batch import join


class LogProbs:
    """The trainer's log-prob computations at its sampling temperature."""

    def __init__(self, trainer: Any):
        self.trainer = trainer

    @property
    def temperature(self) -> float:
        """T: the rollouts' sampling temperature."""
        return self.trainer.cfg.sampling.temperature

    def of(self, model: Any, ids: torch.Tensor, attention: torch.Tensor, width: int, batch_size: int | None = None,
           entropies: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """([B, width] log-probs of the last ``width`` tokens of ``ids`` [B, L], [B, width] the policy's entropy at
        each of their states or None), at T, with grad where the caller has it."""
        logps, entropy, _ = self.trainer._get_per_token_logps_and_entropies(
            model, ids, attention, width, batch_size=batch_size, compute_entropy=entropies)
        return logps, entropy

    def completion(self, model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                   completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                   entropies: bool = False) -> torch.Tensor:
        """[B, T] log-probs of the completion tokens after the prompts (or, with ``entropies``, the policy's entropy
        at each of their states), without grad, a micro-batch at a time; ``completion_mask`` is what attention sees
        of the completions."""
        trainer = self.trainer
        ids, attention = join(prompt_ids, prompt_mask, completion_ids, completion_mask)
        args = trainer.args
        size = args.per_device_train_batch_size if trainer.model.training else args.per_device_eval_batch_size
        with torch.no_grad(), disable_gradient_checkpointing(trainer.model, args.gradient_checkpointing_kwargs):
            logps, entropy = self.of(model, ids, attention, completion_ids.size(1), batch_size=size,
                                     entropies=entropies)
        return entropy if entropies else logps

    def tempered(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` [..., V] at T: what a log-softmax turns into the sampling policy's log-probs."""
        return logits / self.temperature

    def fuse_head(self, model: Any) -> None:
        """Give a frozen ``model`` the fused head TRL's computation reads its log-probs from, at T."""
        add_fused_lm_head(model, temperature=self.temperature,
                          cast_lm_head_to_fp32=self.trainer.args.cast_lm_head_to_fp32)
