"""The KL reference of an RL run (used when beta > 0): always the model ``model.reference`` names.

TRL picks the reference by case, so ``install_reference`` fixes the cases where TRL's choice differs from ours:

=====================  ======================================  =====================================
policy                 reference = base                        reference = mol
=====================  ======================================  =====================================
plain base + new LoRA  adapter disabled (TRL)                  (not allowed: there is no MoL model)
continue MoL adapter   adapter disabled: TRL's frozen "ref"     TRL's frozen "ref" copy of the MoL
                       adapter copy is deleted                 adapter
merge_new              a separately loaded frozen base (TRL     adapter disabled = merged MoL (TRL)
                       would use the merged MoL)
=====================  ======================================  =====================================
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from trl.models import prepare_deepspeed, prepare_fsdp

log = logging.getLogger(__name__)


def install_reference(trainer: Any, reference: str, adapter_mode: str | None, base_loader: Any) -> str:
    """Make the trainer's KL reference the one ``reference`` names; returns a one-line description.

    ``adapter_mode`` is None for a plain base, else ``continue`` or ``merge_new``; ``base_loader()``
    returns a fresh copy of the original base model (only called for merge_new + base).
    """
    if trainer.cfg.beta == 0.0:
        return "none (beta = 0)"
    peft_model = trainer.accelerator.unwrap_model(trainer.model)
    if adapter_mode is None:
        return "base (policy with its LoRA adapter disabled)"
    if adapter_mode == "continue":
        if reference == "base":
            if "ref" in peft_model.peft_config:
                peft_model.delete_adapter("ref")
            peft_model.set_adapter("default")
            return "base (policy with its adapter disabled)"
        if "ref" not in peft_model.peft_config:
            raise RuntimeError("TRL did not create the frozen 'ref' copy of the MoL adapter; check the trl version")
        return "mol (frozen copy of the MoL adapter, named 'ref')"
    if reference == "mol":
        return "mol (merged MoL weights with the new adapter disabled)"
    ref_model = base_loader()
    ref_model.requires_grad_(False)
    ref_model.eval()
    trainer.logprobs.fuse_head(ref_model)
    if trainer.is_deepspeed_enabled:  # placed exactly as TRL places its own reference model
        trainer.ref_model = prepare_deepspeed(ref_model, trainer.accelerator)
    elif trainer.is_fsdp_enabled:
        trainer.ref_model = prepare_fsdp(ref_model, trainer.accelerator)
    else:
        trainer.ref_model = trainer.accelerator.prepare_model(ref_model.to(trainer.accelerator.device),
                                                              evaluation_mode=True)
    return "base (separately loaded frozen copy of the original base)"


def trainable_parameter_count(model: torch.nn.Module) -> int:
    """Number of parameters that receive gradients."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
