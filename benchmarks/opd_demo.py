"""On-policy distillation with a feedback teacher vs GRPO, on the demo world, over seeds.

    python benchmarks/opd_demo.py [--out runs/opd_bench] [--seeds 3] [--every 10]

For each seed: the demo's world, base and MoL model (``molrl demo``'s default preset, reused
when already on disk), then four RL runs of the demo's length (80 steps) from the same models:

- ``mol+grpo``: the demo's GRPO run (the baseline);
- ``mol+opd``: ``algorithm=opd``, feedback teacher (the frozen base, shown the environment's probe
  output and the verdict on the student's own attempt), lambda 1;
- ``mol+exopd``: the same with lambda 1.25 (ExOPD);
- ``base+opd``: lambda 1 from the base (no MoL).

Every run evaluates the held-out rule problems every ``--every`` steps (greedy, single step) and
after training both benchmarks. Printed: final held-out and general accuracy (mean ± s.e. over
seeds, per-seed values), held-out accuracy at each evaluated step, wall time per run, and the
first step at which each run reaches mol+grpo's final held-out accuracy.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

RUNS = {
    "mol+grpo": ("mol", ["algorithm=grpo"]),
    "mol+opd": ("mol", ["algorithm=opd", "beta=0", "opd.lam=1.0"]),
    "mol+exopd": ("mol", ["algorithm=opd", "beta=0", "opd.lam=1.25"]),
    "base+opd": ("base", ["algorithm=opd", "beta=0", "opd.lam=1.0"]),
}


def overrides(world: Path, every: int) -> list[str]:
    runs = ", ".join(f"{{name: {name}, start: {start}, overrides: [{', '.join(o)}]}}"
                     for name, (start, o) in RUNS.items())
    return [f"grpo_runs=[{runs}]", f"grpo.eval.every_steps={every}", f"grpo.eval.tasks.path={world / 'heldout.jsonl'}",
            "grpo.eval.tasks.format=jsonl", "grpo.eval.tasks.spec.kind=math", "grpo.eval.max_new_tokens=48",
            "grpo.eval.kl_prompts=0"]


def run_seed(out: Path, seed: int, every: int) -> Path:
    from molrl.demo.run import prepare_seed, use_idle_threads
    from molrl.pipeline import run_pipeline

    cfg, world, threads = prepare_seed(out, "default", overrides(out / "world", every), seed)
    run_pipeline(cfg, collect_tasks=world.rule_train, before_stage=lambda stage: use_idle_threads(threads, stage))
    return Path(cfg.output_dir)


def mean_se(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n) if n > 1 else 0.0
    return mean, se


def cell(values: list[float], digits: int = 3) -> str:
    mean, se = mean_se(values)
    return f"{mean:.{digits}f} ± {se:.{digits}f} [" + ", ".join(f"{v:.{digits}f}" for v in values) + "]"


def final_accuracy(pipeline: Path, run: str, benchmark: str) -> float:
    results = json.loads((pipeline / "eval" / run / "results.json").read_text())
    return float(results["benchmarks"][benchmark]["pass@1"])


def curve(pipeline: Path, run: str) -> tuple[dict[int, float], float]:
    """(held-out accuracy by step, training wall time in s without the evaluation hook)."""
    rows = [json.loads(line) for line in (pipeline / "grpo" / run / "metrics.jsonl").read_text().splitlines()]
    accuracy = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    return accuracy, sum(r.get("step_time", 0.0) for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/opd_bench")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--every", type=int, default=10)
    args = parser.parse_args()
    pipelines = [run_seed(Path(args.out) / f"seed-{seed}", seed, args.every) for seed in range(args.seeds)]

    print(f"\n{args.seeds} seeds, 80 RL steps per run; mean ± standard error over seeds [per seed]")
    print(f"| run | held-out | general | training wall s |\n|---|---|---|---|")
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
    targets = [final_accuracy(p, "mol+grpo", "heldout") for p in pipelines]
    print("\nfirst evaluated step reaching mol+grpo's final held-out accuracy (per seed; - = never)")
    for run in RUNS:
        reached = []
        for (accuracy, _), target in zip(curves[run], targets):
            hit = [s for s in sorted(accuracy) if accuracy[s] >= target]
            reached.append(str(hit[0]) if hit else "-")
        print(f"- {run}: " + ", ".join(reached))


if __name__ == "__main__":
    main()
