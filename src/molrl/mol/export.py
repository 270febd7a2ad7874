"""Merging a trained LoRA adapter into its base model, saved as a plain transformers directory."""

from __future__ import annotations

import json
from pathlib import Path

from molrl.errors import MolrlError


def merge_adapter(adapter: str | Path, out: str | Path, base: str | None = None, dtype: str = "float32") -> Path:
    """Load ``base`` (default: the adapter's recorded base) + ``adapter``, merge, save model and tokenizer to ``out``."""
    from molrl.models import load_model, load_tokenizer

    adapter, out = Path(adapter), Path(out)
    config_file = adapter / "adapter_config.json"
    if not config_file.is_file():
        raise MolrlError(f"{adapter}: not a PEFT adapter directory (no adapter_config.json)")
    base = base or json.loads(config_file.read_text()).get("base_model_name_or_path")
    if not base:
        raise MolrlError(f"{config_file}: no base_model_name_or_path recorded; pass --base MODEL")
    model = load_model(base, dtype=dtype, adapter=adapter)
    merged = model.merge_and_unload()
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(str(out))
    tokenizer = load_tokenizer(str(adapter) if (adapter / "tokenizer_config.json").is_file() else base)
    tokenizer.padding_side = "right"
    tokenizer.save_pretrained(str(out))
    return out
