"""The files a training run keeps beside its weights: the metrics log and the checkpoints, and how a
resumed run (MoL or RL) finds the last whole checkpoint and trims what was logged after it."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from molrl.jsonl import read_records, repair_torn_tail, write_jsonl

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
        with self.path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")


def last_whole_checkpoint(folder: Path) -> str | None:
    """The newest ``checkpoint-N`` in ``folder`` whose trainer state (written last) reads back; a checkpoint torn
    by a kill while it was being written is passed over."""
    if not folder.is_dir():
        return None
    found = sorted((int(p.name.split("-")[1]), p) for p in folder.glob("checkpoint-*")
                   if p.is_dir() and p.name.split("-")[1].isdigit())
    for _, path in reversed(found):
        try:
            json.loads((path / "trainer_state.json").read_text())
        except (OSError, ValueError):
            log.warning("%s: incomplete (killed while it was written?); resuming from an earlier one", path)
            continue
        return str(path)
    return None


def drop_records_after(path: Path, step: int) -> None:
    """Drop JSONL records logged after ``step`` (a run resumed from that checkpoint logs them again).

    A last line cut off mid-write by a kill goes too, with a warning; a damaged line anywhere
    else is a ``DataError`` naming the file and line.
    """
    if not path.is_file():
        return
    write_jsonl(path, [r for r in read_records(path) if r.get("step", 0) <= step])
