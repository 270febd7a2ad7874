"""The policy GRPO trains: a plain base with a new LoRA, the MoL adapter continued, or MoL merged + new LoRA.

``build_policy`` returns the model and the ``peft_config`` to hand TRL (None when the model
already carries the adapter to train), and ``load_base`` for whoever needs the original base
weights separately (the KL reference or the eval hook after merge_new).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from peft import LoraConfig

from molrl.errors import MolrlError
from molrl.models import load_model, load_tokenizer
from molrl.rl.adapter_lora import resolve_adapter_dir  # noqa: F401  (where it lived; kept importable)
from molrl.rl.config import RlConfig

log = logging.getLogger(__name__)


@dataclass
class Policy:
    """What ``build_policy`` made."""

    model: Any
    """The model handed to TRL (a PeftModel for continue; a plain model otherwise)."""
    tokenizer: Any
    """Its tokenizer (left padding)."""
    peft_config: Any
    """The LoRA config TRL wraps the model with, or None when the model already carries the adapter."""
    adapter_mode: str | None
    """None for a plain base, else continue or merge_new."""
    description: str
    """One line for the log."""
    load_base: Callable[[], Any]
    """Loads a fresh copy of the original base model."""
    trainer: Any = None
    """The trainer, once built (the eval hook reads the reference from it)."""


def lora_config(cfg: RlConfig) -> Any:
    """The PEFT LoraConfig for a freshly created adapter."""
    if "lm_head" in cfg.lora.target_modules:
        raise MolrlError("lora.target_modules must not include lm_head: TRL scores tokens from lm_head.weight directly")
    return LoraConfig(
        r=cfg.lora.rank,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=list(cfg.lora.target_modules),
        task_type="CAUSAL_LM",
    )


def build_policy(cfg: RlConfig) -> Policy:
    """Load the base, put the MoL adapter on it as ``adapter_mode`` says, and describe the result."""
    m = cfg.model
    tokenizer = load_tokenizer(m.path)

    def load_base() -> Any:
        model = load_model(m.path, dtype=m.dtype, seed=m.seed)
        _sync_pad(model, tokenizer)
        return model

    if m.adapter is None:
        return Policy(load_base(), tokenizer, lora_config(cfg), None, f"{m.path} + new LoRA r={cfg.lora.rank}", load_base)
    adapter = resolve_adapter_dir(m.adapter)
    if m.adapter_mode == "continue":
        model = load_model(m.path, dtype=m.dtype, seed=m.seed, adapter=adapter, adapter_trainable=True)
        _sync_pad(model, tokenizer)
        return Policy(model, tokenizer, None, "continue", f"{m.path} + MoL adapter {adapter} (trained further)", load_base)
    merged = load_model(m.path, dtype=m.dtype, seed=m.seed, adapter=adapter).merge_and_unload()
    _sync_pad(merged, tokenizer)
    description = f"{m.path} with MoL adapter {adapter} merged + new LoRA r={cfg.lora.rank}"
    return Policy(merged, tokenizer, lora_config(cfg), "merge_new", description, load_base)


def _sync_pad(model: Any, tokenizer: Any) -> None:
    config = model.config
    if getattr(config, "pad_token_id", None) is None:
        config.pad_token_id = tokenizer.pad_token_id
