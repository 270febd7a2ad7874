"""Generating with a LoRA adapter merged into its base weights, the base restored bit for bit afterwards.

An unmerged adapter adds, to every adapted linear layer of every decoding step, two small matmuls, a scale and
an add: on a GPU, where one decoding step of a small model is bound by launching kernels rather than by
arithmetic, that is most of the step. Merged, the step is the base model's. PEFT's own ``unmerge`` subtracts the
update again, which in bfloat16 does not give the base back: repeated every RL step, the frozen base would drift.
``merged_lora`` keeps a copy of each adapted weight instead and copies it back, so the base after the context is
the base before it, exactly; the price is one copy of the adapted weights while generating (on the weights'
device).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch


def lora_layers(model: Any) -> list[Any]:
    """The model's LoRA layers whose active adapters would take part in a forward (not disabled, not merged)."""
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer) and not m.disable_adapters and not m.merged
            and any(name in m.lora_A or name in m.lora_embedding_A for name in m.active_adapters)]


@contextmanager
def merged_lora(model: Any) -> Iterator[Any]:
    """Inside: the model's active LoRA adapters merged into their base layers. After: the base weights (and
    biases) exactly as before, the adapters unmerged. A model without LoRA layers passes through unchanged."""
    layers = lora_layers(model)
    saved: list[tuple[Any, dict[str, torch.Tensor]]] = []
    try:
        with torch.no_grad():
            for layer in layers:
                base = layer.get_base_layer()
                params = {name: p.detach().clone() for name, p in base.named_parameters(recurse=False)}
                saved.append((layer, params))
                layer.merge()
        yield model
    finally:
        with torch.no_grad():
            for layer, params in saved:
                base = layer.get_base_layer()
                for name, value in params.items():
                    getattr(base, name).copy_(value)
                layer.merged_adapters.clear()
