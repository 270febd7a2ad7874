"""The files and folders a stage's config names, checked before anything loads (this module imports no torch).

Each key of ``molrl.records.run_inputs.INPUTS`` (and the pipeline's ``model`` and ``traces``) names what a run reads: a model
(a folder, a hub name ``org/name``, or ``tiny:...`` built in-process), an adapter folder, task and trace files.
``check_inputs`` refuses, in one line naming the key and the path, one that is not there: the CLI runs it as soon as the
config is read, before torch is imported, so a mistyped path costs a fraction of a second, not a model's loading time.
A name shaped like a hub name is left to the loader (``molrl.models.check_model_folder``), which looks in the local hub
cache; except eval's model, whose record of what it trained on is read from its files before it is scored: a name that
is neither a folder nor in the hub cache is refused at once (``model_folder``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from molrl.config import to_dict
from molrl.errors import ConfigError
from molrl.records.fingerprint import hub_snapshot
from molrl.records.run_inputs import flat_config, input_values

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
    model = getattr(getattr(cfg, "model", None), "path", None)
    if stage == "eval" and model and not str(model).startswith("tiny:") and (cfg.model.adapter or not cfg.predictions):
        model_folder(str(model))  # what it trained on is read from its files (molrl.records.provenance.check_scored)


def model_folder(name: str) -> Path | None:
    """Where the files of model ``name`` lie: the folder or file it names, or the snapshot of the hub cache a hub name
    loads (``molrl.records.fingerprint.hub_snapshot``, as its fingerprint is taken); None for a path that is not there (the
    input check or the loader names it). A hub-shaped name that is neither is refused in one line: what it trained on
    (its ``molrl_provenance.json``) could not be read."""
    path = Path(name).expanduser()
    if path.exists():
        return path
    snapshot = hub_snapshot(name)
    if snapshot is not None:
        return snapshot.folder
    if looks_like_path(name):
        return None
    if path.parent != Path(".") and path.parent.is_dir():  # models/m beside models/: a mistyped folder
        raise ConfigError(f"{name}: no such folder (the folder {path.parent}/ exists); check the path")
    from huggingface_hub import constants

    raise ConfigError(f"{name}: no such folder, and no model of that name in the hub cache ({constants.HF_HUB_CACHE}), "
                      "so what it was trained on (molrl_provenance.json) cannot be read; give the model's folder, or "
                      f"download it first (huggingface-cli download {name})")


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
