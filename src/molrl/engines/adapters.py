"""What a LoRA adapter is to the engines: its shape, whether vLLM serves it, and its base with it merged in.

Below both generation (an engine serves an adapter, or a merged copy of the model) and export (``molrl export
--merge`` writes the merged model): each reads the adapter here and neither calls the other. Nothing here imports
torch at module level, so a command (``molrl serve``) reads the ranks vLLM takes without loading it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from molrl.errors import MolrlError

VLLM_LORA_MODULES = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
"""Adapted modules vLLM serves as a LoRA adapter; an adapter on others (the head, the embeddings) is merged into a
copy of the model instead."""
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM accepts."""


def vllm_serves_lora(rank: int, modules: Any) -> bool:
    """Whether vLLM can serve a LoRA adapter of this rank on these modules (else it is merged into a copy)."""
    return frozenset(modules) <= VLLM_LORA_MODULES and rank <= VLLM_LORA_RANKS[-1]


def check_policy_lora(engine: str, rank: int, modules: Any) -> None:
    """Refuse, in one line with the fix, a trained adapter the RL engine ``engine`` cannot serve as vLLM LoRA."""
    if not vllm_serves_lora(rank, modules):
        raise MolrlError(f"engine={engine} serves the trained adapter as vLLM LoRA, which takes ranks up to "
                         f"{VLLM_LORA_RANKS[-1]} on {', '.join(sorted(VLLM_LORA_MODULES))}; this one has rank {rank} "
                         f"on {', '.join(sorted(modules))}: set lora.target_modules to those modules, or "
                         "engine=transformers")


def merged_model(base: str, adapter: str | Path, dtype: str = "float32") -> Any:
    """``base`` with the LoRA ``adapter`` merged into its weights, computing what base + adapter computes.

    An adapter on the head (or the embeddings) of a model whose head and embeddings share one matrix unties them
    first: merged into the shared matrix, the head's update would reach the embeddings too and change every
    input."""
    import torch
    from peft import PeftModel

    from molrl.models import check_adapter, load_model

    model = load_model(base, dtype=dtype)
    check_adapter(adapter, model, base)
    tied = getattr(model.config, "tie_word_embeddings", False)
    if tied and adapter_shape(adapter)[1] & {"lm_head", "embed_tokens"}:
        head = model.get_output_embeddings()
        head.weight = torch.nn.Parameter(head.weight.detach().clone())
        model.config.tie_word_embeddings = False
    return PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()


def adapter_shape(adapter: str | Path) -> tuple[int, frozenset[str]]:
    """(rank, adapted module names: ``target_modules`` and ``modules_to_save``) of a PEFT LoRA adapter directory."""
    config = json.loads((Path(adapter) / "adapter_config.json").read_text())
    targets = config.get("target_modules") or []
    saved = frozenset(config.get("modules_to_save") or [])
    modules = frozenset([targets] if isinstance(targets, str) else targets) | saved
    return int(config["r"]), modules


def merge_adapter_copy(model_path: str, adapter: str, out: str) -> None:
    """Save ``model_path`` with ``adapter`` merged into it (``merged_model``), and its tokenizer, to ``out``."""
    from molrl.models import load_tokenizer

    merged_model(model_path, adapter).save_pretrained(out)
    load_tokenizer(model_path).save_pretrained(out)
