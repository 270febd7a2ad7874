"""The stop at a non-finite step: MoL and RL training end at the first gradient that is not finite, and never
save trained weights that hold a NaN or an infinity.

A non-finite loss back-propagates into non-finite gradients, so the gradient norm, measured once per optimiser
step before the optimiser applies it, catches both; the weights of every earlier step are still finite then.
transformers' own ``logging_nan_inf_filter`` only hides such a loss from the log, and the run would go on and
save weights of NaN.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers import TrainerCallback

from molrl.errors import MolrlError


class NonFiniteError(MolrlError):
    """Training produced a NaN or an infinity; the message names the step and the settings to change."""


class NonFiniteGuard(TrainerCallback):
    """Stops training at the first optimiser step whose gradient norm is not finite, and before a checkpoint of
    weights that are not; ``hint`` names the config values that scale the loss (``loss.temperature=1e-300``)."""

    def __init__(self, hint: str):
        self.hint = hint

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        norm = gradient_norm(model)
        if not math.isfinite(norm):
            raise NonFiniteError(
                f"step {state.global_step + 1}: the loss's gradient norm is {norm} (not finite), so training stopped "
                f"before applying it; nothing of this step is saved. The settings that scale the loss: {self.hint}; "
                "change them (or the data) and train again in a new output_dir")

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if control.should_save:  # the checkpoint is written right after this, so its weights are looked at now
            check_finite_weights(model, f"the checkpoint of step {state.global_step}", self.hint)


def gradient_norm(model: Any) -> float:
    """The 2-norm of all gradients of ``model``'s parameters (0.0 when none has one): each tensor's norm in its own
    dtype (no copy of a large gradient), their total in float64."""
    grads = [p.grad.detach() for p in model.parameters() if p.grad is not None]
    if not grads:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g).double() for g in grads])))


def check_finite_weights(model: Any, where: str, hint: str) -> None:
    """Refuse to save ``model``'s trained tensors (those with ``requires_grad``) when any holds a NaN or an
    infinity; ``where`` is what would have been written."""
    trained = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    bad = [name for name, p in trained if not bool(torch.isfinite(p.detach()).all())]
    if bad:
        raise NonFiniteError(
            f"{where} not saved: {len(bad)} of {len(trained)} trained tensors hold NaN or infinite values "
            f"(first: {bad[0]}). The settings that scale the loss: {hint}; change them and train again in a new "
            "output_dir")
