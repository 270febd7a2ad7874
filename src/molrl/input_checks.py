"""The files and folders a stage's config names, checked before anything loads (this module imports no torch).

Each key of ``molrl.run_inputs.INPUTS`` (and the pipeline's ``model`` and ``traces``) names what a run reads: a model
(a folder, a hub name ``org/name``, or ``tiny:...`` built in-process), an adapter folder, task and trace files.
``check_inputs`` refuses, in one line naming the key and the path, one that is not there: the CLI runs it as soon as the
config is read, before torch is imported, so a mistyped path costs a fraction of a second, not a model's loading time.
A name shaped like a hub name is left to the loader (``molrl.models.check_model_folder``), which looks in the local hub
cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from molrl.config import to_dict
from molrl.errors import ConfigError
from molrl.run_inputs import flat_config, input_values

PIPELINE_INPUTS = ("model", "traces", "general_traces")
"""The pipeline's own inputs (its stages' are set by it, from what earlier stages write)."""

MODEL_KEYS = ("model", "model.path")
"""The keys naming a model, which may also be a hub name or ``tiny:...``."""


def looks_like_path(name: str) -> bool:
    """Whether a model name can only be a folder: ``/x``, ``./x``, ``~/x``, ``a/b/c``, ``x/`` (not ``org/name``)."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or name.endswith("/") or "\\" in name


def check_inputs(stage: str, cfg: Any) -> None:
    """Refuse the first input of ``cfg`` (a ``stage`` config) that names a file or folder that is not there."""
    for label, value in _inputs(stage, flat_config(to_dict(cfg))):
        text = str(value)
        if label in MODEL_KEYS and (text.startswith("tiny:") or not looks_like_path(text)):
            continue  # tiny:..., or a hub name: the loader looks in the hub cache
        if text.startswith("hub:") or Path(text).expanduser().exists():
            continue
        what = "model folder" if label in MODEL_KEYS else "folder" if label.endswith("adapter") else "file"
        hint = " (a hub model is named like Qwen/Qwen3-8B)" if label in MODEL_KEYS else ""
        raise ConfigError(f"{label}={text}: no such {what}; check the path{hint}")


def _inputs(stage: str, flat: dict[str, Any]) -> list[tuple[str, Any]]:
    """(label, value) of each input ``stage`` reads, a list's values one by one."""
    if stage != "pipeline":
        return input_values(stage, flat)
    found: list[tuple[str, Any]] = []
    for key in PIPELINE_INPUTS:
        value = flat.get(key)
        values = value if isinstance(value, list) else [value]
        found += [(f"{key}[{i}]" if isinstance(value, list) else key, v) for i, v in enumerate(values)
                  if v not in (None, "")]
    return found
