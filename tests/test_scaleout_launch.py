"""``accelerate launch`` of the ``molrl mol`` CLI with two CPU processes (gloo).

Two processes x micro-batch 4 must give the same loss curve as one process x micro-batch 8:
the per-step token counts are all-reduced, so each rank's share of the loss is exact.
accelerate starts several CPU processes only through its torch.distributed launcher, which
``configs/accelerate/cpu_2proc.yaml`` selects when ``ACCELERATE_USE_CPU=true`` is set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMON = ["--config", str(REPO / "configs/mol_tiny.yaml"), "train.max_steps=3", "train.grad_accumulation=1",
          "train.save_steps=100", "train.report_to=[]", "lora.dropout=0.0", "train.learning_rate=0.01"]


def _losses(out: Path) -> list[float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r.get("loss") is not None]


def _run(cmd: list[str]) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", ACCELERATE_USE_CPU="true")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


def test_two_processes_match_one_process_loss_curve(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    _run([sys.executable, "-m", "molrl.cli", "mol", *COMMON, "train.micro_batch_size=8", f"output_dir={one}"])
    _run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
          str(REPO / "configs/accelerate/cpu_2proc.yaml"), "-m", "molrl.cli", "mol", *COMMON,
          "train.micro_batch_size=4", f"output_dir={two}"])
    single, double = _losses(one), _losses(two)
    assert len(single) == len(double) == 3
    for a, b in zip(single, double):
        assert abs(a - b) < 1e-4 * max(1.0, abs(a)), (single, double)
    assert single[0] != single[-1]  # the steps really trained
