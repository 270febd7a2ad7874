"""Feedback before RL, during RL, or at test time, on one world, over seeds.

    python benchmarks/multiturn_rl.py [--out runs/multiturn] [--seeds 3] [--first 0] [--steps 80]
                                      [--world digit|long] [--config CONFIG]

For each seed: the world, base and MoL model of ``molrl demo --world WORLD`` (``--config`` names its pipeline,
by default ``configs/pipeline_tiny_multiturn.yaml`` for the digit world, ``pipeline_long_multiturn.yaml`` for
the long one;
finished stages and evaluations are reused, so an interrupted run picks up where it stopped), then the
RL runs of that config at ``--steps`` steps each:

- ``base+grpo``: single-turn GRPO from the base;
- ``mol+grpo``: single-turn GRPO from the MoL model (MoL-RL: the feedback absorbed before RL);
- ``base+mt_grpo``: multi-turn GRPO from the base (``episode.max_turns=2``: run code, read the output, answer);
- ``base+mt_grpo_echo``: the same with CE on the feedback tokens (``loss.ce_weight``, ECHO);
- ``base+mt_grpo_echo_kl``: and MoL's KL to the base on decision tokens (``loss.kl_weight``).

Every model (the base and MoL model too, as controls) is evaluated single-turn (no execution: the
held-out rule problems and the general tasks, forgetting) and multi-turn (the episode loop with the
tool, ``molrl eval --turns 2``). Printed, and written to ``<out>/multiturn.md``: one row per model,
mean ± standard error over seeds with the per-seed values, the mean training reward of the last 10 RL
steps (the control that RL itself worked), and the RL wall time (the sum of the run's step times).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path

from molrl.demo.seeds import cell
from molrl.records.layout import rl_runs

ROOT = Path(__file__).resolve().parents[1]


CONFIGS = {"digit": "pipeline_tiny_multiturn.yaml", "long": "pipeline_long_multiturn.yaml"}
"""Each world's pipeline with the five RL runs."""


def run_seed(out: Path, seed: int, steps: int, config: Path, world_name: str = "digit") -> tuple[Path, object]:
    """The pipeline of seed ``seed`` (reused where finished) and its config."""
    from molrl.demo.run import prepare_seed
    from molrl.pipeline import run_pipeline

    cfg, world, threads = prepare_seed(out, "default", [f"rl.train.max_steps={steps}"], seed, config, world_name)
    run_pipeline(cfg, collect_tasks=world.rule_train, most_threads=threads)
    return Path(cfg.output_dir), cfg


def multi_turn_eval(cfg: object, pipeline: Path, name: str) -> Path:
    """The interactive evaluation of model ``name`` in ``pipeline/eval_turns/<name>`` (reused when finished)."""
    from molrl.demo.run import episode_config
    from molrl.eval import run_eval
    from molrl.pipeline import model_weights
    from molrl.pipeline.config import eval_config

    model, adapter = model_weights(cfg, name, pipeline)
    out = pipeline / "eval_turns" / name
    if (out / "results.json").is_file():
        return out
    single = eval_config(cfg, name, model, adapter, pipeline)
    episode = episode_config(cfg).episode(max_turns=2)
    run_eval(dataclasses.replace(single, mode="interactive", interactive=episode, output_dir=out))
    return out


def accuracy(folder: Path, benchmark: str) -> float:
    return float(json.loads((folder / "results.json").read_text())["benchmarks"][benchmark]["pass@1"])


def rl_wall_s(pipeline: Path, name: str) -> float:
    """Training wall time of an RL run: the sum of its logged step times (0 for a model without RL)."""
    path = rl_runs(pipeline) / name / "metrics.jsonl"
    if not path.is_file():
        return 0.0
    return sum(json.loads(line).get("step_time", 0.0) for line in path.read_text().splitlines())


def late_reward(pipeline: Path, name: str, last: int = 10) -> float:
    """Mean training reward of an RL run's last ``last`` steps (nan for a model without RL)."""
    path = rl_runs(pipeline) / name / "metrics.jsonl"
    if not path.is_file():
        return math.nan
    rewards = [m["reward"] for m in map(json.loads, path.read_text().splitlines()) if "reward" in m]
    return sum(rewards[-last:]) / len(rewards[-last:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/multiturn")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first", type=int, default=0, help="first seed to run (several processes can split the seeds)")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--world", choices=sorted(CONFIGS), default="digit")
    parser.add_argument("--config", type=Path, help="the pipeline (default: the world's in CONFIGS)")
    parser.add_argument("--table", action="store_true",
                        help="run nothing: tabulate the seeds under --out whose runs and evaluations have all finished")
    args = parser.parse_args()
    rows: dict[str, dict[str, list[float]]] = {}
    seeds = []
    for seed in range(args.first, args.seeds):
        started = time.time()
        if args.table:
            found = finished_seed(Path(args.out) / f"seed-{seed}" / "pipeline")
            if found is None:
                continue
            pipeline, cfg = found
        else:
            config = args.config or ROOT / "configs" / CONFIGS[args.world]
            pipeline, cfg = run_seed(Path(args.out) / f"seed-{seed}", seed, args.steps, config, args.world)
        add_seed(rows, pipeline, cfg, evaluate=not args.table)
        seeds.append(seed)
        print(f"seed {seed} done in {time.time() - started:.0f} s ({pipeline})", flush=True)
    lines = table(rows, seeds, args.steps)
    print("\n" + "\n".join(lines))
    (Path(args.out) / "multiturn.md").write_text("# Feedback before, during or without RL\n\n" + "\n".join(lines) + "\n")


def model_names(cfg: object) -> list[str]:
    return ["base", *(r.name for r in cfg.mol_runs), *(r.name for r in cfg.rl_runs)]


def finished_seed(pipeline: Path) -> tuple[Path, object] | None:
    """(pipeline, config) of a seed whose every model has both evaluations, else None."""
    from molrl.pipeline.config import load_pipeline_config

    if not (pipeline / "config.yaml").is_file():
        return None
    cfg = load_pipeline_config(pipeline / "config.yaml")
    done = all((pipeline / folder / name / "results.json").is_file()
               for name in model_names(cfg) for folder in ("eval", "eval_turns"))
    return (pipeline, cfg) if done else None


def add_seed(rows: dict[str, dict[str, list[float]]], pipeline: Path, cfg: object, evaluate: bool) -> None:
    """One seed's figures of every model into ``rows`` (its multi-turn evaluations run first when ``evaluate``)."""
    for name in model_names(cfg):
        turns = multi_turn_eval(cfg, pipeline, name) if evaluate else pipeline / "eval_turns" / name
        row = rows.setdefault(name, {k: [] for k in ("single", "multi", "general", "reward", "wall")})
        row["single"].append(accuracy(pipeline / "eval" / name, "heldout"))
        row["multi"].append(accuracy(turns, "heldout"))
        row["general"].append(accuracy(pipeline / "eval" / name, "general"))
        row["reward"].append(late_reward(pipeline, name))
        row["wall"].append(rl_wall_s(pipeline, name))


def table(rows: dict[str, dict[str, list[float]]], seeds: list[int], steps: int) -> list[str]:
    """The markdown table: mean ± standard error over seeds [per seed] of each model."""
    lines = [f"seeds {', '.join(map(str, seeds))}, {steps} RL steps per run; mean ± standard error over seeds "
             "[per seed]", "",
             "| model | held-out, single-turn | held-out, multi-turn (tool) | general, single-turn | "
             "RL training reward, last 10 steps | RL wall s |", "|---|---|---|---|---|---|"]
    for name, row in rows.items():
        reward = cell(row["reward"], 2) if not math.isnan(row["reward"][0]) else "-"
        lines.append(f"| {name} | {cell(row['single'], 2)} | {cell(row['multi'], 2)} | {cell(row['general'], 2)} | "
                     f"{reward} | {cell(row['wall'], 0)} |")
    return lines


if __name__ == "__main__":
    main()
