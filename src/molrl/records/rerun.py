"""One rule for running a stage again on its own output (``mol``, ``rl``, ``collect``, ``eval``).

Every stage saves its resolved config beside what it writes. Run again on the same output, a stage:

1. starts afresh when nothing was made under the saved config yet (no checkpoint, adapter, trace or sample): the
   saved config binds nothing;
2. refuses a config that differs from the saved one (``check_rerun``), naming each key with both values and the fix,
   another output directory;
3. extends the run when the only difference is a raised ``EXTENDABLE`` key (``max_steps``), and says so in the line
   that says where it resumes;
4. says the run is finished, in one line, and stops without training or rewriting anything, when nothing is left;
5. resumes otherwise.

A training stage (``mol``, ``rl``) keeps its checkpoints in ``checkpoints/checkpoint-N`` under its output, apart from
the results (``adapter/``, ``metrics.jsonl``); a MoL run made before, with ``checkpoint-N`` in the output itself,
resumes from there. A saved config is read under the current key names (``molrl.config.current_names``), so a run
saved before a key was renamed is the same run.

``HARMLESS`` lists, in this one place, the keys that may differ between a run and its re-run without changing what
the run computes (where it writes, logging, worker counts, resume switches), and ``GREEDY_ONLY`` those that may differ
only under greedy decoding (the engine, the device); a key that can change a grade (a sandbox limit, a float
tolerance) is never among them. A finished run re-run with only such differences changes no file.

Same run means same contents, not same names: the keys ``molrl.records.run_inputs.INPUTS`` lists (the model, the
data files, the adapter trained further or evaluated) are compared as resolved paths (``./models/x`` is
``models/x``), and their contents' fingerprints (``fingerprint``), saved in ``inputs.json`` beside the config, must
match: an input replaced under the same name is refused, naming it. "Finished" means a whole, loadable result
(``whole_weights``): a final ``adapter/`` or ``model/`` torn by a kill is rebuilt from the last checkpoint, or refused
in one line. This module imports no torch: the checks run before a stage loads anything.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from molrl.config import ConfigError, build_config, save_config, to_dict
from molrl.config.renames import current_names, unoptional
from molrl.errors import MolrlError
from molrl.records.run_inputs import (changed_inputs, flat_config, input_fingerprints, inputs_path, is_input,
                               key_under)
from molrl.records.writes import write_text

log = logging.getLogger(__name__)

HARMLESS: dict[str, tuple[str, ...]] = {
    "mol": ("output_dir", "train.report_to", "train.logging_steps", "train.save_steps", "train.save_total_limit",
            "train.resume", "threads", "loss.base_targets_dir", "loss.base_targets_check_steps"),
    "rl": ("output_dir", "train.report_to", "train.logging_steps", "train.save_steps", "train.save_total_limit",
           "train.resume", "sandbox.workers", "threads"),
    "collect": ("output_dir", "data.limit", "sampling.n", "progress", "sandbox.workers", "threads"),
    "eval": ("output_dir", "label", "benchmarks", "limit", "data.*.limit", "ks", "partial_predictions",
             "static_cache", "sandbox.workers", "threads"),
}
"""Per stage, the keys a re-run may change freely, each a single key (never a whole section, whose other keys could
change a result); ``*`` stands for each benchmark of eval's ``data``. A key is here only where it cannot change how a
sample, a grade or a weight is made, so the saved config still says what made everything in the run: the same
sampler and random stream, the same arithmetic (up to floating-point rounding, as between two runs of one config):

==========================  =====================================================================================
key                         why it cannot change what is produced
==========================  =====================================================================================
output_dir                  where a run writes, not what it computes
threads                     torch's CPU threads: the same numbers, sooner or later
train.report_to             which trackers receive the logged figures
train.logging_steps         how often figures are logged
train.save_steps            how often checkpoints are written (a resume continues the same curve)
train.save_total_limit      how many checkpoints are kept
train.resume                whether the saved run is looked at, not what is trained
sandbox.workers             how many sandbox processes run tests at once; a verdict does not depend on it (the
                            sandbox's limits and tolerances decide verdicts and are never here)
progress                    whether a progress bar is drawn
static_cache                how the KV cache is held while generating: the same tokens (tests/test_generation.py)
limit, data.*.limit,        how much is done, not how: what was made stays valid and the rest is made by the same
data.limit, samples,        model, engine and sampling. A finished run asked for less does nothing (its results
benchmarks                  stand); asked for more, it makes only the rest
ks                          which pass@k are summarised from the same samples; a finished run asked for others
                            summarises again, generating nothing
label                       the run's name in comparisons; a finished run keeps its saved one
partial_predictions         whether problems without predictions are an error; graded ones stay as graded
loss.base_targets_dir       where the base's cached targets are kept; a cache is keyed by all that made it
loss.base_targets_check_    how often a micro-batch also runs the live base to log the cache's error (a figure
steps                       logged, not a weight changed)
==========================  =====================================================================================

``GREEDY_ONLY`` lists the keys that are harmless only under greedy decoding."""

GREEDY_ONLY: dict[str, tuple[str, ...]] = {
    "rl": ("engine", "engine_gpu_memory_utilization"),
    "collect": ("engine", "device", "episode.batch_size"),
    "eval": ("engine", "device", "batch_size"),
}
"""Per stage, the keys harmless to a re-run only when ``sampling.temperature`` is 0 (greedy): each changes the random
stream a sample is drawn from, so at a temperature above 0 it changes every sample, and is refused like any other key
(rl samples at 0.01 or more: never greedy, always refused).

==============================  =================================================================================
key                             the random stream it changes at temperature > 0
==============================  =================================================================================
engine                          another sampler (vLLM's or torch's generator): other draws from the same seed
device                          torch draws from a per-device generator: CPU and CUDA streams differ
batch_size (eval),              which prompts share one generator call: eval seeds each chunk by its place, an
episode.batch_size (collect)    episode batch shares one stream
engine_gpu_memory_utilization   the KV cache's size decides how many sequences vLLM schedules together, and on a
                                CPU vLLM seeds the engine, not the request
==============================  =================================================================================

At temperature 0 they change only the arithmetic: vLLM and transformers give equal greedy outputs in the tests
(tests/test_generation.py), though neither promises bit-for-bit the same logits, so a tie in the last place can
still go the other way; a greedy run is taken to be the same run, as two runs of one config on a GPU are."""

EXTENDABLE: dict[str, tuple[str, ...]] = {"mol": ("train.max_steps",), "rl": ("train.max_steps",)}
"""Per stage, the keys a re-run may raise to train a run further (never lower: that is another run)."""

NEW_RUN = {"mol": "output_dir=DIR", "rl": "output_dir=DIR",
           **dict.fromkeys(("collect", "eval"), "output_dir=DIR, or --out DIR for short")}
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
    _check_inputs(stage, cfg, saved, run)
    return extended


def changed_keys(stage: str | None, saved: Any, cfg: Any) -> list[Change]:
    """The keys whose value differs between a run's ``saved`` config (plain data, read under the current key names)
    and ``cfg``, leaving out the ones ``HARMLESS`` lists for ``stage`` (None: none left out). A key the saved config
    does not have (one added since) is the same when ``cfg`` holds its default: the run was made with that
    behaviour."""
    current = current_names(type(cfg), saved)
    new = flat_config(to_dict(cfg))
    built = read_as_current(type(cfg), current)
    if built is not None:  # every default and resolved value (a task file's format) as the current code has them
        old = flat_config(to_dict(built))
    else:
        old = flat_config(current)
        for key, value in flat_config(defaults(type(cfg))).items():
            if key not in old and new.get(key, _UNSET) == value:
                old[key] = value
    return [Change(k, old.get(k, _UNSET), new.get(k, _UNSET)) for k in sorted(set(old) | set(new))
            if not _same(stage, k, old.get(k, _UNSET), new.get(k, _UNSET)) and not _harmless(stage, k, cfg)]


def read_as_current(cls: type, saved: Any) -> Any:
    """A saved config (plain data under the current key names) built as the current ``cls`` builds it: keys added
    since take their defaults and values a config resolves (``TaskSource.resolved``) are resolved; None when it no
    longer builds (a value now out of range), and then the saved keys are compared as they are."""
    if not isinstance(saved, dict) or not dataclasses.is_dataclass(cls):
        return None
    try:
        return build_config(cls, saved, "saved config")
    except (ConfigError, MolrlError, TypeError, ValueError):
        return None


def save_run_config(stage: str, cfg: Any, saved: Path) -> None:
    """Write ``cfg`` (resolved) to ``saved`` and the fingerprints of its ``INPUTS`` to ``inputs.json`` beside it,
    each atomically."""
    save_config(cfg, saved)
    write_text(inputs_path(saved), json.dumps(input_fingerprints(stage, cfg), indent=1) + "\n")


def _check_inputs(stage: str, cfg: Any, saved: Path, run: Path) -> None:
    """Refuse a re-run whose inputs have other contents than the saved run's (checked after the keys, so an input
    given under another name is refused as that key's change)."""
    try:
        kept = json.loads(inputs_path(saved).read_text())
    except (OSError, ValueError):
        return
    changed = changed_inputs(stage, kept, cfg)
    if changed:
        raise ConfigError(f"{saved}: {run} was made from other contents under the same name: "
                          f"{'; '.join(map(str, changed))} now; start a new run elsewhere ({NEW_RUN[stage]}), or put "
                          "the original back to resume this one")


def defaults(cls: type) -> dict[str, Any]:
    """The default value of every key of the config class ``cls`` that has one, as plain data (sections nested;
    none for a class that is not a dataclass)."""
    out: dict[str, Any] = {}
    if not dataclasses.is_dataclass(cls):
        return out
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = unoptional(hints[f.name])
        if f.default is not dataclasses.MISSING:
            out[f.name] = to_dict(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = to_dict(f.default_factory())
        elif dataclasses.is_dataclass(tp):
            out[f.name] = defaults(tp)
    return out


def _same(stage: str | None, key: str, old: Any, new: Any) -> bool:
    """Whether a key's saved and current values are the same: input paths compared resolved."""
    if old == new:
        return True
    if not is_input(stage, key) or _UNSET in (old, new):
        return False
    return _resolved(old) == _resolved(new)


def _resolved(value: Any) -> Any:
    if isinstance(value, list):
        return [_resolved(v) for v in value]
    if isinstance(value, str) and value:
        return str(Path(value).expanduser().resolve())
    return value


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
    fresh (module docstring); ``train.resume=never`` starts over in the same directory without looking at it."""
    if cfg.train.resume == "never":
        return TrainingRerun()
    checkpoints = out / CHECKPOINTS
    checkpoint = last_whole_checkpoint(checkpoints, out)
    done = whole_weights(final)
    extended = check_rerun(stage, cfg, out / "config.yaml", started=checkpoint is not None or done)
    _records_in_checkpoints(out, (checkpoints, out))
    if final.exists() and not done:
        if checkpoint is None:
            raise ConfigError(f"{final}: incomplete (the run was killed while writing it) and no checkpoint is left "
                              f"to rebuild it from; delete {out} to train it again, or start a new run with "
                              f"{NEW_RUN[stage]}")
        log.warning("%s: incomplete (the run was killed while writing it); rebuilding it from %s", final, checkpoint)
    if checkpoint is None:
        if done and extended:
            raise ConfigError(f"{out}: no checkpoint left to extend the run from (checkpoint-N under {checkpoints}); "
                              f"start a new run with {NEW_RUN[stage]}")
        if done:
            say_finished(out, f"{final} written, its checkpoints removed", stage)
        elif (out / "config.yaml").exists():  # an earlier run started here and was stopped before its first checkpoint
            say(f"{out}: no checkpoint to resume from (none saved under {checkpoints}); starting over from step 0")
        return TrainingRerun(finished=done)
    step, last = checkpoint_progress(checkpoint, max_steps)
    if step >= last and done:
        say_finished(out, f"step {step} of {last}, {final}", stage)
        return TrainingRerun(checkpoint, step, at_last_step=True, finished=True)
    if step >= last:
        say(f"{out}: {checkpoint} holds the last step ({step} of {last}); writing {final} from it, training nothing")
    else:
        extending = "".join(f"extending the run ({c.key} {c.saved} -> {c.now}), " for c in extended)
        say(f"{out}: {extending}resuming from {checkpoint} (step {step} of {last})")
    return TrainingRerun(checkpoint, step, at_last_step=step >= last)


def _records_in_checkpoints(out: Path, folders: tuple[Path, ...]) -> None:
    """Give each whole checkpoint in ``folders`` that lacks one the run's provenance record (``out``'s): the trainer
    writes it into a checkpoint after the state file that makes the checkpoint whole, so a kill between the two leaves
    weights that would read as trained on nothing. The re-run rule found the config unchanged: the record is theirs."""
    from molrl.records.provenance import PROVENANCE

    record = out / PROVENANCE
    if os.environ.get("RANK", "0") != "0" or not record.is_file():
        return
    for folder in folders:
        for checkpoint in sorted(folder.glob("checkpoint-*")) if folder.is_dir() else []:
            if (checkpoint / "trainer_state.json").is_file() and not (checkpoint / PROVENANCE).exists():
                write_text(checkpoint / PROVENANCE, record.read_text())
                say(f"{checkpoint}: its provenance record was not written (killed while it was saved); the run's "
                    f"{record} copied into it")


def whole_weights(folder: Path) -> bool:
    """Whether ``folder`` (a run's final ``adapter/`` or ``model/``) holds a whole, loadable result: its config JSON
    reads back, and it has weights, each safetensors file as long as its header says."""
    folder = Path(folder)
    config = folder / "adapter_config.json" if (folder / "adapter_config.json").exists() else folder / "config.json"
    weights = [*folder.glob("*.safetensors"), *folder.glob("*.bin")]
    try:
        json.loads(config.read_text())
        return bool(weights) and all(_whole_safetensors(w) if w.suffix == ".safetensors" else w.stat().st_size > 0
                                     for w in weights)
    except (OSError, ValueError):
        return False


def _whole_safetensors(file: Path) -> bool:
    """A safetensors file's 8-byte header length, JSON header, and data up to the last tensor's end are all there."""
    with file.open("rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(size))
    end = max((t["data_offsets"][1] for name, t in header.items() if name != "__metadata__"), default=0)
    return file.stat().st_size >= 8 + size + end


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


def _harmless(stage: str | None, key: str, cfg: Any) -> bool:
    """Whether ``key`` may differ in a re-run of ``stage`` with ``cfg``: ``HARMLESS`` lists it, or ``GREEDY_ONLY``
    does and ``cfg`` samples greedily (a stage without sampling has no such key)."""
    greedy = getattr(getattr(cfg, "sampling", None), "temperature", None) == 0
    keys = (*HARMLESS.get(stage or "", ()), *(GREEDY_ONLY.get(stage or "", ()) if greedy else ()))
    return any(key_under(key, h) for h in keys)
