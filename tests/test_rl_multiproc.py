"""GRPO under ``accelerate launch`` with two CPU processes (gloo): completes, and rewards aggregate.

accelerate 1.15 starts several CPU processes only through its torch.distributed launcher
(``--multi_gpu`` with ``ACCELERATE_USE_CPU=true``); ``--cpu`` alone or a MULTI_CPU config file
goes to the single-process launcher unless an MPI hostfile is given.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_helpers import save_tiny_model

REPO = Path(__file__).resolve().parents[1]


def test_two_process_run_completes_and_aggregates_rewards_across_ranks(tmp_path):
    base = save_tiny_model(tmp_path / "base")
    out = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", ACCELERATE_USE_CPU="true")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "molrl.cli", "rl",
           "--config", str(REPO / "configs/rl_tiny.yaml"), f"output_dir={out}", f"model.path={base}",
           "train.max_steps=2", "sampling.max_new_tokens=6", "sandbox.workers=1", "train.micro_batch_size=4"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "reward" in m]
    assert [m["step"] for m in steps] == [1, 2]  # written once, by the main process
    completions = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    for m in steps:
        rows = [c["rewards"]["correctness"] for c in completions if c["step"] == m["step"]]
        # 2 ranks x 1 prompt x 8 completions: the logged reward is the mean over both ranks' completions
        assert len(rows) == 16
        assert m["reward"] == pytest.approx(sum(rows) / len(rows), abs=1e-6)
        # each rank's group reaches its loss in two shuffled micro-batches of 4; the error is read from them once
        assert m["sampling_error/shared_states"] >= 1 and m["sampling_error"] >= 0
    assert (out / "adapter" / "adapter_config.json").is_file()
