"""Sandbox speed: pool vs a fresh interpreter per task, deadline-to-reaped latency, reward throughput; with
``--tier``, the local pool against 1 and 2 ``molrl sandbox serve`` on this host.

    python benchmarks/sandbox_bench.py [--n 200] [--workers 2]
    python benchmarks/sandbox_bench.py --tier [--n 200] [--workers 4] [--rounds 3] [--step-s 32.1]

Baselines are measured in the same run with the same parallelism (one thread per worker):
``python -c CODE`` per task (no isolation at all), and ``bwrap ... python -c CODE`` per task (a
fresh sandboxed interpreter). Goals: pool >= 3x the ``python -c`` baseline; deadline-to-reaped
< 50 ms.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from molrl.graders.code import CodeRewardConfig
from molrl.rewards import CodeReward
from molrl.sandbox import SandboxConfig, SandboxPool
from molrl.sandbox.command import THREAD_ENV, bwrap_command
from molrl.sandbox.runtime.cleanup import descendants
from molrl.tasks import Task, TestCase

SNIPPETS = {
    "trivial": "x = {i}\nprint(x * 2)",
    "numpy": "import numpy as np\nprint(np.arange({i} + 10).sum())",
}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _worker_cpu(pool: SandboxPool) -> float:
    """CPU seconds used so far by the pool's worker processes and everything they reaped."""
    total = 0
    for slot in getattr(pool.backend, "slots", []):  # a remote pool's work is the servers': not counted here
        pids = [slot.proc.pid, *(descendants(slot.proc.pid) or ())]
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / os.sysconf("SC_CLK_TCK")


def fresh_run(codes: list[str], workers: int, prefix: list[str]) -> tuple[float, float]:
    """(executions/s, CPU ms per execution) with one new interpreter per snippet."""
    env = {"PATH": "/usr/bin:/bin", **THREAD_ENV}

    def one(code: str) -> None:
        subprocess.run(prefix + [sys.executable, "-c", code], capture_output=True, env=env, timeout=60, check=True)

    cpu, start = _children_cpu(), time.perf_counter()
    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(one, codes))
    elapsed = time.perf_counter() - start
    return len(codes) / elapsed, (_children_cpu() - cpu) * 1000 / len(codes)


def pool_run(pool: SandboxPool, codes: list[str]) -> tuple[float, float]:
    """(executions/s, CPU ms per execution in the workers) for the pool."""
    cpu, start = _worker_cpu(pool), time.perf_counter()
    results = pool.run_many(codes)
    elapsed = time.perf_counter() - start
    bad = [r.status for r in results if r.status != "ok"]
    assert not bad, f"pool runs failed: {bad[:3]}"
    return len(codes) / elapsed, (_worker_cpu(pool) - cpu) * 1000 / len(codes)


def compare(pool: SandboxPool, template: str, n: int, workers: int, rounds: int) -> dict[str, list]:
    """Interleaved rounds of pool / python -c / bwrap+python, so load changes hit all three."""
    rows: dict[str, list] = {"pool": [], "python -c": [], "bwrap+python -c": []}
    for r in range(rounds):
        codes = [template.format(i=r * n + i) for i in range(n)]
        few = codes[: max(workers * 4, n // 4)]
        rows["pool"].append(pool_run(pool, codes))
        rows["python -c"].append(fresh_run(few, workers, []))
        rows["bwrap+python -c"].append(fresh_run(few, workers, bwrap_command(pool.cfg)))
    return rows


def reap_latency(pool: SandboxPool, runs: int) -> tuple[list[float], list[float]]:
    """(worker-side deadline->reaped ms, caller-side overshoot ms) for an infinite loop, 0.2 s limit."""
    inside, outside = [], []
    for i in range(runs):
        start = time.perf_counter()
        result = pool.run(f"# {i}\nwhile True:\n    pass", timeout_s=0.2)
        outside.append((time.perf_counter() - start - 0.2) * 1000)
        assert result.status == "timeout"
        inside.append(result.info["reap_ms"])
    return inside, outside


def reward_throughput(pool: SandboxPool, judged: bool) -> float:
    """Completions per second for a GRPO-sized batch: 64 completions x 3 tests, all distinct."""
    if judged:
        tests = [TestCase("assert", source=f"assert abs(sq({n}) - {n * n}) < 1e-9") for n in (2, 3, 4)]
    else:
        tests = [TestCase("call", args=[n], expected=n * n) for n in (2, 3, 4)]
    task = Task(id="sq", prompt="", kind="code", entry_point="sq", tests=tests)
    completions = [f"```python\ndef sq(x):\n    # variant {i}\n    return x * x if {i % 4} else x + x\n```" for i in range(64)]
    reward = CodeReward(pool, CodeRewardConfig())
    start = time.perf_counter()
    scores = reward([""] * 64, completions, task_json=[task.to_json()] * 64)
    elapsed = time.perf_counter() - start
    assert len(scores) == 64 and 0 < sum(s == 1.0 for s in scores) < 64
    return 64 / elapsed


def _serve(slots: int) -> tuple[subprocess.Popen, str]:
    """A ``molrl sandbox serve`` on a free port with ``slots`` slots, and its URL once it answers."""
    proc = subprocess.Popen([sys.executable, "-m", "molrl.cli", "sandbox", "serve", "--port", "0", "--workers",
                             str(slots)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if "molrl sandbox server on" not in line:
        raise SystemExit(f"molrl sandbox serve did not start: {line!r}")
    return proc, line.split()[4]


def mbpp_batch(data: str) -> tuple[list[Task], list[str]]:
    """A GRPO-sized reward batch of real MBPP tasks: 8 tasks x 8 completions, half the reference, half wrong."""
    from molrl.tasks import load_tasks

    tasks = load_tasks(data, "mbpp", limit=8)
    rows, completions = [], []
    for task in tasks:
        for i in range(8):
            body = task.reference if i % 2 == 0 else f"def {task.entry_point}(*args):\n    return {i}"
            rows.append(task)
            completions.append(f"```python\n{body}\n# sample {i}\n```")
    return rows, completions


def tier(args: argparse.Namespace) -> None:
    """Executions a second, one request's latency and a reward batch's time: the local pool, 1 server, 2 servers
    (all with the same slots in all), and 1 server through its run_code endpoint (each job in the harness), in
    interleaved rounds."""
    from molrl.tasks.grade import grade

    slots = args.workers or 4
    procs = []
    try:
        one = _serve(slots)
        two = [_serve(max(slots // 2, 1)) for _ in range(2)]
        procs = [one[0], *(p for p, _ in two)]
        arms = {"local": SandboxConfig(workers=slots, cache_size=0),
                "1 server": SandboxConfig(backend="remote", servers=[one[1]], cache_size=0),
                "2 servers": SandboxConfig(backend="remote", servers=[u for _, u in two], cache_size=0),
                "1 server, run_code": SandboxConfig(backend="remote", servers=[one[1]], protocol="run_code",
                                                    cache_size=0)}
        pools = {name: SandboxPool(cfg) for name, cfg in arms.items()}
        tasks, completions = mbpp_batch(args.mbpp) if args.mbpp else ([], [])
        rate: dict[str, list[float]] = {k: [] for k in arms}
        latency: dict[str, list[float]] = {k: [] for k in arms}
        reward: dict[str, list[float]] = {k: [] for k in arms}
        for name, pool in pools.items():
            pool_run(pool, [f"print({i})" for i in range(20)])  # warm-up
        for r in range(args.rounds):
            for name, pool in pools.items():
                codes = [SNIPPETS["trivial"].format(i=i + 1000 * r) for i in range(args.n)]
                rate[name].append(pool_run(pool, codes)[0])
                times = []
                for i in range(20):
                    start = time.perf_counter()
                    pool.run(f"print({i} + {r})")
                    times.append((time.perf_counter() - start) * 1000)
                latency[name].append(statistics.median(times))
                if tasks:
                    start = time.perf_counter()
                    grades = grade(tasks, [c + f"\n# round {r}" for c in completions], pool, CodeRewardConfig())
                    reward[name].append(time.perf_counter() - start)
                    assert sum(g.score == 1.0 for g in grades) == 32, [g.stage for g in grades]
        for pool in pools.values():
            pool.close()
        print(f"{slots} slots in all on {os.cpu_count()} cores; {args.rounds} interleaved rounds of {args.n} snippets")
        for name in arms:
            line = f"{name:18s} {statistics.median(rate[name]):7.1f} exec/s [{', '.join(f'{x:.1f}' for x in rate[name])}]"
            line += f" | one request {statistics.median(latency[name]):6.2f} ms"
            if tasks:
                line += f" | 64 MBPP completions graded in {statistics.median(reward[name]):.2f} s"
            if name != "local":
                ratios = [a / b for a, b in zip(rate[name], rate["local"])]
                line += (f" | throughput / local {statistics.median(ratios):.2f}x [{', '.join(f'{x:.2f}' for x in ratios)}]"
                         f", latency added {statistics.median(latency[name]) - statistics.median(latency['local']):+.2f} ms")
            print(line)
        if tasks:
            for name in arms:
                r_s = statistics.median(reward[name])
                print(f"reward share of a {args.step_s:.1f} s step whose other work is unchanged: {name} "
                      f"{r_s / (args.step_s - statistics.median(reward['local']) + r_s):.3f}")
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=200, help="snippets per pool measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved measurement rounds")
    parser.add_argument("--workers", type=int, default=0, help="pool workers and baseline threads (0: pool default)")
    parser.add_argument("--tier", action="store_true", help="the local pool against 1 and 2 molrl sandbox serve")
    parser.add_argument("--mbpp", default="", help="MBPP's mbpp.jsonl, for --tier's reward batch (none: skipped)")
    parser.add_argument("--step-s", type=float, default=32.1,
                        help="the RL step the reward share is figured for (default: SmolLM2 single-turn GRPO, RESULTS)")
    args = parser.parse_args()
    if args.tier:
        tier(args)
        return
    cfg = SandboxConfig(workers=args.workers, cache_size=0)
    start = time.perf_counter()
    with SandboxPool(cfg) as pool:
        workers = len(pool.backend.slots)
        print(f"pool: {workers} workers on {os.cpu_count()} cores, backend {pool.backend.name}, "
              f"started in {time.perf_counter() - start:.2f} s; baselines use {workers} threads")
        pool_run(pool, [f"print({i})" for i in range(20)])  # warm-up
        for name, template in SNIPPETS.items():
            rows = compare(pool, template, args.n, workers, args.rounds)
            med = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v)) for k, v in rows.items()}
            ratios = [p[0] / f[0] for p, f in zip(rows["pool"], rows["python -c"])]
            # bwrap's pid namespace hides its descendants' CPU from RUSAGE_CHILDREN: rate only there
            print(f"{name:8s} " + " | ".join(
                f"{k} {rate:7.1f} exec/s" + (f", {cpu:5.1f} CPU-ms/exec" if k != "bwrap+python -c" else "")
                for k, (rate, cpu) in med.items()))
            print(f"{'':8s} pool / python -c: {statistics.median(ratios):.1f}x throughput (rounds: "
                  f"{', '.join(f'{x:.1f}' for x in ratios)}), {med['python -c'][1] / med['pool'][1]:.1f}x less CPU; "
                  f"pool / bwrap+python -c: {med['pool'][0] / med['bwrap+python -c'][0]:.1f}x  (goal >= 3x)")
        inside, outside = reap_latency(pool, 20)
        q = statistics.quantiles
        print(f"deadline->reaped (worker clock): median {statistics.median(inside):.2f} ms, p95 {q(inside, n=20)[-1]:.2f} ms, "
              f"max {max(inside):.2f} ms (goal < 50 ms) | result in caller after deadline: median "
              f"{statistics.median(outside):.1f} ms, max {max(outside):.1f} ms")
        for judged in (False, True):
            rate = reward_throughput(pool, judged)
            kind = "assert tests (judge process)" if judged else "call tests"
            print(f"reward 64 completions x 3 {kind}: {rate:.1f} completions/s ({64 / rate:.2f} s per batch)")


if __name__ == "__main__":
    main()
