"""GRPO step time split into generation, reward scoring and optimisation, for code tasks at G = 8.

    python benchmarks/grpo_step.py [--tasks HumanEval.jsonl.gz --format humaneval] [--steps 6]
        [--workers 4] [--completion-tokens 128] [--model tiny:chatml]

Runs the real stage (``build_trainer``: ``RlTrainer``, its scorer, the sandbox pool) on a
tiny random model. A random model writes no runnable code, so its completions would all stop at
"no code block" and cost the sandbox nothing; to time the reward a trained model costs, each
completion is scored as the task's reference solution (a distinct comment per completion, so the
sandbox's result cache never answers). Every test of every completion then really runs.

Reported per step (first step dropped as warm-up): wall time, generation, reward, optimisation
(= wall - generation - reward: the log-prob forward, backward and optimiser step), and reward as
a fraction of the step (goal: <= 10%). Baseline measured in the same run: the same batch scored
with a one-worker pool (serial sandbox), against the configured pool.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from molrl.rl.config import RlConfig, TaskSource, rl_lora, rl_sampling, rl_train
from molrl.rl.run import build_trainer
from molrl.tasks import JsonlSpec, Task, TestCase

BUILT_IN = [  # used when no task file is given: small functions with call tests and references
    Task(id=f"b{i}", prompt=prompt, kind="code", entry_point=name, reference=ref,
         tests=[TestCase("call", args=list(a), expected=e) for a, e in cases])
    for i, (name, prompt, ref, cases) in enumerate([
        ("add", "Return a + b.", "def add(a, b):\n    return a + b", [((1, 2), 3), ((-1, 1), 0), ((5, 5), 10)]),
        ("rev", "Reverse a string.", "def rev(s):\n    return s[::-1]", [(("ab",), "ba"), (("",), ""), (("xyz",), "zyx")]),
        ("fib", "n-th Fibonacci number.", "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
         "    return a", [((0,), 0), ((10,), 55), ((20,), 6765)]),
        ("primes", "Primes below n.", "def primes(n):\n    return [p for p in range(2, n) if all(p % q for q in "
         "range(2, int(p ** 0.5) + 1))]", [((10,), [2, 3, 5, 7]), ((2,), []), ((20,), [2, 3, 5, 7, 11, 13, 17, 19])]),
    ])
]


class ReferenceCompletions:
    """Grades each row's reference solution in place of the model's text (see the module docstring)."""

    def __init__(self, scorer, references: dict[str, str]):
        self.scorer = scorer
        self.references = references  # for tasks whose file carries no reference (the built-in JSONL)
        self.real_score = scorer.score
        self.counter = itertools.count()

    def __call__(self, tasks, completions):
        subs = [f"```python\n{t.reference or self.references[t.id]}\n# sample {next(self.counter)}\n```" for t in tasks]
        return self.real_score(tasks, subs)


class StepTimer(TrainerCallback):
    """Wall-clock time of every optimiser step."""

    def __init__(self):
        self.times: list[float] = []
        self._start = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self._start)


def task_source(args, tmp: Path) -> TaskSource:
    if args.tasks:
        return TaskSource(path=Path(args.tasks), format=args.format, limit=args.limit)
    path = tmp / "tasks.jsonl"
    path.write_text("\n".join(json_line(t) for t in BUILT_IN) + "\n")
    return TaskSource(path=path, format="jsonl", spec=JsonlSpec(kind="code"))


def json_line(task: Task) -> str:
    import json

    return json.dumps({"id": task.id, "prompt": task.prompt, "entry_point": task.entry_point,
                       "tests": [{"kind": "call", "args": t.args, "expected": t.expected} for t in task.tests]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", help="code task file (HumanEval/MBPP/JSONL); default: four built-in tasks")
    parser.add_argument("--format", default="humaneval")
    parser.add_argument("--limit", type=int, default=32)
    parser.add_argument("--model", default="tiny:chatml")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--completion-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        cfg = RlConfig(output_dir=Path(tmp) / "run", model=args.model,
                       lora=rl_lora(rank=64, alpha=128), data=task_source(args, Path(tmp)),
                       sampling=rl_sampling(n=8, max_new_tokens=args.completion_tokens), max_prompt_length=4096,
                       train=rl_train(learning_rate=1e-4, max_steps=args.steps, micro_batch_size=8,
                                           save_steps=10_000))
        cfg.sandbox.workers = args.workers
        trainer, _, pool = build_trainer(cfg)
        trainer.scorer.score = ReferenceCompletions(trainer.scorer, {t.id: t.reference for t in BUILT_IN})
        timer = StepTimer()
        trainer.add_callback(timer)
        try:
            trainer.train()
            rows = [r for r in trainer.state.log_history if "time/reward_s" in r]
            report(args, cfg, timer.times, rows)
            serial_baseline(trainer, pool, args)
        finally:
            pool.close()


def report(args, cfg, wall: list[float], rows: list[dict]) -> None:
    wall, rows = wall[1:], rows[1:]  # drop the warm-up step
    gen = [r["time/generation_s"] for r in rows]
    rew = [r["time/reward_s"] for r in rows]
    opt = [w - g - r for w, g, r in zip(wall, gen, rew)]
    mean = statistics.mean
    print(f"model {args.model}, G = {cfg.sampling.n}, {args.completion_tokens} new tokens, "
          f"{args.workers} sandbox workers, {len(wall)} measured steps, torch threads {args.threads}")
    print(f"{'':14s}{'mean s':>9s}{'median s':>10s}{'share':>8s}")
    for name, xs in (("step (wall)", wall), ("generation", gen), ("reward", rew), ("optimisation", opt)):
        print(f"{name:14s}{mean(xs):9.3f}{statistics.median(xs):10.3f}{mean(xs) / mean(wall):8.1%}")
    print(f"reward / step = {mean(rew) / mean(wall):.1%} (goal <= 10%)")
    stages = {k.split("/", 1)[1]: mean(r.get(k, 0.0) for r in rows) for k in rows[-1] if k.startswith("reward_stage/")}
    print("graded stages:", ", ".join(f"{k} {v:.0%}" for k, v in sorted(stages.items())))


def serial_baseline(trainer, pool, args) -> None:
    """One batch of 8 scored with the configured pool and with a one-worker pool."""
    from molrl.sandbox import SandboxConfig, SandboxPool

    scorer = trainer.scorer
    tasks = [Task.from_json(trainer.train_dataset[i]["task_json"]) for i in range(min(8, len(trainer.train_dataset)))]

    def timed() -> float:
        start = time.perf_counter()
        scorer.score(tasks, [""] * len(tasks))
        return time.perf_counter() - start

    parallel = timed()
    with SandboxPool(SandboxConfig(workers=1, timeout_s=pool.cfg.timeout_s)) as serial_pool:
        scorer.pool = serial_pool
        serial = timed()
        scorer.pool = pool
    print(f"8 completions scored: {args.workers} workers {parallel:.3f} s, 1 worker {serial:.3f} s "
          f"(parallel / serial = {parallel / serial:.2f})")


if __name__ == "__main__":
    main()
