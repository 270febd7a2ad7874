"""The library world's pilot (before any seeds): does the pretrained base leave GRPO room, and a gradient?

For the base as it is (no warm-up), on the world's training tasks: the sampled pass rate of single-turn answers
(held-back tests, no execution while answering) at each temperature, the share with no code, the share of tasks
passed at least once, and the share of groups of 8 expected to carry a gradient (1 - p^8 - (1 - p)^8 from each task's
measured pass rate; the design asks for at least 0.3). Also, per ``lib`` function, how often a passing answer used it
rightly, so a world with no room says which quirk leaves none.

    python benchmarks/library_pilot.py --model runs/smollm2/model --temperatures 0.7 0.9 --samples 4 --tasks 48

Resumable: each temperature is one ``molrl eval`` run in OUT/t<temperature> (finished problems are not sampled
again). Prints a table; OUT/pilot.json keeps the figures and each run's seconds.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from code_pass_rate import summary  # pass rate, no-code share and group figures from one evaluation's samples

from molrl.cli import setup_logging
from molrl.demo.library import LibraryConfig, build_library_world
from molrl.demo.run import task_record
from molrl.records.jsonl import read_records
from molrl.records.writes import write_text

NEW_TOKENS = 128
"""Tokens an answer may take (a library task's reference is 2-8 lines)."""


def task_file(out: Path, seed: int, tasks: int) -> Path:
    """The world's first ``tasks`` training tasks, spread over its families, as a molrl task file."""
    world = build_library_world(LibraryConfig(seed=seed))
    by_family: dict[str, list] = {}
    for task in world.train:
        by_family.setdefault(task.meta["family"], []).append(task)
    chosen = [t for group in zip(*by_family.values()) for t in group][:tasks]
    path = out / "data" / "train.jsonl"
    write_text(path, "".join(json.dumps(task_record(t)) + "\n" for t in chosen))
    return path


def measure(model: str, tasks: Path, out: Path, temperature: float, samples: int) -> tuple[Path, float]:
    """One ``molrl eval`` run at ``temperature``: its samples.jsonl and the seconds this invocation took."""
    from molrl.config import load_config
    from molrl.eval.config import EvalConfig
    from molrl.eval.run import run_eval

    cfg = load_config(EvalConfig, None, [
        f"model={model}", f"output_dir={out}", "benchmarks=[library]", f"data.library={tasks}",
        "data.library.format=jsonl", "data.library.spec.kind=code", "split=all", f"sampling.n={samples}", f"sampling.temperature={temperature}",
        "sampling.top_p=1.0", "sampling.top_k=0", f"sampling.max_new_tokens={NEW_TOKENS}", "sampling.seed=0",
        "ks=[1]", "engine=transformers"])
    started = time.time()
    run_eval(cfg)
    return out / "library" / "samples.jsonl", time.time() - started


def by_family(samples: Path) -> dict[str, float]:
    """Pass rate per task family (``price``, ``stock+ship``, ...), from the task ids."""
    rates: dict[str, list[bool]] = {}
    for r in read_records(samples):
        rates.setdefault(str(r["id"]).split("/")[2], []).append(bool(r.get("held_back_pass")))
    return {f: sum(v) / len(v) for f, v in sorted(rates.items())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the pretrained model as a transformers directory")
    p.add_argument("--out", default="runs/library_pilot")
    p.add_argument("--seed", type=int, default=0, help="the world's seed")
    p.add_argument("--tasks", type=int, default=48, help="training tasks, spread over the families")
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 0.9])
    p.add_argument("--samples", type=int, default=4, help="samples a task")
    args = p.parse_args()
    setup_logging()
    out = Path(args.out)
    tasks = task_file(out, args.seed, args.tasks)
    kept = json.loads((out / "pilot.json").read_text()) if (out / "pilot.json").is_file() else {}
    for t in args.temperatures:
        samples, seconds = measure(args.model, tasks, out / f"t{t:g}", t, args.samples)
        kept[f"{t:g}"] = {**summary(samples), "by_family": by_family(samples),
                          "seconds": max(seconds, kept.get(f"{t:g}", {}).get("seconds", 0.0))}
        write_text(out / "pilot.json", json.dumps(kept, indent=1))
    print("| temperature | tasks x samples | pass rate | tasks passed at least once | no code | groups of 8 expected "
          "to carry a gradient | seconds |")
    print("|---|---|---|---|---|---|---|")
    for t, f in kept.items():
        print(f"| {t} | {f['tasks']} x {f['samples'] // f['tasks']} | {f['pass_rate']:.3f} | "
              f"{f['tasks_ever_passed']:.3f} | {f['no_code']:.3f} | {f['informative_groups_of_8']:.3f} | "
              f"{f['seconds']:.0f} |")
    for t, f in kept.items():
        print(f"t {t}: pass rate per family " + ", ".join(f"{k} {v:.3f}" for k, v in f["by_family"].items()))


if __name__ == "__main__":
    main()
