"""The library world's pilot (before any seeds): does the pretrained base leave GRPO room, and a gradient?

For the base as it is (no warm-up), on the world's training tasks: the sampled pass rate of single-turn answers
(held-back tests, no execution while answering) at each temperature, the share with no code, the share of tasks
passed at least once, and the share of groups of 8 expected to carry a gradient (1 - p^8 - (1 - p)^8 from each task's
measured pass rate; the design asks for at least 0.3), per task family. Two controls at the first temperature
separate a world with no room from a model that cannot write these functions: the same tasks with each function's
behaviour stated in the prompt (``library_told``: the room that knowing the library leaves), and plain-Python general
tasks (``general``).

    python benchmarks/library_pilot.py --model runs/smollm2/model --temperatures 0.7 0.9 --samples 4 --tasks 48
    python benchmarks/library_pilot.py --model runs/smollm2/model --warm-up --out runs/library_pilot_warm

``--warm-up`` measures the base the library world's pipeline starts from: the model warmed up in decoy libraries
(``molrl.demo.library_base``, built as ``molrl demo --world library --model`` builds it, in OUT/warm/base). It saw
the training tasks' texts there, each in a library of other quirks, so evaluation is told to score them
(``allow_trained_overlap``).

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
from molrl.demo.library import LibraryConfig, build_library_world, told
from molrl.demo.run import task_record
from molrl.records.jsonl import read_records
from molrl.records.writes import write_text

NEW_TOKENS = 128
"""Tokens an answer may take (a library task's reference is 2-8 lines)."""


def task_files(out: Path, seed: int, tasks: int) -> dict[str, Path]:
    """The world's first ``tasks`` training tasks spread over its families (``library``), the same tasks with their
    functions' behaviour stated in the prompt (``library_told``, the control that says how much room knowing the
    library leaves) and as many plain-Python general tasks (``general``, the control that says whether the model
    writes such functions at all), each as a molrl task file."""
    world = build_library_world(LibraryConfig(seed=seed))
    by_family: dict[str, list] = {}
    for task in world.train:
        by_family.setdefault(task.meta["family"], []).append(task)
    chosen = [t for group in zip(*by_family.values()) for t in group][:tasks]
    sets = {"library": chosen, "library_told": [told(world, t) for t in chosen], "general": world.general_eval[:tasks]}
    paths = {}
    for name, group in sets.items():
        paths[name] = out / "data" / ("train.jsonl" if name == "library" else f"{name}.jsonl")
        write_text(paths[name], "".join(json.dumps(task_record(t)) + "\n" for t in group))
    return paths


def measure(model: str, tasks: Path, out: Path, temperature: float, samples: int, name: str = "library"
            ) -> tuple[Path, float]:
    """One ``molrl eval`` run of the task set ``name`` at ``temperature``: its samples.jsonl and the seconds this
    invocation took."""
    from molrl.config import load_config
    from molrl.eval.config import EvalConfig
    from molrl.eval.run import run_eval

    cfg = load_config(EvalConfig, None, [
        f"model={model}", f"output_dir={out}", f"benchmarks=[{name}]", f"data.{name}={tasks}",
        f"data.{name}.format=jsonl", f"data.{name}.spec.kind=code", "split=all", f"sampling.n={samples}", f"sampling.temperature={temperature}",
        "sampling.top_p=1.0", "sampling.top_k=0", f"sampling.max_new_tokens={NEW_TOKENS}", "sampling.seed=0",
        "ks=[1]", "engine=transformers", "allow_trained_overlap=true"])
    started = time.time()
    run_eval(cfg)
    return out / name / "samples.jsonl", time.time() - started


def by_family(samples: Path) -> dict[str, float]:
    """Pass rate per task family (``price``, ``stock+ship``, ...), from the task ids."""
    rates: dict[str, list[bool]] = {}
    for r in read_records(samples):
        parts = str(r["id"]).split("/")  # library/train/price/0, library-told/train/price/0, library/general-eval/7
        rates.setdefault(parts[2] if len(parts) == 4 else parts[1], []).append(bool(r.get("held_back_pass")))
    return {f: sum(v) / len(v) for f, v in sorted(rates.items())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the pretrained model as a transformers directory")
    p.add_argument("--out", default="runs/library_pilot")
    p.add_argument("--seed", type=int, default=0, help="the world's seed")
    p.add_argument("--tasks", type=int, default=48, help="training tasks, spread over the families")
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 0.9])
    p.add_argument("--samples", type=int, default=4, help="samples a task")
    p.add_argument("--controls", nargs="*", default=["library_told", "general"], choices=["library_told", "general"],
                   help="the controls, at the first temperature")
    p.add_argument("--warm-up", action="store_true",
                   help="measure the model warmed up in decoy libraries (the library world's base), built in OUT/warm")
    args = p.parse_args()
    setup_logging()
    out = Path(args.out)
    if args.warm_up:
        from molrl.demo.run import prepare_seed

        started = time.time()
        prepare_seed(out / "warm", "default", [], args.seed, None, "library", args.model)
        args.model = str(out / "warm" / "base")
        print(f"warmed-up base: {args.model} ({time.time() - started:.0f} s, reused when there)")
    files = task_files(out, args.seed, args.tasks)
    kept = json.loads((out / "pilot.json").read_text()) if (out / "pilot.json").is_file() else {}
    runs = [("library", t) for t in args.temperatures] + [(c, args.temperatures[0]) for c in args.controls]
    for name, t in runs:
        key = f"{t:g}" if name == "library" else f"{name} {t:g}"  # the library runs keep their first keys
        folder = out / (f"t{t:g}" if name == "library" else f"{name}-t{t:g}")
        samples, seconds = measure(args.model, files[name], folder, t, args.samples, name)
        kept[key] = {**summary(samples), "by_family": by_family(samples),
                     "seconds": max(seconds, kept.get(key, {}).get("seconds", 0.0))}
        write_text(out / "pilot.json", json.dumps(kept, indent=1))
    print("| tasks, temperature | tasks x samples | pass rate | tasks passed at least once | no code | groups of 8 "
          "expected to carry a gradient | seconds |")
    print("|---|---|---|---|---|---|---|")
    for key, f in kept.items():
        print(f"| {key if ' ' in key else 'library ' + key} | {f['tasks']} x {f['samples'] // f['tasks']} | "
              f"{f['pass_rate']:.3f} | {f['tasks_ever_passed']:.3f} | {f['no_code']:.3f} | "
              f"{f['informative_groups_of_8']:.3f} | {f['seconds']:.0f} |")
    for key, f in kept.items():
        print(f"{key}: pass rate per family " + ", ".join(f"{k} {v:.3f}" for k, v in f["by_family"].items()))


if __name__ == "__main__":
    main()
