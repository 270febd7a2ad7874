"""One rule for running a stage again on its own output (``mol``, ``rl``, ``collect``, ``eval``).

Every stage saves its resolved config beside what it writes. Run again on the same output, a stage:

1. starts afresh when nothing was made under the saved config yet (no checkpoint, adapter, trace or
   sample): the saved config binds nothing;
2. refuses a config that differs from the saved one (``check_rerun``), naming each key with both
   values and the fix, another output directory;
3. extends the run when the only difference is a raised ``EXTENDABLE`` key (``max_steps``), and says so
   in the line that says where it resumes;
4. says the run is finished, in one line, and stops without training or rewriting anything, when
   there is nothing left to do;
5. resumes otherwise.

A training stage (``mol``, ``rl``) keeps its checkpoints in ``checkpoints/checkpoint-N`` under its output, apart
from the results (``adapter/``, ``metrics.jsonl``); a MoL run made before, with ``checkpoint-N`` in the output
itself, resumes from there. A saved config is read under the current key names (``molrl.config.current_names``),
so a run saved before a key was renamed is the same run.

``HARMLESS`` lists, in this one place, the keys that may differ between a run and its re-run
without changing what the run computes (where it writes, logging, worker counts, resume switches).

This module imports no torch: the checks run before a stage loads anything.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from molrl.config import ConfigError, to_dict
from molrl.config_renames import current_names

log = logging.getLogger(__name__)

HARMLESS: dict[str, tuple[str, ...]] = {
    "mol": ("output_dir", "train.report_to", "train.logging_steps", "train.save_steps", "train.save_total_limit",
            "train.resume", "threads"),
    "rl": ("output_dir", "train.report_to", "train.logging_steps", "train.save_steps", "reward.sandbox_workers",
           "threads"),
    "collect": ("out", "limit", "samples", "engine", "device", "progress", "sandbox", "episode.batch_size", "threads"),
    "eval": ("output_dir", "label", "benchmarks", "limit", "ks", "batch_size", "partial_predictions", "device",
             "engine", "sandbox", "threads"),
}
"""Per stage, the keys a re-run may change freely (a section's name covers every key in it). collect's
``limit`` and ``samples`` and eval's ``benchmarks`` and ``limit`` only add or leave out work; what was
already made stays valid."""

EXTENDABLE: dict[str, tuple[str, ...]] = {"mol": ("train.max_steps",), "rl": ("train.max_steps",)}
"""Per stage, the keys a re-run may raise to train a run further (never lower: that is another run)."""

NEW_RUN = {"mol": "output_dir=DIR", "rl": "output_dir=DIR", "collect": "--out FILE", "eval": "--out DIR"}
"""How a user of each stage starts a new run instead."""


@dataclass(frozen=True)
class Change:
    """One config key whose value differs between the saved run and this one."""

    key: str
    saved: Any
    now: Any

    def __str__(self) -> str:
        return f"{self.key} was {_show(self.saved)}, now {_show(self.now)}"


def check_rerun(stage: str, cfg: Any, saved: Path, *, started: bool, run: Path | None = None) -> list[Change]:
    """Refuse to run ``stage`` with ``cfg`` over the run (``run``: its output, by default ``saved``'s folder) whose
    config is saved at ``saved``, if they differ in a key that matters; returns the ``EXTENDABLE`` keys raised. A
    run that made nothing yet (``started`` false) binds nothing. The refusal is one ``ConfigError`` line naming
    every differing key with both values."""
    run = run if run is not None else saved.parent
    if not started or not saved.is_file():
        return []
    try:
        changes = changed_keys(stage, yaml.safe_load(saved.read_text()) or {}, cfg)
    except yaml.YAMLError as err:
        raise ConfigError(f"{saved}: not valid YAML ({err}); restore it, or use another output for a new run") from None
    extended = [c for c in changes if c.key in EXTENDABLE.get(stage, ()) and _raises(c.saved, c.now)]
    refused = [c for c in changes if c not in extended]
    if refused:
        hints = [f"{c} (only raising it extends the run)" if c.key in EXTENDABLE.get(stage, ()) else str(c)
                 for c in refused]
        raise ConfigError(f"{saved}: {run} was made with other settings: {'; '.join(hints)}; start a new run "
                          f"elsewhere ({NEW_RUN[stage]}), or re-run with the saved values to resume this one")
    return extended


def changed_keys(stage: str | None, saved: Any, cfg: Any) -> list[Change]:
    """The keys whose value differs between a run's ``saved`` config (plain data, read under the current key names)
    and ``cfg``, leaving out the ones ``HARMLESS`` lists for ``stage`` (None: none left out)."""
    old = _flat(current_names(type(cfg), saved))
    new = _flat(to_dict(cfg))
    return [Change(k, old.get(k, _UNSET), new.get(k, _UNSET)) for k in sorted(set(old) | set(new))
            if old.get(k, _UNSET) != new.get(k, _UNSET) and not _harmless(stage, k)]


def say_finished(out: Path, detail: str, stage: str) -> None:
    """The one line a finished run answers a re-run with."""
    further = f"raise {EXTENDABLE[stage][0]} to train further, or " if stage in EXTENDABLE else ""
    say(f"{out}: finished ({detail}); nothing to do ({further}start a new run with {NEW_RUN[stage]})")


def say(line: str) -> None:
    """Log ``line`` once: on the main process of a multi-process launch (every rank takes the same decision)."""
    if os.environ.get("RANK", "0") == "0":
        log.info("%s", line)


@dataclass(frozen=True)
class TrainingRerun:
    """What a training stage (``mol``, ``rl``) does in its output directory this time."""

    checkpoint: str | None = None
    """The checkpoint training continues from (None: from the start)."""
    step: int = 0
    """That checkpoint's step (0 from the start)."""
    at_last_step: bool = False
    """The checkpoint is at the run's last step: load its weights, train nothing (killed before its final save)."""
    finished: bool = False
    """The run is done: nothing is trained, loaded or written."""


CHECKPOINTS = "checkpoints"
"""The folder of a training run's ``checkpoint-N`` folders, under its output (both stages)."""


def training_rerun(stage: str, cfg: Any, out: Path, final: Path, max_steps: int) -> TrainingRerun:
    """The rule for a training stage whose config is saved in ``out``, checkpoints in ``out/checkpoints`` (or, for a
    MoL run made before, ``out`` itself) and final weights in ``final``: refused, finished, extended, resumed or
    fresh (module docstring)."""
    checkpoints = out / CHECKPOINTS
    checkpoint = last_whole_checkpoint(checkpoints, out)
    extended = check_rerun(stage, cfg, out / "config.yaml", started=checkpoint is not None or final.exists())
    if checkpoint is None:
        if final.exists() and extended:
            raise ConfigError(f"{out}: no checkpoint left to extend the run from (checkpoint-N under {checkpoints}); "
                              f"start a new run with {NEW_RUN[stage]}")
        if final.exists():
            say_finished(out, f"{final} written, its checkpoints removed", stage)
        return TrainingRerun(finished=final.exists())
    step, last = checkpoint_progress(checkpoint, max_steps)
    if step >= last and final.exists():
        say_finished(out, f"step {step} of {last}, {final}", stage)
        return TrainingRerun(checkpoint, step, at_last_step=True, finished=True)
    if step >= last:
        say(f"{out}: {checkpoint} holds the last step ({step} of {last}); writing {final} from it, training nothing")
    else:
        extending = "".join(f"extending the run ({c.key} {c.saved} -> {c.now}), " for c in extended)
        say(f"{out}: {extending}resuming from {checkpoint} (step {step} of {last})")
    return TrainingRerun(checkpoint, step, at_last_step=step >= last)


def last_whole_checkpoint(*folders: Path) -> str | None:
    """The newest ``checkpoint-N`` in ``folders`` whose trainer state (written last) reads back; a checkpoint torn
    by a kill while it was being written is passed over."""
    found = sorted((int(p.name.split("-")[1]), p) for folder in folders if folder.is_dir()
                   for p in folder.glob("checkpoint-*") if p.is_dir() and p.name.split("-")[1].isdigit())
    for _, path in reversed(found):
        try:
            json.loads((path / "trainer_state.json").read_text())
        except (OSError, ValueError):
            log.warning("%s: incomplete (killed while it was written?); resuming from an earlier one", path)
            continue
        return str(path)
    return None


def checkpoint_progress(checkpoint: str | Path, max_steps: int) -> tuple[int, int]:
    """(the checkpoint's step, the run's last step): ``max_steps``, or when that is not positive (MoL by epochs)
    the total the trainer computed and saved in the checkpoint."""
    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    return int(state["global_step"]), max_steps if max_steps > 0 else int(state["max_steps"])


_UNSET = object()


def _show(value: Any) -> str:
    return "not set" if value is _UNSET else repr(value)


def _raises(saved: Any, now: Any) -> bool:
    """A length raised from one positive integer to a larger one (mol's -1, "by epochs", is no length)."""
    return all(isinstance(v, int) and not isinstance(v, bool) for v in (saved, now)) and 0 < saved < now


def _harmless(stage: str | None, key: str) -> bool:
    return any(key == h or key.startswith(h + ".") for h in HARMLESS.get(stage or "", ()))


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists and other values are leaves."""
    if not isinstance(data, dict) or (prefix and not data):
        return {prefix.rstrip("."): data}
    flat: dict[str, Any] = {}
    for key, value in data.items():
        flat.update(_flat(value, f"{prefix}{key}."))
    return flat
