"""A run killed with SIGKILL mid-training resumes from its last checkpoint and continues the same curve."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Runs `run_mol` on the shipped tiny config; with a kill step it SIGKILLs itself right after that
# optimiser step (before its log line and any checkpoint of it are written).
SCRIPT = """
import os, signal, sys
import torch
torch.set_num_threads(1)
from transformers import TrainerCallback
from molrl.config import load_config
from molrl.mol import trainer as mol_trainer
from molrl.mol.config import MolConfig
from molrl.mol.run import run_mol

kill_at = int(sys.argv[1])

class KillAt(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

init = mol_trainer.MolTrainer.__init__
def init_with_kill(self, *a, **k):
    init(self, *a, **k)
    self.add_callback(KillAt())
mol_trainer.MolTrainer.__init__ = init_with_kill
run_mol(load_config(MolConfig, sys.argv[2], sys.argv[3:]))
"""


def _run(out: Path, kill_at: int) -> subprocess.CompletedProcess:
    overrides = [f"output_dir={out}", "train.max_steps=10", "train.save_steps=3", "train.micro_batch_size=1",
                 "train.grad_accumulation=2", "train.report_to=[none]", "lora.dropout=0.1"]
    return subprocess.run([sys.executable, "-c", SCRIPT, str(kill_at), str(REPO / "configs" / "mol_tiny.yaml"),
                           *overrides], cwd=REPO, capture_output=True, text=True, timeout=300)


def _curve(out: Path) -> list[tuple[int, float, float]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"], r["kl_decision"]) for r in rows if "loss" in r]


def test_sigkill_then_rerun_continues_the_same_loss_curve(tmp_path):
    straight = _run(tmp_path / "straight", kill_at=-1)
    assert straight.returncode == 0, straight.stderr[-2000:]

    killed = _run(tmp_path / "resumed", kill_at=7)  # 4 steps per epoch: dies mid-epoch 2
    assert killed.returncode == -signal.SIGKILL
    saved = (tmp_path / "resumed" / "checkpoints").glob("checkpoint-*")
    assert sorted(p.name for p in saved) == ["checkpoint-3", "checkpoint-6"]
    resumed = _run(tmp_path / "resumed", kill_at=-1)
    assert resumed.returncode == 0, resumed.stderr[-2000:]

    want, got = _curve(tmp_path / "straight"), _curve(tmp_path / "resumed")
    assert [s for s, _, _ in got] == list(range(1, 11))  # steps 7.. logged once, after the resume
    for (step, loss_w, kl_w), (_, loss_g, kl_g) in zip(want, got):
        assert loss_g == pytest.approx(loss_w, rel=1e-5), f"step {step}"
        assert kl_g == pytest.approx(kl_w, rel=1e-4, abs=1e-9), f"step {step}"
