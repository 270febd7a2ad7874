"""The base's sampled pass rate on the code headline's training tasks, at the temperatures GRPO could sample at.

GRPO learns only from groups whose samples differ. This measures, for the pretrained model as it is, the share of
sampled single-turn answers whose code passes the task's held-back tests (GRPO's binary reward in
``benchmarks/headline_code.py``), the share with no code at all, and what that means for GRPO's groups: the share of
tasks whose ``--samples`` samples were not all alike (an informative group of that size, counted), and the share of
groups of 8 expected informative from each task's measured pass rate p (1 - p^8 - (1 - p)^8, the plug-in estimate).

The tasks are the code headline's training tasks (``real_model_rl.easy_split``: the easiest MBPP tasks with no MINT
trace, the same split); the answers are posed and graded as that headline's evaluation poses and grades them
(``configs/pipeline_code_pretrained.yaml``'s eval section: single turn, no execution while answering), sampled with
GRPO's 160 new tokens, ``top_p`` 1 and ``top_k`` off (the paper's GRPO sampling names a temperature and no top-p).

    python benchmarks/code_pass_rate.py --model runs/smollm2/model --mbpp ../shared/data/mbpp/mbpp.jsonl \\
        --mint ../shared/data/traces/mint --temperatures 0.7 1.0 --samples 4

Resumable: each temperature is one ``molrl eval`` run in OUT/t<temperature> (finished problems are not sampled
again). Prints a table; OUT/pass_rate.json keeps the figures and each run's seconds.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Sequence

from headline_code import CONFIG  # the code headline's pipeline config: its eval section poses and grades
from real_model_rl import easy_split  # the same easy tasks and split as the code headline

from molrl.cli import setup_logging
from molrl.records.jsonl import read_records
from molrl.records.writes import write_text

NEW_TOKENS = 160
"""GRPO's completion length in the code headline."""


def informative(passes: Sequence[bool]) -> bool:
    """Whether a group's samples differ (some pass, some do not), so its advantages are not all zero.

    >>> informative([False, True, False]), informative([False] * 4), informative([True] * 4)
    (True, False, False)
    """
    return 0 < sum(passes) < len(passes)


def group_share(rates: Sequence[float], size: int) -> float:
    """Mean over tasks of the chance that a group of ``size`` samples differs, given each task's pass rate.

    >>> round(group_share([0.0, 0.5], 2), 3)  # 0 for a task never passed; 1 - 0.25 - 0.25 for a coin
    0.25
    """
    return sum(1 - p ** size - (1 - p) ** size for p in rates) / len(rates)


def summary(samples: Path) -> dict[str, float]:
    """Pass rate (held-back tests), no-code share, and group figures from one evaluation's samples.jsonl."""
    by_task: dict[str, list[bool]] = {}
    no_code = total = 0
    for r in read_records(samples):
        by_task.setdefault(str(r["id"]), []).append(bool(r.get("held_back_pass")))
        no_code += r["stage"] == "no_code"
        total += 1
    rates = [sum(p) / len(p) for p in by_task.values()]
    return {"tasks": len(by_task), "samples": total, "pass_rate": sum(rates) / len(rates),
            "tasks_ever_passed": sum(r > 0 for r in rates) / len(rates), "no_code": no_code / total,
            "informative_groups_measured": sum(map(informative, by_task.values())) / len(by_task),
            "informative_groups_of_8": group_share(rates, 8)}


def measure(model: str, train: Path, out: Path, temperature: float, samples: int) -> tuple[Path, float]:
    """One ``molrl eval`` run of ``model`` on the training tasks at ``temperature`` (reused when finished); returns
    its samples.jsonl and the seconds this invocation took."""
    from molrl.eval.config import EvalConfig
    from molrl.eval.run import run_eval
    from molrl.pipeline.config import load_pipeline_config, stage_config

    section = load_pipeline_config(CONFIG).eval
    fixed = {"model": {"path": model}, "output_dir": str(out), "label": f"base, t {temperature:g}",
             "benchmarks": ["mbpp"], "data": {"mbpp": str(train)}}
    cfg = stage_config(EvalConfig, {k: v for k, v in section.items() if k not in ("benchmarks", "data")}, fixed,
                       [f"sampling.n={samples}", f"sampling.temperature={temperature}", "sampling.top_p=1.0",
                        "sampling.top_k=0", f"sampling.max_new_tokens={NEW_TOKENS}", "sampling.seed=0", "ks=[1]"],
                       "eval")
    started = time.time()
    run_eval(cfg)
    return out / "mbpp" / "samples.jsonl", time.time() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the pretrained model as a transformers directory")
    p.add_argument("--mbpp", required=True, help="MBPP's full file (mbpp.jsonl)")
    p.add_argument("--mint", required=True, help="the MINT traces folder (tasks in it are left out)")
    p.add_argument("--out", default="runs/code_pass_rate")
    p.add_argument("--train-tasks", type=int, default=150, help="as the code headline's --train-tasks")
    p.add_argument("--held-out", type=int, default=100, help="as the code headline's --held-out")
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 1.0])
    p.add_argument("--samples", type=int, default=4, help="samples a task")
    args = p.parse_args()
    setup_logging()
    out = Path(args.out)
    train, _ = easy_split(Path(args.mbpp), Path(args.mint), out / "data", args.train_tasks + args.held_out,
                          args.held_out)
    kept = json.loads((out / "pass_rate.json").read_text()) if (out / "pass_rate.json").is_file() else {}
    for t in args.temperatures:
        samples, seconds = measure(args.model, train, out / f"t{t:g}", t, args.samples)
        kept[f"{t:g}"] = {**summary(samples), "seconds": max(seconds, kept.get(f"{t:g}", {}).get("seconds", 0.0))}
        write_text(out / "pass_rate.json", json.dumps(kept, indent=1))
    print(f"| temperature | tasks x samples | pass rate (held-back tests) | tasks passed at least once | no code | "
          f"groups of {args.samples} that differ | groups of 8 expected to differ | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    for t, f in kept.items():
        print(f"| {t} | {f['tasks']} x {f['samples'] // f['tasks']} | {f['pass_rate']:.3f} | "
              f"{f['tasks_ever_passed']:.3f} | {f['no_code']:.3f} | {f['informative_groups_measured']:.3f} | "
              f"{f['informative_groups_of_8']:.3f} | {f['seconds']:.0f} |")


if __name__ == "__main__":
    main()
