"""What a run reads, by its fingerprints: the keys of each stage's config that name its inputs (``INPUTS``), their
contents' fingerprints saved in ``inputs.json`` beside the config, and which of them changed since
(``changed_inputs``). ``molrl.records.rerun`` refuses a re-run whose inputs changed; the pipeline checks its finished stages
the same way. This module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from molrl.config import ConfigError, to_dict
from molrl.config.renames import current_names
from molrl.records.fingerprint import model_fingerprint

INPUTS: dict[str, tuple[str, ...]] = {
    "mol": ("model.path", "data.traces"),
    "rl": ("model.path", "model.adapter", "data.path", "eval.data.path"),
    "collect": ("model.path", "model.adapter", "data.path"),
    "eval": ("model.path", "model.adapter", "data.*.path"),
}
"""Per stage, the keys naming what a run reads (files, folders; a list's every value; ``*``: each entry of a
mapping): compared as resolved paths, and by their contents' fingerprints. A run saved before a task file became its
block's ``path`` (eval's ``data.NAME``), or under a key renamed since (collect's ``tasks``), is compared under the
current label. eval's ``predictions`` are not here: each problem's graded
completions are compared with the file's, and an edited one is graded again (``PredictionSource.finished``)."""

def inputs_path(saved: Path) -> Path:
    """Where the fingerprints of a run's inputs are kept beside its saved config (``X.config.yaml`` ->
    ``X.inputs.json``, ``config.yaml`` -> ``inputs.json``)."""
    return saved.with_name(saved.name.removesuffix("config.yaml") + "inputs.json")


def input_fingerprints(stage: str | None, cfg: Any) -> dict[str, dict[str, str]]:
    """``{label: {"path": resolved path, "fingerprint": ...}}`` for each ``INPUTS`` value of ``cfg`` that is a file or
    folder on this machine, or a hub name in the local hub cache (its snapshot's files; ``path``: ``org/name@commit``);
    a ``tiny:...`` model or an uncached name has none."""
    found = {}
    for label, value in input_values(stage, flat_config(to_dict(cfg))):
        known = model_fingerprint(str(value))
        if known is not None:
            found[label] = known
    return found


@dataclass(frozen=True)
class ChangedInput:
    """An input (``INPUTS``) whose contents differ from what the saved run read under the same name."""

    label: str
    path: str

    def __str__(self) -> str:
        return f"{self.label} ({self.path}) has other contents"


def changed_inputs(stage: str | None, kept: Any, cfg: Any) -> list[ChangedInput]:
    """The inputs of ``cfg`` whose fingerprints differ from ``kept`` (``input_fingerprints`` of the saved run; none
    kept, by a run made before they were: nothing to compare)."""
    if not isinstance(kept, dict):
        return []
    now = input_fingerprints(stage, cfg)
    found = []
    for label in sorted(kept):
        current = label if label in now else current_label(type(cfg), label)
        if current in now and now[current]["fingerprint"] != (kept[label] or {}).get("fingerprint"):
            found.append(ChangedInput(current, now[current]["path"]))
    return found


def current_label(cls: type, label: str) -> str:
    """An input's label saved under an old key name, under its current one (collect's ``tasks`` -> ``data.path``,
    rl's ``policy.base`` -> ``model.path``, eval's ``data.mbpp`` -> ``data.mbpp.path``): read through the same renames
    and shorthands as a saved config; the label itself when they leave it as it is."""
    key, _, index = label.partition("[")
    nested: dict[str, Any] = {}
    node = nested
    *sections, name = key.split(".")
    for section in sections:
        node = node.setdefault(section, {})
    node[name] = "input"
    try:
        moved = [k for k, v in flat_config(current_names(cls, nested)).items() if v == "input"]
    except ConfigError:
        return label
    return moved[0] + (f"[{index}" if index else "") if len(moved) == 1 else label


def input_values(stage: str | None, flat: dict[str, Any]) -> list[tuple[str, Any]]:
    """(label, value) of every input value in a flattened config: ``data.traces[0]``, ``data.math500``, ``model``."""
    found = []
    for key, value in flat.items():
        if not is_input(stage, key) or value in (None, ""):
            continue
        if isinstance(value, list):
            found += [(f"{key}[{i}]", v) for i, v in enumerate(value) if v not in (None, "")]
        else:
            found.append((key, value))
    return found


def is_input(stage: str | None, key: str) -> bool:
    return any(key_under(key, k) for k in INPUTS.get(stage or "", ()))


def key_under(key: str, pattern: str) -> bool:
    """Whether a flattened ``key`` is ``pattern`` or inside it, a ``*`` in the pattern matching one name."""
    parts, wanted = key.split("."), pattern.split(".")
    return len(parts) >= len(wanted) and all(w in ("*", p) for w, p in zip(wanted, parts))


def flat_config(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists and other values are leaves."""
    if not isinstance(data, dict) or (prefix and not data):
        return {prefix.rstrip("."): data}
    flat: dict[str, Any] = {}
    for key, value in data.items():
        flat.update(flat_config(value, f"{prefix}{key}."))
    return flat


def model_fingerprints(stage: str, cfg: Any) -> dict[str, str]:
    """``{input key: fingerprint}`` of ``cfg``'s model inputs (``model.path``, ``model.adapter``) that have one: what
    each sample, trace or completion a stage makes records of the model that made it."""
    return {label: known["fingerprint"] for label, known in input_fingerprints(stage, cfg).items()
            if key_under(label, "model")}
