"""Loading models and tokenizers: local HF directories, hub names, or in-process tiny models.

``tiny:chatml`` and ``tiny:llama3`` name the randomly initialised tiny pairs of ``molrl.tiny``
(for smoke runs and tests); anything else goes to ``from_pretrained``. An adapter directory
(PEFT) can be put on top, frozen or trainable.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from molrl.errors import MolrlError

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def load_tokenizer(name_or_path: str) -> Any:
    """The tokenizer of a model (left padding, a pad token always set)."""
    if name_or_path.startswith("tiny:"):
        from molrl.tiny import build_tiny_tokenizer

        tok = build_tiny_tokenizer(_tiny_template(name_or_path))
    else:
        from transformers import AutoTokenizer

        tok = _from_pretrained(AutoTokenizer, name_or_path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_model(
    name_or_path: str,
    *,
    dtype: str = "float32",
    device: str | None = None,
    adapter: str | Path | None = None,
    adapter_trainable: bool = False,
    seed: int = 0,
) -> Any:
    """A causal LM, optionally with a PEFT adapter on top, moved to ``device``."""
    torch_dtype = DTYPES.get(dtype)
    if torch_dtype is None:
        raise MolrlError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if name_or_path.startswith("tiny:"):
        from molrl.tiny import build_tiny_pair

        model, _ = build_tiny_pair(_tiny_template(name_or_path), seed=seed)
        model = model.to(torch_dtype)
    else:
        from transformers import AutoModelForCausalLM

        model = _from_pretrained(AutoModelForCausalLM, name_or_path, dtype=torch_dtype)
    if adapter is not None:
        from peft import PeftModel

        if not (Path(adapter) / "adapter_config.json").is_file():
            raise MolrlError(f"{adapter}: not a PEFT adapter directory (no adapter_config.json)")
        model = PeftModel.from_pretrained(model, str(adapter), is_trainable=adapter_trainable)
    if device:
        model = model.to(device)
    return model


def load_model_and_tokenizer(name_or_path: str, **kwargs: Any) -> tuple[Any, Any]:
    """``load_model`` and ``load_tokenizer`` together, with pad/eos ids agreeing."""
    tok = load_tokenizer(name_or_path)
    model = load_model(name_or_path, **kwargs)
    base_config = model.config
    if base_config.pad_token_id is None:
        base_config.pad_token_id = tok.pad_token_id
    return model, tok


def default_device() -> str:
    """``cuda`` when a GPU is visible, else ``cpu``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def _tiny_template(name: str) -> str:
    template = name.split(":", 1)[1]
    if template not in ("chatml", "llama3"):
        raise MolrlError(f"model {name!r}: tiny models are tiny:chatml or tiny:llama3")
    return template


def _from_pretrained(cls: Any, name_or_path: str, **kwargs: Any) -> Any:
    try:
        return cls.from_pretrained(name_or_path, **kwargs)
    except OSError as err:
        hint = "" if Path(name_or_path).exists() else " (not a local directory; hub names need network access)"
        raise MolrlError(f"could not load {name_or_path!r}{hint}: {err}") from None
