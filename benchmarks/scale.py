"""The engine server tier on this machine's CPUs: every rollout kind on local ``molrl serve`` servers, and what an
RL step costs on each engine path.

    python benchmarks/scale.py --model runs/smollm2/model --mbpp ../shared/data/mbpp/mbpp.jsonl \\
        --servers http://127.0.0.1:8101 http://127.0.0.1:8102 [--out runs/scale] [--rounds 2] [--only runs|cost]

The servers are started beforehand, each on a core of its own (vLLM's CPU backend binds every server to the same
core unless told otherwise):

    VLLM_CPU_OMP_THREADS_BIND=0 molrl serve --model runs/smollm2/model --port 8101 --max-lora-rank 16 --memory 0.08 &
    VLLM_CPU_OMP_THREADS_BIND=1 molrl serve --model runs/smollm2/model --port 8102 --max-lora-rank 16 --memory 0.08 &

Part ``runs``, each once, on both servers (``engine=vllm_server``):
- ``multiturn``: multi-turn RL on MBPP tasks (2 turns: run the code in the sandbox, read the output, answer), 2 steps;
- ``partial``: partial rollouts (APRIL, over-provisioned 2x) on the toy task, 2 steps;
- ``one_step_off``: ``rollout.max_staleness=1``, 3 steps, logging ``rollout/staleness`` and ``rollout/mismatch_kl``
  (skipped, with the reason recorded, where this molrl has no such key);
- ``moving``: a learning rate high enough that the adapter moves (``beta`` small but above 0, so ``kl``, the
  policy's KL to the base, is logged as the measure of how far), with ``rollout/mismatch_kl`` every step.

Part ``cost``, interleaved rounds (each round runs every arm once, in turn, so load from anything else on the machine
falls on all arms alike): one trainer process, the toy task, 4 steps, on the in-process vLLM engine (``engine=vllm``),
1 server, 2 servers, and 2 servers one step off. Reported per arm: the mean step time over steps 2 on (step 1 holds
the first sync and warm-up) and its ratio to the in-process engine's within the same round, ``mismatch_kl`` and
``engine_logp_gap``; with the machine's load average at each run's start and end.

Resumable: each run lives in OUT/<part>/<name>, and one whose metrics hold every step is read back, not run again.
Results: OUT/scale.json, and the report printed and written to OUT/scale.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOY = ["data.format=toy", "algorithm=dr_grpo", "sampling.n=8", "sampling.temperature=1.0", "prompts_per_step=1",
       "lora.rank=8", "lora.alpha=16", "train.micro_batch_size=8", "train.learning_rate=1e-4", "train.save_steps=100",
       "train.report_to=[]", "sandbox.workers=1", "eval.every_steps=0"]
"""The toy task at tiny settings (reward: the fraction of lowercase letters): 8 completions a step."""


def rl_args(model: str, out: Path, steps: int, engine: list[str], extra: list[str]) -> list[str]:
    """``molrl rl``'s arguments for one run."""
    return ["rl", "--config", str(REPO / "configs/rl_tiny.yaml"), f"model.path={model}", f"output_dir={out}",
            f"train.max_steps={steps}", *TOY, *engine, *extra]


def servers_engine(urls: list[str], out: Path) -> list[str]:
    """The overrides that put the run's rollouts on ``urls``."""
    return ["engine=vllm_server", f"engine_servers=[{','.join(urls)}]", f"engine_sync_dir={out / 'engine_sync'}"]


def staleness_missing() -> str | None:
    """None when this molrl's RL config has ``rollout.max_staleness``; else why the one-step-off runs are skipped."""
    from molrl.rl.config import RlConfig

    if hasattr(RlConfig().rollout, "max_staleness"):
        return None
    return "this molrl's rollout settings have no max_staleness"


def read_metrics(out: Path) -> list[dict]:
    """The per-step rows of a run's metrics.jsonl (empty when it has none)."""
    path = out / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [r for r in rows if "step_time" in r]


def run(name: str, args: list[str], out: Path, steps: int) -> dict:
    """One ``molrl rl`` run (read back when its metrics hold every step): its per-step rows, wall seconds and the
    load average at its start and end."""
    record = out.parent / f"{out.name}.json"
    if record.is_file() and len(read_metrics(out)) >= steps:
        return json.loads(record.read_text())
    print(f"scale: {name} ...", flush=True)
    load_start, start = os.getloadavg(), time.time()
    log = out.parent / f"{out.name}.log"
    out.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "molrl.cli", *args], capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false"))
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:  # recorded, not kept: a re-run tries it again
        print(f"scale: {name} failed (log {log}):\n{done.stderr[-1500:]}", flush=True)
        return {"name": name, "failed": done.stderr.strip().splitlines()[-1][:300] if done.stderr.strip() else "?"}
    result = {"name": name, "args": args, "wall_s": time.time() - start, "load_start": load_start,
              "load_end": os.getloadavg(), "steps": read_metrics(out)}
    record.write_text(json.dumps(result, indent=1))
    return result


def step_cost(result: dict) -> float:
    """Mean step time over steps 2 on (step 1 holds the first sync and warm-up)."""
    times = [r["step_time"] for r in result["steps"][1:]] or [r["step_time"] for r in result["steps"]]
    return statistics.mean(times)


def per_step(result: dict, key: str) -> list[float | None]:
    """``key``'s value at each step (None where a step did not log it)."""
    return [r.get(key) for r in result["steps"]]


def done_when_runs(args: argparse.Namespace, out: Path) -> dict:
    """The four runs on both servers: multi-turn, partial, one-step-off, a moving adapter."""
    mbpp = ["data.format=mbpp", f"data.path={args.mbpp}", "data.limit=8", "sampling.n=4", "train.micro_batch_size=4",
            "sampling.max_new_tokens=400", "episode.max_turns=2", "episode.turn_tokens=160"]
    runs = {
        "multiturn": (2, mbpp),
        "partial": (2, ["rollout.partial=true", "rollout.over_provision=2", "sampling.max_new_tokens=48"]),
        "one_step_off": (3, ["rollout.max_staleness=1", "sampling.max_new_tokens=32"]),
        "moving": (5, ["train.learning_rate=5e-3", "beta=0.001", "sampling.max_new_tokens=32"]),
    }
    results: dict = {}
    for name, (steps, extra) in runs.items():
        missing = staleness_missing() if name == "one_step_off" else None
        if missing:
            results[name] = {"skipped": missing}
            continue
        folder = out / "runs" / name
        results[name] = run(name, rl_args(args.model, folder, steps, servers_engine(args.servers, folder), extra),
                            folder, steps)
    return results


def cost_rounds(args: argparse.Namespace, out: Path) -> dict:
    """The step-cost arms, interleaved over ``args.rounds`` rounds."""
    arms = {
        "in_process": ["engine=vllm", "engine_gpu_memory_utilization=0.08"],
        "server_1": servers_engine(args.servers[:1], Path("{out}")),
        "server_2": servers_engine(args.servers, Path("{out}")),
        "server_2_one_step_off": servers_engine(args.servers, Path("{out}")) + ["rollout.max_staleness=1"],
    }
    missing = staleness_missing()
    rounds: list[dict] = []
    for r in range(args.rounds):
        row: dict = {}
        for name, engine in arms.items():
            if name.endswith("one_step_off") and missing:
                row[name] = {"skipped": missing}
                continue
            folder = out / "cost" / f"round{r}" / name
            engine = [x.replace("{out}", str(folder)) for x in engine]
            row[name] = run(f"round {r} {name}", rl_args(args.model, folder, args.cost_steps, engine,
                                                          ["sampling.max_new_tokens=48"]), folder, args.cost_steps)
        rounds.append(row)
    return {"rounds": rounds}


def fmt(values: list[float | None], spec: str = ".2g") -> str:
    return ", ".join("-" if v is None else format(v, spec) for v in values)


def report(results: dict) -> str:
    """The markdown report of ``results``."""
    lines = [f"Machine: {results['machine']}", "", "| run | steps | reward per step | mismatch_kl per step | "
             "engine_logp_gap per step | other |", "|---|---|---|---|---|---|"]
    for name, res in results.get("runs", {}).items():
        if "skipped" in res or "failed" in res:
            why = f"not run: {res['skipped']}" if "skipped" in res else f"failed: {res['failed']}"
            lines.append(f"| {name} | {why} | | | | |")
            continue
        other = []
        if name == "one_step_off":
            other.append(f"staleness {fmt(per_step(res, 'rollout/staleness'))}")
        if name == "moving":
            other.append(f"KL to the base {fmt(per_step(res, 'kl'))}")
        if name == "partial":
            other.append(f"generation s {fmt(per_step(res, 'time/generation_s'), '.1f')}")
        lines.append(f"| {name} | {len(res['steps'])} | {fmt(per_step(res, 'reward'), '.3f')} | "
                     f"{fmt(per_step(res, 'rollout/mismatch_kl'))} | {fmt(per_step(res, 'rollout/engine_logp_gap'))} "
                     f"| {'; '.join(other)} |")
    rounds = results.get("cost", {}).get("rounds", [])
    if rounds:
        arms = list(rounds[0])
        lines += ["", "| arm | step s (steps 2 on), per round | ratio to in-process, per round | mean ratio | "
                  "generation s a step (steps 2 on) | mismatch_kl (mean) | engine_logp_gap (mean) | "
                  "load avg start-end |", "|---|---|---|---|---|---|---|---|"]
        for arm in arms:
            cells = [row[arm] for row in rounds]
            broken = [c for c in [*cells, *(row["in_process"] for row in rounds)] if "skipped" in c or "failed" in c]
            if broken:
                why = broken[0].get("skipped") or broken[0].get("failed")
                lines.append(f"| {arm} | not measured: {why} | | | | | | |")
                continue
            costs = [step_cost(c) for c in cells]
            ratios = [step_cost(c) / step_cost(row["in_process"]) for c, row in zip(cells, rounds)]
            kls = [statistics.mean(x for x in per_step(c, "rollout/mismatch_kl") if x is not None) for c in cells]
            gaps = [statistics.mean(x for x in per_step(c, "rollout/engine_logp_gap") if x is not None) for c in cells]
            generation = [statistics.mean(x for x in per_step(c, "time/generation_s")[1:] if x is not None)
                          for c in cells]
            loads = "; ".join(f"{c['load_start'][0]:.1f}-{c['load_end'][0]:.1f}" for c in cells)
            lines.append(f"| {arm} | {fmt(costs, '.1f')} | {fmt(ratios, '.2f')} | {statistics.mean(ratios):.2f} | "
                         f"{fmt(generation, '.1f')} | {statistics.mean(kls):.2g} | {statistics.mean(gaps):.2g} | {loads} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="the base the servers hold")
    parser.add_argument("--servers", nargs="+", required=True, help="the servers' URLs (2 for every part)")
    parser.add_argument("--mbpp", type=Path, required=True, help="MBPP's jsonl (the multi-turn run's tasks)")
    parser.add_argument("--out", type=Path, default=REPO / "runs/scale")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the step-cost arms")
    parser.add_argument("--cost-steps", type=int, default=4, help="steps of each step-cost run")
    parser.add_argument("--only", choices=["runs", "cost"], help="one part only")
    args = parser.parse_args()
    if len(args.servers) < 2:
        parser.error("--servers: give 2 (the runs use both; the cost arms 1 and 2)")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "scale.json"
    results = json.loads(path.read_text()) if path.is_file() else {}
    results["machine"] = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    start = time.time()
    if args.only in (None, "runs"):
        results["runs"] = done_when_runs(args, args.out)
        path.write_text(json.dumps(results, indent=1))
    if args.only in (None, "cost"):
        results["cost"] = cost_rounds(args, args.out)
        path.write_text(json.dumps(results, indent=1))
    results.setdefault("wall_s", {})[args.only or "all"] = time.time() - start
    path.write_text(json.dumps(results, indent=1))
    text = report(results)
    (args.out / "scale.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
