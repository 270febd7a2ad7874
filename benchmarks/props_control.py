"""PROPS' control: a frozen policy on repeated prompts, the sampling error split by the entropy of the state.

    python benchmarks/props_control.py --run DEMO_RUN_DIR [--out runs/props_control] [--seeds 3] [--steps 20]
                                       [--max-completion-length 48]

``DEMO_RUN_DIR`` is a finished ``molrl demo`` run (its ``base/``, ``world/rl_train.jsonl`` and MoL adapter
``pipeline/mol/mol/adapter``), of either world. The policy is the MoL model with learning rate 0, so it
never moves: what changes between arms is only which policy samples. Every step samples the same
``--prompts`` prompts (G = 8 each, in 2 rounds of 4), and the sampling error is measured on the rows of
each update (the step's and the previous step's: ``rollout.buffer_batches=2``) against the frozen policy,
split at ``--split`` nats of the policy's entropy at the state. ``--max-completion-length`` is the world's
(48 for the digit world, 352 for the long one):

- ``on-policy``: the frozen policy samples every round;
- ``props``: PROPS' behaviour adapter, refit from the policy before every round on the buffer and the step's
  earlier rounds (the paper's algorithm);
- ``props_min_entropy``: the same, with states below ``--split`` nats left out of the behaviour objective
  (``props.min_entropy``, a deviation from the paper).

Printed: per arm, the sampling error at low- and high-entropy states and over all shared states, and the
reward per completion, mean ± standard error over seeds [per seed], each a mean over steps 3..N (the
first two steps fill the buffer).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from molrl.config.blocks import ModelSource
from molrl.demo.seeds import cell

ARMS = {
    "on-policy": {"behaviour": "policy", "min_entropy": 0.0},
    "props": {"behaviour": "props", "min_entropy": 0.0},
    "props_min_entropy": {"behaviour": "props", "min_entropy": None},  # None: --split
}
"""Arm name -> rollout.behaviour and props.min_entropy."""


def config(run: Path, out: Path, arm: dict, seed: int, steps: int, prompts: int, split: float,
           max_completion_length: int = 48):
    from molrl.rl.config import RlConfig, TaskSource, rl_lora, rl_sampling, rl_train
    from molrl.task_types import JsonlSpec

    cfg = RlConfig(
        output_dir=out, model=ModelSource(str(run / "base"), adapter=run / "pipeline" / "mol" / "mol"),
        lora=rl_lora(rank=16, alpha=32),
        data=TaskSource(path=run / "world" / "rl_train.jsonl", format="jsonl", limit=prompts,
                         spec=JsonlSpec(kind="math")),
        algorithm="grpo", thinking=True, math_prompt="{prompt}", prompts_per_step=prompts,
        sampling=rl_sampling(n=8, max_new_tokens=max_completion_length, temperature=1.0),
        max_prompt_length=256, beta=0.0,
        train=rl_train(learning_rate=0.0, max_steps=steps, micro_batch_size=8 * prompts, save_steps=10_000,
                            seed=seed))
    cfg.rollout.behaviour, cfg.rollout.rounds, cfg.rollout.buffer_batches = arm["behaviour"], 2, 2
    cfg.rollout.sampling_error_split = split
    cfg.props.min_entropy = split if arm["min_entropy"] is None else arm["min_entropy"]
    cfg.sandbox.workers = 2
    return cfg


def figures(out: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "reward" in r][2:]  # steps 3..N: the buffer is full
    keys = {"low": "sampling_error/low_entropy", "high": "sampling_error/high_entropy", "all": "sampling_error",
            "reward": "reward", "low_states": "sampling_error/low_entropy_states",
            "high_states": "sampling_error/high_entropy_states"}
    return {name: sum(r[key] for r in rows) / len(rows) for name, key in keys.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, required=True, help="a finished molrl demo run directory")
    parser.add_argument("--out", type=Path, default=Path("runs/props_control"))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--split", type=float, default=0.5, help="entropy (nats) between low and high states")
    parser.add_argument("--max-completion-length", type=int, default=48)
    args = parser.parse_args()
    from molrl.rl import run_rl

    results: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    for seed in range(args.seeds):
        for arm, settings in ARMS.items():
            out = args.out / f"seed-{seed}" / arm
            if not (out / "adapter").is_dir():  # finished runs are reused
                run_rl(config(args.run, out, settings, seed, args.steps, args.prompts, args.split,
                              args.max_completion_length))
            results[arm].append(figures(out))
    print(f"\n{args.seeds} seeds x {args.steps} steps, frozen policy, {args.prompts} prompts repeated every step; "
          f"mean ± s.e. over seeds [per seed], steps 3..{args.steps}")
    print(f"| arm | error, entropy < {args.split} | error, entropy >= {args.split} | error, all shared states | "
          "reward per completion |\n|---|---|---|---|---|")
    for arm, rows in results.items():
        print(f"| {arm} | " + " | ".join(cell([r[k] for r in rows]) for k in ("low", "high", "all", "reward")) + " |")
    base = results["on-policy"]
    for arm in ARMS:
        if arm != "on-policy":
            ratios = {k: [r[k] / b[k] if b[k] else math.nan for r, b in zip(results[arm], base)] for k in ("low", "high")}
            print(f"- {arm} / on-policy: low-entropy states {cell(ratios['low'], 2)}, high {cell(ratios['high'], 2)}")
    states = {k: cell([r[k] for r in base], 0) for k in ("low_states", "high_states")}
    print(f"- shared states per update (on-policy): low {states['low_states']}, high {states['high_states']}")


if __name__ == "__main__":
    main()
