"""A re-run that finds no checkpoint (the first run stopped before its first one) says in one line that it starts
over; a first run says nothing of the kind."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from molrl.records.rerun import save_run_config, training_rerun

TRACES = Path(__file__).resolve().parents[1] / "configs" / "data" / "mol_tiny_traces.jsonl"


def _config(stage: str, out: Path):
    from molrl.config import load_config
    from molrl.mol.config import MolConfig
    from molrl.rl.config import RlConfig

    data = f"data.traces=[{TRACES}]" if stage == "mol" else "data.format=toy"
    return load_config(MolConfig if stage == "mol" else RlConfig, None, ["model=tiny:chatml", data, f"output_dir={out}"])


@pytest.mark.parametrize("stage", ["mol", "rl"])
def test_a_rerun_without_a_checkpoint_says_it_starts_over(tmp_path, caplog, stage):
    out = tmp_path / "run"
    cfg = _config(stage, out)
    caplog.set_level(logging.INFO, logger="molrl")
    first = training_rerun(stage, cfg, out, out / "adapter", cfg.train.max_steps)
    assert (first.checkpoint, first.finished) == (None, False)
    assert not [r for r in caplog.records if "starting over" in r.getMessage()]

    save_run_config(stage, cfg, out / "config.yaml")  # the first run got this far, then was stopped
    caplog.clear()
    again = training_rerun(stage, cfg, out, out / "adapter", cfg.train.max_steps)
    assert (again.checkpoint, again.finished) == (None, False)
    assert [r.getMessage() for r in caplog.records] == [
        f"{out}: no checkpoint to resume from (none saved under {out / 'checkpoints'}); starting over from step 0"]
