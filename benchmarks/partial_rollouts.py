"""Synchronous vs active partial rollouts (APRIL) on a long-tail workload, in one run.

    python benchmarks/partial_rollouts.py [--seeds 3] [--steps 40] [--max-tokens 256] [--eos-logit 1.5]
        [--prompts 4] [--group 8] [--over-provision 2.0] [--lr 2e-3] [--out runs/partial_bench] [--device cuda]

Workload: the toy task (reward: the fraction of lowercase letters, counted by a checker in the
sandbox) on a tiny model whose EOS row is set so that completions end at spread, long-tailed
lengths (``molrl.tiny.with_eos_logit``), capped at ``--max-tokens``. Each step trains on
``--prompts`` groups of ``--group`` completions. At the start the lengths are p50 12 / p90 53 /
max 178 tokens (EOS logit 1.5); training lengthens them, as RL does to real completions (the
learning rate, 2e-3, is low enough that the tail stays: at 5e-3 nearly every completion hits the
cap within 5 steps and there is no tail left to wait for).

Arms, each for every seed, same steps (so the same number of completions consumed):
- ``sync``: every step waits for its longest completion;
- ``partial``: ``rollout.partial=true``, over-provisioned ``--over-provision`` times, off-policy
  tokens importance-weighted (truncated at 2);
- ``partial_mask``: the same, off-policy tokens left out of the loss.

Two phases per seed. 1: throughput at a fixed policy (learning rate 0, ``--fixed-steps``): both
arms sample from the same distribution, so their throughput compares rollout alone. 2: training
(``--steps`` at ``--lr``), where the arms' policies, and so their lengths, part ways.

Printed: the completion-length distribution (p50 / p90 / max tokens, from the sync arm); the cost
of one decoding step at the partial arm's batch width against the sync arm's (the ratio that
decides APRIL's gain: a memory-bound GPU decodes a wider batch at nearly the same cost, a CPU
does not); rollout throughput (finished completion tokens and finished groups per second of
generation, and per second of the whole step); reward by window of consumed completions and over
the last half of the run, mean ± s.e. over seeds, with per-seed values.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import time
from pathlib import Path

import torch

from molrl.demo.seeds import cell

ARMS = {"sync": {}, "partial": {"off_policy": "importance"}, "partial_mask": {"off_policy": "mask"}}


def build_model(path: Path, eos_logit: float, seed: int) -> Path:
    from molrl.tiny import build_tiny_pair, with_eos_logit

    model, tok = build_tiny_pair("chatml", seed=seed, initializer_range=0.1)
    with_eos_logit(model, tok.eos_token_id, eos_logit, seed=seed)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def decode_cost(model_dir: Path, widths: tuple[int, int], tokens: int = 64, repeats: int = 3,
                device: str = "cpu") -> dict[int, float]:
    """Seconds per decoding step at each batch width (EOS suppressed, so every row decodes ``tokens``)."""
    from molrl.models import load_model

    model = load_model(str(model_dir), device=device).eval()
    prompt = torch.randint(0, 200, (1, 24), device=device)
    out = {}
    for width in widths:
        ids = prompt.repeat(width, 1)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            with torch.no_grad():
                model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=tokens,
                               min_new_tokens=tokens, pad_token_id=model.config.eos_token_id)
            if device == "cuda":
                torch.cuda.synchronize()
            times.append((time.perf_counter() - start) / tokens)
        out[width] = min(times)
    return out


def run_arm(out: Path, base: Path, arm: str, seed: int, args: argparse.Namespace, steps: int, lr: float) -> Path:
    from molrl.rl import run_rl
    from molrl.rl.config import RlConfig, TaskSource, rl_lora, rl_sampling, rl_train

    cfg = RlConfig(output_dir=out, model=str(base), lora=rl_lora(rank=16, alpha=32),
                   data=TaskSource(format="toy", limit=64), algorithm="grpo",
                   sampling=rl_sampling(n=args.group, max_new_tokens=args.max_tokens, temperature=1.0),
                   prompts_per_step=args.prompts, max_prompt_length=256,
                   train=rl_train(learning_rate=lr, max_steps=steps, micro_batch_size=args.group,
                                       save_steps=10_000, seed=seed))
    cfg.sandbox.workers = 2
    if arm != "sync":
        cfg.rollout.partial = True
        cfg.rollout.over_provision = args.over_provision
        cfg.rollout.off_policy = ARMS[arm]["off_policy"]
    if out.exists():
        shutil.rmtree(out)
    return run_rl(cfg)


def summary(run: Path, group: int) -> dict:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward" in r]
    lines = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    generation = sum(r["time/generation_s"] for r in steps)
    wall = sum(r["step_time"] for r in steps)
    tokens = sum(x["tokens"] for x in lines)
    groups = len(lines) / group
    rewards = [r["reward"] for r in steps]
    half = rewards[len(rewards) // 2:]
    return {"tokens_per_gen_s": tokens / generation, "groups_per_gen_s": groups / generation,
            "tokens_per_step_s": tokens / wall, "groups_per_step_s": groups / wall, "rewards": rewards,
            "late_reward": sum(half) / len(half), "lengths": [x["tokens"] for x in lines],
            "off_policy": sum(r.get("partial/off_policy_token_fraction", 0.0) for r in steps) / len(steps),
            "buffer": steps[-1].get("partial/buffer_groups", 0.0)}


def use_device(args: argparse.Namespace) -> None:
    """Resolve ``args.device``; for cpu, hide the GPUs so the RL stage (which takes cuda when visible) runs on CPU."""
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before anything asks torch for a GPU
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--eos-logit", type=float, default=1.5)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--over-provision", type=float, default=2.0)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--fixed-steps", type=int, default=20,
                        help="steps of the throughput phase, at learning rate 0 (the policy, and so the lengths, stay fixed)")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of " + ", ".join(ARMS))
    parser.add_argument("--out", default="runs/partial_bench")
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None,
                        help="where the runs train and generate (default: cuda when a GPU is visible)")
    args = parser.parse_args()
    use_device(args)
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)

    arms = args.arms.split(",")
    results: dict[str, list[dict]] = {arm: [] for arm in arms}
    widths = (args.prompts * args.group, math.ceil(args.over_provision * args.prompts) * args.group)
    cost = None
    fixed: dict[str, list[dict]] = {"sync": [], "partial": []}
    for seed in range(args.seeds):
        base = build_model(root / f"base-{seed}", args.eos_logit, seed)
        if cost is None:
            cost = decode_cost(base, widths, device=args.device)
        for arm in fixed:  # throughput at a fixed policy: both arms face the same length distribution
            fixed[arm].append(summary(run_arm(root / f"seed-{seed}" / f"fixed-{arm}", base, arm, seed, args,
                                              args.fixed_steps, 0.0), args.group))
        for arm in arms:
            started = time.time()
            results[arm].append(summary(run_arm(root / f"seed-{seed}" / arm, base, arm, seed, args, args.steps, args.lr),
                                        args.group))
            print(f"seed {seed} {arm}: {time.time() - started:.0f} s", flush=True)

    def distribution(runs: list[dict]) -> str:
        lengths = sorted(x for r in runs for x in r["lengths"])
        pick = lambda q: lengths[min(len(lengths) - 1, int(q * len(lengths)))]  # noqa: E731
        return (f"{len(lengths)} completions: p50 {pick(0.5)} / p90 {pick(0.9)} / max {lengths[-1]} "
                f"(mean {sum(lengths) / len(lengths):.1f})")

    print(f"\n{args.seeds} seeds, {args.prompts} groups of {args.group} per step, max {args.max_tokens} tokens, "
          f"over-provision {args.over_provision}")
    print(f"one decoding step: {cost[widths[0]] * 1e3:.2f} ms at batch {widths[0]}, {cost[widths[1]] * 1e3:.2f} ms at "
          f"batch {widths[1]} (ratio {cost[widths[1]] / cost[widths[0]]:.2f}x)")
    print(f"\n1. rollout throughput at a fixed policy ({args.fixed_steps} steps at learning rate 0)")
    print(f"completion length (tokens, sync arm): {distribution(fixed['sync'])}")
    print("| arm | tokens / generation s | groups / generation s | tokens / step s | groups / step s |\n|---|---|---|---|---|")
    for arm, rs in fixed.items():
        print(f"| {arm} | {cell([r['tokens_per_gen_s'] for r in rs], 0)} | {cell([r['groups_per_gen_s'] for r in rs], 2)} | "
              f"{cell([r['tokens_per_step_s'] for r in rs], 0)} | {cell([r['groups_per_step_s'] for r in rs], 2)} |")
    for key in ("tokens_per_gen_s", "groups_per_gen_s", "tokens_per_step_s", "groups_per_step_s"):
        ratios = [p[key] / s[key] for p, s in zip(fixed["partial"], fixed["sync"])]
        print(f"- partial / sync {key}: {cell(ratios, 2)}")
    print(f"\n2. training, {args.steps} steps at learning rate {args.lr}")
    print(f"completion length (tokens, sync arm, whole run): {distribution(results['sync'])}")
    print("\nmean ± s.e. over seeds [per seed]")
    print("| arm | tokens / generation s | groups / generation s | tokens / step s | late reward | off-policy tokens |")
    print("|---|---|---|---|---|---|")
    for arm, rs in results.items():
        print(f"| {arm} | {cell([r['tokens_per_gen_s'] for r in rs], 0)} | {cell([r['groups_per_gen_s'] for r in rs], 2)} | "
              f"{cell([r['tokens_per_step_s'] for r in rs], 0)} | {cell([r['late_reward'] for r in rs])} | "
              f"{cell([r['off_policy'] for r in rs], 2)} |")
    print("\nratios to sync, per seed (same run):")
    for arm in arms[1:]:
        for key in ("tokens_per_gen_s", "groups_per_gen_s", "tokens_per_step_s", "groups_per_step_s"):
            ratios = [p[key] / s[key] for p, s in zip(results[arm], results["sync"])]
            print(f"- {arm} {key}: {cell(ratios, 2)}")
    width = max(1, args.steps // 4)
    print(f"\nreward by window of {width} steps ({width * args.prompts * args.group} completions each), mean over seeds")
    for arm, rs in results.items():
        windows = [[sum(r["rewards"][i:i + width]) / width for i in range(0, args.steps - width + 1, width)] for r in rs]
        print(f"- {arm}: " + ", ".join(f"{sum(w[i] for w in windows) / len(windows):.3f}" for i in range(len(windows[0]))))


if __name__ == "__main__":
    main()
