"""Plain transformers directories: a trained LoRA adapter merged into its base, or a GGUF file dequantised; each
carries its provenance record inside (``molrl.records.provenance``: the adapter's and base's lineage, or the record beside the
GGUF file, one step added)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from molrl.engines.adapters import merged_model
from molrl.errors import MolrlError
from molrl.records.fingerprint import fingerprint
from molrl.records.provenance import Provenance, config_fingerprint, made, read_provenance, write_provenance
from molrl.records.writes import write_folder

log = logging.getLogger(__name__)


def merge_adapter(adapter: str | Path, out: str | Path, base: str | None = None, dtype: str = "float32") -> Path:
    """Load ``base`` (default: the adapter's recorded base) + ``adapter``, merge, save model and tokenizer to ``out``."""
    from molrl.models import load_tokenizer

    adapter, out = Path(adapter), Path(out)
    config_file = adapter / "adapter_config.json"
    if not config_file.is_file():
        raise MolrlError(f"{adapter}: not a PEFT adapter directory (no adapter_config.json)")
    base = base or json.loads(config_file.read_text()).get("base_model_name_or_path")
    if not base:
        raise MolrlError(f"{config_file}: no base_model_name_or_path recorded; pass --base MODEL")
    merged = merged_model(base, adapter, dtype)
    tokenizer = load_tokenizer(str(adapter) if (adapter / "tokenizer_config.json").is_file() else base)
    tokenizer.padding_side = "right"
    record = made("export", config_fingerprint({"adapter": fingerprint(adapter), "base": base, "dtype": dtype}), base,
                  [read_provenance(base), read_provenance(adapter)])  # what base and adapter were trained on
    with write_folder(out) as folder:  # whole, or not there at all: never weights without their tokenizer
        merged.save_pretrained(str(folder))
        tokenizer.save_pretrained(str(folder))
        write_provenance(folder, record)
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
    record = gguf_record(gguf, dtype)
    with write_folder(out) as folder:  # whole, or not there at all
        model.save_pretrained(str(folder))
        tokenizer.save_pretrained(str(folder))
        write_provenance(folder, record)
    return out


def gguf_record(gguf: Path, dtype: str) -> Provenance:
    """The record of a GGUF file's conversion: a ``gguf`` step whose config fingerprint holds the file's contents'
    fingerprint and the dtype, continuing the record of the folder the file lies in (llama.cpp's converter writes the
    GGUF file into the model folder it converts, where molrl's record already is), else with the file as its base
    (trained on nothing molrl knows)."""
    source = read_provenance(gguf.parent)
    if source is not None:
        log.info("%s: converted with the record of the folder it lies in (%s)", gguf, source.where)
    return made("gguf", config_fingerprint({"gguf": fingerprint(gguf), "dtype": dtype}), str(gguf), [source])
