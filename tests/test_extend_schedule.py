"""Extending a run (``train.max_steps`` raised) trains on the schedule the new max_steps would have had from step 0
(``molrl.records.runfiles.ResumedSchedule``), for MoL and RL alike."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import TrainerCallback

from molrl.config import load_config

REPO = Path(__file__).resolve().parents[1]


class _Rates(TrainerCallback):
    """Records the learning rate each optimiser step is taken with."""

    def __init__(self, rates: list[float]):
        self.rates = rates

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        self.rates.append(optimizer.param_groups[0]["lr"])


def _recording(monkeypatch, module) -> dict[str, list[float]]:
    """Make ``module.build_trainer`` record each step's rate into ``rates["into"]``, a list the test swaps."""
    build, rates = module.build_trainer, {"into": []}

    def build_recording(*args, **kwargs):
        built = build(*args, **kwargs)
        (built[0] if isinstance(built, tuple) else built).add_callback(_Rates(rates["into"]))
        return built

    monkeypatch.setattr(module, "build_trainer", build_recording)
    return rates


def test_finding7_an_extended_mol_run_keeps_the_schedule_of_its_new_length(tmp_path, monkeypatch):
    import molrl.mol.run as mol_run
    from molrl.mol.config import MolConfig

    def run(out: Path, steps: int) -> None:
        mol_run.run_mol(load_config(MolConfig, str(REPO / "configs" / "mol_tiny.yaml"), [
            f"output_dir={out}", f"train.max_steps={steps}", "train.report_to=[none]", "train.lr_scheduler=cosine",
            f"data.traces=[{REPO / 'configs' / 'data' / 'mol_tiny_traces.jsonl'}]"]))

    direct, extended = [], []
    rates = _recording(monkeypatch, mol_run)
    rates["into"] = direct
    run(tmp_path / "direct", 4)
    rates["into"] = extended
    run(tmp_path / "extended", 2)
    run(tmp_path / "extended", 4)
    assert len(direct) == len(extended) == 4 and direct[2] > 0
    # steps 1-2 were trained on the 2-step run's own cosine; every added step is on the 4-step one
    assert extended[2:] == pytest.approx(direct[2:], rel=1e-12)  # before: step 3 at 0.0, the old cosine's end


def test_an_extended_rl_run_keeps_the_schedule_of_its_new_length(tmp_path, monkeypatch):
    import molrl.rl.run as rl_run
    from molrl.rl.config import RlConfig

    def run(out: Path, steps: int) -> None:
        rl_run.run_rl(load_config(RlConfig, str(REPO / "configs" / "rl_tiny.yaml"), [
            f"output_dir={out}", f"train.max_steps={steps}", "sampling.max_new_tokens=4", "train.lr_scheduler=cosine",
            "train.save_steps=2"]))

    direct, extended = [], []
    rates = _recording(monkeypatch, rl_run)
    rates["into"] = direct
    run(tmp_path / "direct", 3)
    rates["into"] = extended
    run(tmp_path / "extended", 2)
    run(tmp_path / "extended", 3)
    assert len(direct) == len(extended) == 3 and direct[2] > 0
    assert extended[2:] == pytest.approx(direct[2:], rel=1e-12)
