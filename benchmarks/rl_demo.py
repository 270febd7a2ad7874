"""RL algorithms against the demo's GRPO on the demo world, over seeds.

    python benchmarks/rl_demo.py --set opd|macro|props [--out runs/rl_bench] [--seeds 3] [--every 10] [--world long]

For each seed: the demo's world, base and MoL model (``molrl demo``'s default preset, reused
when already on disk, so both sets can share one ``--out``), then RL runs of the demo's length
(80 steps) from the same models, ``mol+grpo`` (the demo's GRPO run) always among them.

- ``--set opd``: ``algorithm=opd`` with the feedback teacher (the frozen base, shown the
  environment's probe output and the verdict on the student's own attempt) at lambda 1
  (``mol+opd``) and 1.25 (``mol+exopd``), and from the base (``base+opd``);
- ``--set macro``: ``algorithm=ppo`` with a critic, token level (``mol+ppo``) and over macro
  actions: ``fixed:5`` (the authors' setting), ``parsing`` and ``ppl``;
- ``--set props``: PROPS behaviour sampling (``mol+props``: rounds of 4 of each group's 8, the
  behaviour adapter updated before each round, training on the last 2 steps' batches) against
  on-policy sampling with the same rounds and buffer (``mol+grpo_buffer2``) and without
  (``mol+grpo``); every run samples the same number of completions. Also printed: the sampling
  error by step window and the behaviour update's share of a step.

Every run evaluates the held-out rule problems every ``--every`` steps (greedy, single step) and
after training both benchmarks. Printed: final held-out and general accuracy (mean ± s.e. over
seeds, per-seed values), held-out accuracy at each evaluated step, mean training reward per step
window, completion lengths, wall time per run, and the first step at which each run reaches the
first run's final held-out accuracy and final training reward.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from molrl.demo.seeds import cell, mean_se
from molrl.records.layout import rl_runs

GRPO = {"mol+grpo": ("mol", ["algorithm=grpo"])}
SETS = {
    "opd": {**GRPO,
            "mol+opd": ("mol", ["algorithm=opd", "beta=0", "opd.lam=1.0"]),
            "mol+exopd": ("mol", ["algorithm=opd", "beta=0", "opd.lam=1.25"]),
            "base+opd": ("base", ["algorithm=opd", "beta=0", "opd.lam=1.0"])},
    "macro": {"mol+ppo": ("mol", ["algorithm=ppo", "macro.rule=token"]),
              "mol+ppo_fixed5": ("mol", ["algorithm=ppo", "macro.rule=fixed:5"]),
              "mol+ppo_parsing": ("mol", ["algorithm=ppo", "macro.rule=parsing"]),
              "mol+ppo_ppl": ("mol", ["algorithm=ppo", "macro.rule=ppl"]),
              **GRPO},
    "props": {**GRPO,
              "mol+grpo_buffer2": ("mol", ["algorithm=grpo", "rollout.rounds=2", "rollout.buffer_batches=2"]),
              "mol+props": ("mol", ["algorithm=grpo", "rollout.behaviour=props"])},
}
"""Runs per set, {name: (start, overrides)}; the first run is the one the others are measured against."""


EVAL_TOKENS = {"digit": 48, "chain": 104, "long": 352}
"""Tokens the held-out evaluation during training may generate, by world (a long-chain solution runs to about 330)."""


def overrides(world: Path, every: int, runs_of_set: dict, world_name: str = "digit") -> list[str]:
    runs = ", ".join(f"{{name: {name}, start: {start}, overrides: [{', '.join(o)}]}}"
                     for name, (start, o) in runs_of_set.items())
    return [f"rl_runs=[{runs}]", f"rl.eval.every_steps={every}", f"rl.eval.data.path={world / 'heldout.jsonl'}",
            "rl.eval.data.format=jsonl", "rl.eval.data.spec.kind=math",
            f"rl.eval.sampling.max_new_tokens={EVAL_TOKENS[world_name]}",
            "rl.eval.kl_prompts=0"]


def run_seed(out: Path, seed: int, every: int, runs_of_set: dict, world_name: str = "digit", preset: str = "default",
             extra: list[str] | None = None) -> Path:
    """The pipeline of ``seed`` with the runs of ``runs_of_set`` (finished stages reused, the world measured); its
    output directory.

    ``preset`` is the demo preset (``quick`` for a check of the benchmark itself); ``extra`` more overrides."""
    from molrl.demo.run import prepare_seed
    from molrl.pipeline import run_pipeline

    cfg, world, threads = prepare_seed(out, preset, [*overrides(out / "world", every, runs_of_set, world_name),
                                                     *(extra or [])], seed, world_name=world_name)
    run_pipeline(cfg, collect_tasks=world.rule_train, most_threads=threads)
    if world_name != "digit":  # the chain worlds' measured properties (world/properties.json), as the demo writes
        from molrl.demo.chain_measure import measure_world

        measure_world(world, out / "base", out / "world", cfg)
    return Path(cfg.output_dir)


def final_accuracy(pipeline: Path, run: str, benchmark: str) -> float:
    results = json.loads((pipeline / "eval" / run / "results.json").read_text())
    return float(results["benchmarks"][benchmark]["pass@1"])


def curve(pipeline: Path, run: str) -> tuple[dict[int, float], float]:
    """(held-out accuracy by step, training wall time in s without the evaluation hook)."""
    rows = metrics(pipeline, run)
    accuracy = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    return accuracy, sum(r.get("step_time", 0.0) for r in rows)


def metrics(pipeline: Path, run: str) -> list[dict]:
    return [json.loads(line) for line in (rl_runs(pipeline) / run / "metrics.jsonl").read_text().splitlines()]


def reward_windows(pipeline: Path, run: str, width: int = 10) -> list[float]:
    """Mean training reward over steps 1-10, 11-20, ..."""
    rewards = [r["reward"] for r in metrics(pipeline, run) if "reward" in r]
    return [sum(rewards[i:i + width]) / len(rewards[i:i + width]) for i in range(0, len(rewards), width)]


def metric_windows(pipeline: Path, run: str, key: str, width: int = 10) -> list[float]:
    """Mean of ``key`` over steps 1-10, 11-20, ... (steps that logged it)."""
    values = [r[key] for r in metrics(pipeline, run) if key in r and "reward" in r]
    return [sum(values[i:i + width]) / len(values[i:i + width]) for i in range(0, len(values), width)]


def lengths(pipeline: Path, run: str) -> list[int]:
    rows = [json.loads(line) for line in (rl_runs(pipeline) / run / "completions.jsonl").read_text().splitlines()]
    return sorted(len(r["completion"]) for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", choices=sorted(SETS), required=True)
    parser.add_argument("--out", default="runs/rl_bench")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--world", choices=sorted(EVAL_TOKENS), default="digit",
                        help="the demo world the runs train on (molrl demo --world)")
    args = parser.parse_args()
    RUNS = SETS[args.set]
    first = next(iter(RUNS))
    pipelines = [run_seed(Path(args.out) / f"seed-{seed}", seed, args.every, RUNS, args.world)
                 for seed in range(args.seeds)]

    print(f"\n{args.seeds} seeds, 80 RL steps per run; mean ± standard error over seeds [per seed]")
    print("| run | held-out | general | training wall s |\n|---|---|---|---|")
    curves = {run: [curve(p, run) for p in pipelines] for run in RUNS}
    for run in RUNS:
        heldout = [final_accuracy(p, run, "heldout") for p in pipelines]
        general = [final_accuracy(p, run, "general") for p in pipelines]
        print(f"| {run} | {cell(heldout)} | {cell(general)} | {cell([c[1] for c in curves[run]], 0)} |")
    steps = sorted(set.intersection(*(set(c[0]) for cs in curves.values() for c in cs)))
    print("\nheld-out accuracy by step (mean over seeds)\n| run | " + " | ".join(map(str, steps)) + " |")
    print("|---|" + "---|" * len(steps))
    for run in RUNS:
        print(f"| {run} | " + " | ".join(f"{mean_se([c[0][s] for c in curves[run]])[0]:.3f}" for s in steps) + " |")
    targets = [final_accuracy(p, first, "heldout") for p in pipelines]
    print(f"\nfirst evaluated step reaching {first}'s final held-out accuracy (per seed; - = never)")
    for run in RUNS:
        reached = []
        for (accuracy, _), target in zip(curves[run], targets):
            hit = [s for s in sorted(accuracy) if accuracy[s] >= target]
            reached.append(str(hit[0]) if hit else "-")
        print(f"- {run}: " + ", ".join(reached))
    windows = {run: [reward_windows(p, run) for p in pipelines] for run in RUNS}
    print("\ntraining reward, mean over steps 1-10, 11-20, ... (mean over seeds)")
    for run in RUNS:
        print(f"- {run}: " + ", ".join(f"{sum(w[i] for w in windows[run]) / len(pipelines):.3f}"
                                       for i in range(min(len(w) for w in windows[run]))))
    print(f"\nfirst 10-step window whose mean reward reaches {first}'s last window (per seed; - = never)")
    for run in RUNS:
        reached = []
        for w, target in zip(windows[run], [w[-1] for w in windows[first]]):
            hit = [i for i, value in enumerate(w) if value >= target]
            reached.append(f"steps {hit[0] * 10 + 1}-{hit[0] * 10 + 10}" if hit else "-")
        print(f"- {run}: " + ", ".join(reached))
    if all("sampling_error" in r for p in pipelines for run in RUNS for r in metrics(p, run)[:1]):
        print("\nsampling error (token level, at states >= 2 of a prompt's completions share), mean over steps "
              "1-10, 11-20, ... (mean over seeds)")
        for run in RUNS:
            series = [metric_windows(p, run, "sampling_error") for p in pipelines]
            print(f"- {run}: " + ", ".join(f"{sum(s[i] for s in series) / len(series):.3f}"
                                           for i in range(min(len(s) for s in series)))
                  + f"; whole run {cell([sum(s) / len(s) for s in series])}")
    if any("time/behaviour_update_s" in r for p in pipelines for run in RUNS for r in metrics(p, run)):
        print("\nwall time per step (s) and the behaviour update's part of it, mean ± s.e. over seeds")
        for run in RUNS:
            step = [sum(metric_windows(p, run, "step_time", 1000)) for p in pipelines]
            update = [sum(metric_windows(p, run, "time/behaviour_update_s", 1000)) for p in pipelines]
            print(f"- {run}: step {cell(step, 2)}; behaviour update {cell(update, 2)}")
    print("\ncompletion length in characters, all sampled completions of all seeds: p50 / p90 / max")
    for run in RUNS:
        every = sorted(x for p in pipelines for x in lengths(p, run))
        print(f"- {run}: {every[len(every) // 2]} / {every[int(len(every) * 0.9)]} / {every[-1]}")


if __name__ == "__main__":
    main()
