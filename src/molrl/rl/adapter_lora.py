"""The MoL adapter an RL run trains further (``model.adapter_mode=continue``) decides its LoRA shape.

Such a run trains the adapter as it was saved, so ``lora.rank``, ``lora.alpha`` and ``lora.target_modules`` are the
adapter's: ``take_adapter_lora`` writes them into the config (so ``config.yaml`` records what is trained) when the
user left them at their defaults, and refuses, in one line, a value the user set that disagrees. ``lora.dropout`` is
a training switch here: 0 (the default) turns dropout off while training, as TRL does; another value must be the
adapter's own, which is the dropout it trains with. Reads JSON only: it runs before torch loads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from molrl.errors import ConfigError, MolrlError
from molrl.rl.config import RlConfig, rl_lora

_SAVED_AS = {"rank": "r", "alpha": "lora_alpha", "target_modules": "target_modules", "dropout": "lora_dropout"}


def resolve_adapter_dir(path: Path) -> Path:
    """The PEFT adapter directory inside ``path`` (itself, or the MoL output's adapter/)."""
    for candidate in (Path(path), Path(path) / "adapter"):
        if (candidate / "adapter_config.json").is_file():
            return candidate
    hint = ""
    if (Path(path) / "model").is_dir():
        hint = f"; a full fine-tuned MoL model is a base: set model.path={Path(path) / 'model'} instead"
    raise MolrlError(f"{path}: no PEFT adapter here (no adapter_config.json in it or in adapter/){hint}")


def take_adapter_lora(cfg: RlConfig) -> None:
    """Set ``cfg.lora`` to the continued adapter's shape, or refuse a ``lora.*`` value that disagrees with it."""
    if cfg.model.adapter is None or cfg.model.adapter_mode != "continue":
        return
    adapter = resolve_adapter_dir(cfg.model.adapter)
    try:
        saved = json.loads((adapter / "adapter_config.json").read_text())
    except ValueError as err:
        raise MolrlError(f"{adapter / 'adapter_config.json'}: not valid JSON ({err}); write the MoL adapter "
                         "again") from None
    default = rl_lora()
    for key, name in _SAVED_AS.items():
        if saved.get(name) is None:
            continue
        theirs, ours = _plain(key, saved[name]), _plain(key, getattr(cfg.lora, key))
        if ours == theirs or (key == "dropout" and ours == 0):
            continue
        if ours != _plain(key, getattr(default, key)):
            raise ConfigError(f"lora.{key}={getattr(cfg.lora, key)!r}: model.adapter_mode=continue trains the MoL "
                              f"adapter {adapter} further, whose {key} is {theirs!r}; leave lora.{key} unset (or set "
                              f"{theirs!r}), or use model.adapter_mode=merge_new to train a new LoRA of this shape")
        setattr(cfg.lora, key, theirs)


def _plain(key: str, value: Any) -> Any:
    """A value in one form for comparing: target modules as a sorted list (PEFT saves them as a set)."""
    if key == "target_modules":
        return sorted([value] if isinstance(value, str) else value)
    return value
