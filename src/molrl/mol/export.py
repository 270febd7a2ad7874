"""Plain transformers directories: a trained LoRA adapter merged into its base, or a GGUF file dequantised."""

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


def convert_gguf(gguf: str | Path, out: str | Path, dtype: str = "float32") -> Path:
    """Dequantise the GGUF model file ``gguf`` and save model and tokenizer to ``out`` as a plain directory.

    transformers reads GGUF (with the ``gguf`` package) into ordinary tensors but keeps a GGUF
    quantizer on the model, and ``save_pretrained`` then refuses ("not serializable"); the weights are
    plain by then, so the quantizer and its config entry are dropped before saving.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(gguf).expanduser()
    if not gguf.is_file():
        raise MolrlError(f"{gguf}: GGUF file not found")
    try:
        import gguf as _gguf  # noqa: F401  (transformers' GGUF reader)
    except ImportError:
        raise MolrlError("reading GGUF needs the gguf package: pip install gguf") from None
    out = Path(out)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=getattr(torch, dtype))
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out
