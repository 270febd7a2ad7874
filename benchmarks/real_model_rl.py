"""RL on a real pretrained model (SmolLM2-135M-Instruct): GRPO from the base and from a MoL adapter, easy MBPP.

The easiest MBPP tasks (the shortest reference solutions, none of them in the MINT traces the MoL adapter learnt
from) are split into a training and a held-out set. Four models are scored on the held-out set with single-turn
``molrl eval`` (its default sampling: one answer per task at temperature 0.7, top-p 0.8; no execution at
test time; the table gives the binomial standard error): the base, base + GRPO, the MoL adapter, MoL + GRPO. The GRPO
runs are ``molrl rl`` with rewards from running the code in the sandbox on the task's tests (staged partial
credit: no code < compile error < runtime error < tests passed); their reward curves come from metrics.jsonl.
One seed: a single run per arm, as stated in the report.

    python benchmarks/real_model_rl.py --model runs/real_model/model \\
        --mol-adapter runs/real_model/seed0/mol/adapter --mbpp ../shared/data/mbpp/mbpp.jsonl \\
        --mint ../shared/data/traces/mint

Resumable: each run and evaluation lives under OUT (default runs/real_model_rl) and a finished one is reused
(``molrl rl`` and ``molrl eval`` do not train or score again). The report is OUT/report.md and OUT/rl.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from real_model import normalised  # benchmarks/real_model.py: the same rule for text in MINT

REPO = Path(__file__).resolve().parents[1]
RL = ["algorithm=grpo", "sampling.n=4", "prompts_per_step=1", "sampling.max_new_tokens=128", "sampling.temperature=1.0",
      "lora.rank=16", "lora.alpha=32", "train.learning_rate=2e-4", "train.micro_batch_size=4", "train.save_steps=10",
      "train.report_to=[]", "sandbox.workers=1", "threads=1", "data.format=mbpp"]


def easy_split(mbpp: Path, mint: Path, out: Path, count: int, held: int) -> tuple[Path, Path]:
    """The ``count`` MBPP tasks with the shortest reference code whose text is in no MINT trace, split (seed 0) into
    train.jsonl and held_out.jsonl (``held`` tasks), as MBPP records."""
    train_file, held_file = out / "train.jsonl", out / "held_out.jsonl"
    if train_file.is_file() and held_file.is_file():
        return train_file, held_file
    mint_text = normalised("\n".join(f.read_text() for f in sorted(mint.glob("*.jsonl"))))
    records = [json.loads(x) for x in mbpp.read_text().splitlines() if x.strip()]
    fresh = [r for r in records if normalised(r["text"])[:60] not in mint_text]
    easy = sorted(fresh, key=lambda r: (len(r["code"]), r["task_id"]))[:count]
    random.Random(0).shuffle(easy)
    out.mkdir(parents=True, exist_ok=True)
    held_file.write_text("".join(json.dumps(r) + "\n" for r in easy[:held]))
    train_file.write_text("".join(json.dumps(r) + "\n" for r in easy[held:]))
    return train_file, held_file


def molrl(args: list[str], log: Path) -> float:
    """One molrl command, one torch thread; its wall seconds (stops the benchmark with the log's tail on failure)."""
    start = time.time()
    done = subprocess.run([sys.executable, "-m", "molrl.cli", *map(str, args)], capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"molrl {' '.join(map(str, args[:1]))} failed ({log}):\n{done.stderr[-3000:]}")
    return time.time() - start


def evaluate(model: str, adapter: Path | None, held: Path, out: Path, new_tokens: int) -> dict:
    """Single-turn pass@1 on the held-out tasks (reused when its results.json exists)."""
    results, timing = out / "results.json", out.parent / f"{out.name}.seconds"
    if not results.is_file():
        args = ["eval", "--model", model, "--benchmarks", "mbpp", "--data", f"mbpp={held}", "--max-new-tokens",
                new_tokens, "--out", out]
        timing.write_text(str(molrl(args + (["--adapter", adapter] if adapter else []), out.parent / f"{out.name}.log")))
    seconds = float(timing.read_text()) if timing.is_file() else 0.0
    score = json.loads(results.read_text())["benchmarks"]["mbpp"]
    return {"pass@1": score["pass@1"], "n": score["problems"], "truncated": score.get("truncated", 0.0),
            "eval_s": seconds}


def train(model: str, adapter: Path | None, train_file: Path, out: Path, steps: int) -> dict:
    """``molrl rl`` (GRPO) for ``steps`` steps; a finished run is a no-op. Returns its wall time and reward curve."""
    args = ["rl", "--config", REPO / "configs/rl_tiny.yaml", f"output_dir={out}", f"model.path={model}",
            f"data.path={train_file}", f"train.max_steps={steps}", *RL]
    if adapter:
        args.append(f"model.adapter={adapter}")
    timing = out.parent / f"{out.name}.seconds"
    if not (out / "adapter").is_dir() or not timing.is_file():  # a finished run is timed once, when it trains
        timing.write_text(str(molrl(args, out.parent / f"{out.name}.log")))
    seconds = float(timing.read_text())
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rewards = {m["step"]: m["reward"] for m in metrics if "reward" in m}
    return {"train_s": seconds, "rewards": [rewards[s] for s in sorted(rewards)]}


def windows(values: list[float], width: int) -> list[str]:
    """Mean of each run of ``width`` consecutive values, as 'steps a-b: m'."""
    return [f"{i + 1}-{min(i + width, len(values))}: {statistics.fmean(values[i:i + width]):.3f}"
            for i in range(0, len(values), width)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the model as a plain transformers directory")
    p.add_argument("--mol-adapter", required=True, help="a MoL adapter on it (benchmarks/real_model.py's seed0/mol)")
    p.add_argument("--mbpp", required=True, help="MBPP's full file (mbpp.jsonl)")
    p.add_argument("--mint", required=True, help="the MINT traces folder (tasks in it are left out)")
    p.add_argument("--out", default="runs/real_model_rl")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--tasks", type=int, default=60, help="easy tasks in all")
    p.add_argument("--held-out", type=int, default=20, help="of them held out")
    p.add_argument("--new-tokens", type=int, default=192, help="most tokens per evaluation answer")
    args = p.parse_args()
    out = Path(args.out)
    train_file, held = easy_split(Path(args.mbpp), Path(args.mint), out / "data", args.tasks, args.held_out)
    mol = Path(args.mol_adapter)
    report: dict = {"date": str(datetime.date.today()), "steps": args.steps, "settings": RL,
                    "tasks": {"train": len(train_file.read_text().splitlines()),
                              "held_out": len(held.read_text().splitlines())}}
    report["base"] = evaluate(args.model, None, held, out / "eval_base", args.new_tokens)
    report["mol"] = evaluate(args.model, mol, held, out / "eval_mol", args.new_tokens)
    for name, start in (("base_grpo", None), ("mol_grpo", mol)):
        report[name] = train(args.model, start, train_file, out / name, args.steps)
        report[name] |= evaluate(args.model, out / name / "adapter", held, out / f"eval_{name}", args.new_tokens)
        write(out, report)
    write(out, report)


def write(out: Path, report: dict) -> None:
    lines = [f"# GRPO on SmolLM2-135M-Instruct, easy MBPP ({report['date']}; one seed)", "",
             f"{report['tasks']['train']} training and {report['tasks']['held_out']} held-out tasks; "
             f"{report['steps']} steps; settings: {' '.join(report['settings'])}.", "",
             "| model | held-out pass@1 | answers cut | reward, mean per 10 steps | train s | eval s |",
             "|---|---|---|---|---|---|"]
    for name in ("base", "base_grpo", "mol", "mol_grpo"):
        if name in report and "pass@1" in report[name]:
            r = report[name]
            curve = "; ".join(windows(r["rewards"], 10)) if "rewards" in r else "-"
            se = (r["pass@1"] * (1 - r["pass@1"]) / r["n"]) ** 0.5
            lines.append(f"| {name} | {r['pass@1']:.3f} ± {se:.3f} (n={r['n']}) | {r['truncated']:.2f} | {curve} | "
                         f"{r.get('train_s', 0):.0f} | "
                         f"{r['eval_s']:.0f} |")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    (out / "rl.json").write_text(json.dumps(report, indent=1))
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
