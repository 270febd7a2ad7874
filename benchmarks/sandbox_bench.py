"""Sandbox speed: pool vs a fresh interpreter per task, deadline-to-reaped latency, reward throughput.

    python benchmarks/sandbox_bench.py [--n 200] [--workers 2]

Baselines are measured in the same run with the same parallelism (one thread per worker):
``python -c CODE`` per task (no isolation at all), and ``bwrap ... python -c CODE`` per task (a
fresh sandboxed interpreter). Goals: pool >= 3x the ``python -c`` baseline; deadline-to-reaped
< 50 ms.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from molrl.graders.code import CodeRewardConfig
from molrl.rewards import CodeReward
from molrl.sandbox import ExecJob, SandboxConfig, SandboxPool
from molrl.sandbox.backend import THREAD_ENV, bwrap_command
from molrl.tasks import Task, TestCase

SNIPPETS = {
    "trivial": "x = {i}\nprint(x * 2)",
    "numpy": "import numpy as np\nprint(np.arange({i} + 10).sum())",
}


def fresh_rate(codes: list[str], workers: int, prefix: list[str]) -> float:
    """Executions per second, one new interpreter per snippet."""
    env = {"PATH": "/usr/bin:/bin", **THREAD_ENV}

    def one(code: str) -> None:
        subprocess.run(prefix + [sys.executable, "-c", code], capture_output=True, env=env, timeout=60, check=True)

    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(one, codes))
    return len(codes) / (time.perf_counter() - start)


def pool_rate(pool: SandboxPool, codes: list[str]) -> float:
    start = time.perf_counter()
    results = pool.run_many(codes)
    elapsed = time.perf_counter() - start
    bad = [r.status for r in results if r.status != "ok"]
    assert not bad, f"pool runs failed: {bad[:3]}"
    return len(codes) / elapsed


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=200, help="snippets per measurement")
    parser.add_argument("--workers", type=int, default=2, help="pool workers and baseline threads")
    args = parser.parse_args()
    cfg = SandboxConfig(workers=args.workers, cache_size=0)
    start = time.perf_counter()
    with SandboxPool(cfg) as pool:
        print(f"pool: {args.workers} workers, backend {pool.backend.name}, started in {time.perf_counter() - start:.2f} s")
        pool_rate(pool, [f"print({i})" for i in range(20)])  # warm-up
        for name, template in SNIPPETS.items():
            codes = [template.format(i=i) for i in range(args.n)]
            pooled = pool_rate(pool, codes)
            n_fresh = max(20, args.n // 4)
            plain = fresh_rate(codes[:n_fresh], args.workers, [])
            boxed = fresh_rate(codes[:n_fresh], args.workers, bwrap_command(cfg))
            print(f"{name:8s} pool {pooled:7.1f} exec/s | fresh python -c {plain:6.1f} exec/s "
                  f"(pool {pooled / plain:4.1f}x) | fresh bwrap+python {boxed:6.1f} exec/s (pool {pooled / boxed:4.1f}x)")
        inside, outside = reap_latency(pool, 20)
        print(f"deadline->reaped (worker clock): median {statistics.median(inside):.2f} ms, max {max(inside):.2f} ms "
              f"(goal < 50 ms) | result in caller after deadline: median {statistics.median(outside):.1f} ms, "
              f"max {max(outside):.1f} ms")
        for judged in (False, True):
            rate = reward_throughput(pool, judged)
            kind = "assert tests (judge process)" if judged else "call tests"
            print(f"reward 64 completions x 3 {kind}: {rate:.1f} completions/s ({64 / rate:.2f} s per batch)")


if __name__ == "__main__":
    main()
