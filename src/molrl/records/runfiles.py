"""The files a training run keeps beside its weights: the metrics log and the checkpoints, and how a
resumed run (MoL or RL) trims what was logged after its checkpoint and loads a finished one (which
checkpoint to resume from, and whether to, is ``molrl.records.rerun``'s rule)."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from molrl.records.jsonl import read_records, repair_torn_tail, write_jsonl
from molrl.records.rerun import last_whole_checkpoint  # noqa: F401  (where it lived; kept importable from here)
from molrl.records.writes import append_text

log = logging.getLogger(__name__)


def _jsonable(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


class MetricsFileCallback(TrainerCallback):
    """Appends every training log line as one JSON object to ``metrics.jsonl`` (NaN written as null)."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            repair_torn_tail(self.path)  # else the first new line would be glued to a killed run's last one

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        record = {"step": state.global_step, "epoch": state.epoch, **{k: _jsonable(v) for k, v in logs.items()}}
        append_text(self.path, json.dumps(record) + "\n")


class ProvenanceCallback(TrainerCallback):
    """Writes the run's provenance record (``molrl.records.provenance``) into every checkpoint as it is saved, so a checkpoint
    evaluated or copied on its own carries what it was trained on."""

    def __init__(self, record: Any):
        self.record = record

    def on_save(self, args, state, control, **kwargs):
        from molrl.records.provenance import write_provenance
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if state.is_world_process_zero and folder.is_dir():
            write_provenance(folder, self.record)


class ResumedSchedule(TrainerCallback):
    """Sets a resumed run's learning rate to what its schedule gives at the resumed step.

    A checkpoint's optimiser state holds the rate of its own last step. transformers rebuilds the scheduler for the
    run's ``max_steps`` and gives it the checkpoint's step count, but leaves the optimiser at the saved rate, so a
    run extended past its end (``max_steps`` raised) trained its first added step at the old schedule's last rate
    (0.0 at the end of a cosine). With every group's rate set from the rebuilt schedule, an extended run's rates are,
    step for step, those of a run trained to the new ``max_steps`` from step 0; a plain resume is unchanged.
    """

    def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        scheduler = getattr(lr_scheduler, "scheduler", lr_scheduler)  # accelerate wraps it
        lambdas = getattr(scheduler, "lr_lambdas", None)
        if state.global_step == 0 or optimizer is None or lambdas is None:
            return
        rates = [base * rule(scheduler.last_epoch) for base, rule in zip(scheduler.base_lrs, lambdas)]
        for group, rate in zip(optimizer.param_groups, rates):
            group["lr"] = rate
        scheduler._last_lr = rates


def load_checkpoint(trainer: Any, checkpoint: str) -> None:
    """Load the weights of ``checkpoint``, a run's last step, into ``trainer`` instead of resuming training there.

    transformers' loop checks ``global_step >= max_steps`` only after a step, so ``train(resume_from_checkpoint=...)``
    from a checkpoint at max_steps in the middle of an epoch trains one step more (a 2-step RL run re-run became
    steps 1, 2, 3, and overwrote its adapter). ``_load_from_checkpoint`` is what ``train`` itself loads the
    weights with; ``tests/test_rerun.py`` fails if the pinned transformers renames it.
    """
    trainer._load_from_checkpoint(checkpoint)


def drop_records_after(path: Path, step: int) -> None:
    """Drop JSONL records logged after ``step`` (a run resumed from that checkpoint logs them again).

    A last line cut off mid-write by a kill goes too, with a warning; a damaged line anywhere
    else is a ``DataError`` naming the file and line.
    """
    if not path.is_file():
        return
    write_jsonl(path, [r for r in read_records(path) if r.get("step", 0) <= step])
