"""The RL step's behaviour pinned: per-step figures of short tiny runs of each algorithm, against a fixture.

Each run (toy task, sandboxed checker, a LoRA on the tiny model, beta > 0 so the reference term
acts, completions long enough that some end early and lengths differ) is seeded, single-threaded
and deterministic on one machine. Its per-step reward, loss, KL, gradient norm, entropy and mean
completion length must match ``fixtures/rl_golden.json`` within float tolerance: a change to how a
rollout is scored, how advantages are formed or how the loss is aggregated moves them.

Regenerate the fixture (only for an intended change of behaviour, and say so in the commit):
``MOLRL_WRITE_GOLDEN=1 python -m pytest tests/test_rl_golden.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from grpo_helpers import save_tiny_model, toy_config

FIXTURE = Path(__file__).parent / "fixtures" / "rl_golden.json"
ALGORITHMS = ("grpo", "dr_grpo", "dr_grpo_std")
KEYS = ("reward", "loss", "kl", "grad_norm", "entropy", "completions/mean_length")


def golden_run(root: Path, algorithm: str) -> list[dict[str, float]]:
    """Per-step figures of a 4-step run of ``algorithm`` on the toy task."""
    from molrl.rl import run_rl

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the same float sums on every run
    try:
        base = root / "base"
        if not base.is_dir():
            save_tiny_model(base)
        cfg = toy_config(root / algorithm, base, algorithm=algorithm, max_steps=4, beta=0.05, num_generations=8,
                         micro_batch_size=8, prompts_per_step=2, max_completion_length=32)
        out = run_rl(cfg)
    finally:
        torch.set_num_threads(threads)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{key: row[key] for key in KEYS} for row in rows if "reward" in row]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden")
    measured = {algorithm: golden_run(root, algorithm) for algorithm in ALGORITHMS}
    if os.environ.get("MOLRL_WRITE_GOLDEN") == "1":
        FIXTURE.write_text(json.dumps(measured, indent=1) + "\n")
    return measured


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_per_step_figures_match_the_fixture(runs, algorithm):
    expected = json.loads(FIXTURE.read_text())[algorithm]
    measured = runs[algorithm]
    assert len(measured) == len(expected) == 4
    for step, (got, want) in enumerate(zip(measured, expected), start=1):
        for key in KEYS:
            assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), (algorithm, step, key, got, want)


def test_the_fixture_exercises_what_it_pins():
    expected = json.loads(FIXTURE.read_text())
    # lengths differ (some completions end before the limit), the KL term acts, and the algorithms differ
    assert any(row["completions/mean_length"] < 32 for rows in expected.values() for row in rows)
    assert all(rows[-1]["kl"] > 0 for rows in expected.values())
    assert len({rows[-1]["loss"] for rows in expected.values()}) == 3
