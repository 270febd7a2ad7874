"""Loading models and tokenizers: local HF directories, hub names, or in-process tiny models.

``tiny:chatml`` and ``tiny:llama3`` name the randomly initialised tiny pairs of ``molrl.tiny``
(for smoke runs and tests); anything else goes to ``from_pretrained``. An adapter directory
(PEFT) can be put on top, frozen or trainable.

Inputs are checked before anything is loaded from them, each failure one line naming the input and
the fix: a path that does not exist (or a name that is no folder while the hub is off or out of reach, at
once instead of a minute of retries), a model folder without tokenizer files (transformers would
build an empty one-token tokenizer from it), an adapter trained on another base (PEFT would print
a ``size mismatch`` line per tensor).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Iterator

import torch

from molrl.errors import MolrlError
from molrl.records.input_checks import looks_like_path

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}
TOKENIZER_FILES = ("tokenizer*", "vocab*", "*.model", "*.tiktoken", "spiece*", "sentencepiece*")
"""Name patterns of tokenizer files (tokenizer.json, tokenizer_config.json, vocab.json, tokenizer.model, ...): a
folder without any of them holds no tokenizer."""
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
"""Where PEFT saves an adapter's weights."""


def load_tokenizer(name_or_path: str) -> Any:
    """The tokenizer of a model (left padding, a pad token always set)."""
    if name_or_path.startswith("tiny:"):
        from molrl.tiny import build_tiny_tokenizer

        tok = build_tiny_tokenizer(_tiny_template(name_or_path))
    else:
        from transformers import AutoTokenizer

        check_tokenizer_folder(name_or_path)
        tok = _from_pretrained(AutoTokenizer, name_or_path)
        _check_vocabulary(tok, name_or_path)
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
    """A causal LM, optionally with a PEFT adapter on top (checked against it first), moved to ``device``."""
    torch_dtype = DTYPES.get(dtype)
    if torch_dtype is None:
        raise MolrlError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if adapter is not None and not (Path(adapter) / "adapter_config.json").is_file():
        raise MolrlError(f"{adapter}: not a PEFT adapter directory (no adapter_config.json)")
    if name_or_path.startswith("tiny:"):
        from molrl.tiny import build_tiny_pair

        model, _ = build_tiny_pair(_tiny_template(name_or_path), seed=seed)
        model = model.to(torch_dtype)
    else:
        from transformers import AutoModelForCausalLM

        check_whole_model(name_or_path)
        model = _from_pretrained(AutoModelForCausalLM, name_or_path, dtype=torch_dtype)
    if adapter is not None:
        from peft import PeftModel

        check_adapter(adapter, model, name_or_path)
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


def check_model_folder(name_or_path: str) -> None:
    """Refuse, at once and in one line, a model name that is no local folder and that the hub cannot serve.

    A path-looking name (``./m``, ``a/b/c``) or one whose first part is a local folder (``models/smolm2``
    beside ``models/``) is a mistyped path. Any other name not in the local hub cache needs the hub:
    when it is switched off (``HF_HUB_OFFLINE``) or cannot be reached, transformers would retry for a minute.
    """
    path = Path(name_or_path).expanduser()
    if name_or_path.startswith("tiny:") or path.exists():
        return
    if looks_like_path(name_or_path):
        raise MolrlError(f"model folder {name_or_path} not found; "
                         "check the path (a hub model is named like Qwen/Qwen3-8B)")
    if _in_hub_cache(name_or_path):
        return
    parent = path.parent
    if parent != Path(".") and parent.is_dir():
        raise MolrlError(f"model folder {name_or_path} not found (the folder {parent}/ exists{_close(path)}); "
                         "check the path")
    offline = _hub_unavailable()
    if offline is not None:
        raise MolrlError(f"model {name_or_path}: no such local folder, and {offline}; check the path, or "
                         "download the model where the hub can be reached and pass its folder")


def _close(path: Path) -> str:
    """``; did you mean X?`` for the nearest name beside a mistyped folder, else empty."""
    import difflib

    names = [p.name for p in path.parent.iterdir() if p.is_dir()]
    match = difflib.get_close_matches(path.name, names, n=1)
    return f"; did you mean {path.parent / match[0]}?" if match else ""


def _in_hub_cache(name: str) -> bool:
    """Whether the local hub cache holds a download of model ``name``."""
    from huggingface_hub import constants

    return (Path(constants.HF_HUB_CACHE) / f"models--{name.replace('/', '--')}").is_dir()


def _hub_unavailable() -> str | None:
    """Why the model hub cannot be asked for a model (switched off, or no connection in 3 s), or None."""
    import os
    import socket
    from urllib.parse import urlparse

    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(variable, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"the model hub is switched off ({variable}={os.environ[variable]})"
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as err:
        return f"the model hub ({host}) cannot be reached ({err.strerror or err})"
    return None


def check_tokenizer_folder(name_or_path: str) -> None:
    """Refuse a local model folder without tokenizer files, from which transformers would build an empty tokenizer."""
    check_model_folder(name_or_path)
    folder = Path(name_or_path).expanduser()
    if folder.is_dir() and not any(p.is_file() for pattern in TOKENIZER_FILES for p in folder.glob(pattern)):
        raise MolrlError(
            f"{name_or_path}: no tokenizer files in this folder (tokenizer.json, tokenizer_config.json or vocab "
            "files); copy them from the model it was trained from (tokenizer.save_pretrained(FOLDER) writes them)"
        )


def check_whole_model(name_or_path: str) -> None:
    """Refuse a local model folder whose weights are cut short (a copy or a write stopped part-way), before loading."""
    from molrl.records.rerun import whole_weights

    folder = Path(name_or_path).expanduser()
    if folder.is_dir() and (folder / "config.json").is_file() and not whole_weights(folder):
        raise MolrlError(f"{name_or_path}: its weights are missing or cut short (a copy, download or export was "
                         "stopped while writing them); write the folder again (molrl export writes it whole)")


def config_vocab_size(name_or_path: str) -> int | None:
    """The vocabulary size a model folder's config.json declares (its output rows), None where it has none."""
    config_file = Path(name_or_path).expanduser() / "config.json"
    if not config_file.is_file():
        return None
    try:
        config = json.loads(config_file.read_text())
    except ValueError:
        return None  # the model loader reports a broken config.json
    vocab_size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return vocab_size if isinstance(vocab_size, int) else None


def sampled_ids(tok: Any, name_or_path: str | None = None, config_vocab: int | None = None) -> int:
    """How many token ids an engine on this model may sample: its output rows (config.json's ``vocab_size``, or
    ``config_vocab``) where they outnumber the tokenizer's ids, as Qwen3's padded 151,936 rows do its 151,669."""
    rows = config_vocab if config_vocab is not None else config_vocab_size(name_or_path) if name_or_path else None
    return max(len(tok), rows or 0)


def _check_vocabulary(tok: Any, name_or_path: str) -> None:
    """Refuse a tokenizer holding under half of its model's vocabulary (a stray or broken tokenizer file)."""
    vocab_size = config_vocab_size(name_or_path)
    if isinstance(vocab_size, int) and len(tok) < vocab_size // 2:
        raise MolrlError(
            f"{name_or_path}: its tokenizer has {len(tok)} tokens but the model's vocabulary is {vocab_size}; "
            "the tokenizer files are missing or broken: copy them from the model it was trained from"
        )


def check_adapter(adapter: str | Path, model: Any, model_name: str) -> None:
    """Refuse an adapter whose saved weights do not fit ``model``, before PEFT loads it: one line naming the
    adapter, the base it records, the first size that differs and the fix."""
    adapter = Path(adapter)
    recorded = json.loads((adapter / "adapter_config.json").read_text()).get("base_model_name_or_path")
    mismatches = []
    for key, shape in adapter_shapes(adapter):
        sizes = _lora_sizes(model, key, shape)
        if sizes is not None and sizes[2] != sizes[3]:
            mismatches.append(sizes)
    if not mismatches:
        return
    module, side, have, want = mismatches[0]
    name = _size_name(model.config, want) or side
    more = f" ({len(mismatches)} adapter tensors differ)" if len(mismatches) > 1 else ""
    base = f"trained on {recorded}" if recorded else "(its base is not recorded)"
    fix = f"load it on {recorded}, the base it was trained on" if recorded else "load it on the base it was trained on"
    raise MolrlError(f"{adapter}: adapter {base} does not fit {model_name}: its {module} has {name} {have}, "
                     f"{model_name}'s has {want}{more}; {fix}")


def adapter_shapes(adapter: Path) -> Iterator[tuple[str, tuple[int, ...]]]:
    """``(key, shape)`` of every tensor an adapter directory saved, read without loading the weights."""
    path = next((adapter / name for name in ADAPTER_WEIGHTS if (adapter / name).is_file()), None)
    if path is None:
        return  # PEFT reports the missing weights file itself
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                yield key, tuple(f.get_slice(key).get_shape())
    else:
        for key, tensor in torch.load(path, map_location="cpu", weights_only=True, mmap=True).items():
            yield key, tuple(tensor.shape)


_LORA_SIDES = {  # adapter tensor -> (which dimension of the tensor, the module attribute it must equal, its name)
    "lora_A": (1, "in_features", "input size"),
    "lora_B": (0, "out_features", "output size"),
    "lora_embedding_A": (1, "num_embeddings", "vocabulary"),
    "lora_embedding_B": (0, "embedding_dim", "embedding size"),
}


def _lora_sizes(model: Any, key: str, shape: tuple[int, ...]) -> tuple[str, str, int, int] | None:
    """(module, side, the adapter's size, the model's size) of a LoRA tensor whose module ``model`` has; else None."""
    parts = key.removeprefix("base_model.model.").split(".")
    for i, part in enumerate(parts):
        if part in _LORA_SIDES and len(shape) == 2:
            module_name = ".".join(parts[:i])
            try:
                module = model.get_submodule(module_name)
            except AttributeError:
                return None  # PEFT reports modules the model lacks
            dim, attribute, side = _LORA_SIDES[part]
            want = getattr(module, attribute, None)
            return (module_name, side, shape[dim], want) if isinstance(want, int) else None
    return None


def _size_name(config: Any, size: int) -> str | None:
    """Which model dimension ``size`` is, read from its config (vocabulary, hidden size...), or None."""
    config = getattr(config, "text_config", None) or config
    for attribute, name in (("vocab_size", "vocabulary"), ("hidden_size", "hidden size"),
                            ("intermediate_size", "intermediate size")):
        if getattr(config, attribute, None) == size:
            return name
    return None


def _tiny_template(name: str) -> str:
    template = name.split(":", 1)[1]
    if template not in ("chatml", "llama3"):
        raise MolrlError(f"model {name!r}: tiny models are tiny:chatml or tiny:llama3")
    return template


def _from_pretrained(cls: Any, name_or_path: str, **kwargs: Any) -> Any:
    check_model_folder(name_or_path)
    if name_or_path.startswith("~"):
        name_or_path = str(Path(name_or_path).expanduser())
    try:
        return cls.from_pretrained(name_or_path, **kwargs)
    except OSError as err:
        hint = "" if Path(name_or_path).exists() else " (not a local directory; hub names need network access)"
        raise MolrlError(f"could not load {name_or_path!r}{hint}: {err}") from None
    except ValueError as err:  # e.g. a tokenizer folder without tokenizer.json (a copy stopped part-way)
        raise MolrlError(f"could not load {name_or_path!r}: {' '.join(str(err).split()).rstrip('.')}; its files are incomplete "
                         "or broken: write the folder again, or copy them from the model it was made from") from None
