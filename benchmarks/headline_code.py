"""The headline on a pretrained model, on a code task: easy MBPP with SmolLM2-135M-Instruct, over seeds.

Per seed, the whole pipeline (``configs/pipeline_code_pretrained.yaml``) on the pretrained model, with no warm-up
(it writes Python as it is):

1. collect: the model's own multi-turn traces on the training tasks in the sandbox; executed code that defines the
   function is tested on the task's shown test and the outcome is the feedback;
2. MoL on those traces (CE on the sandbox's feedback, KL to the base on the model's own tokens);
3. the same GRPO from the MoL model and from the base, with a binary reward (1 only when the task's held-back
   tests pass: the answer format alone earns nothing);
4. single-turn evaluation without execution of base, base + GRPO, MoL and MoL + GRPO, greedy: held-out easy MBPP
   (scored on held-back tests) and a slice of HumanEval (general: accuracy, KL to the base on its greedy answers,
   agreement with them).

Tasks: the MBPP tasks with the shortest reference code whose text is in no MINT trace (``real_model_rl.easy_split``),
split once (seed 0) into training and held-out tasks; general: the HumanEval tasks with the shortest reference
solutions. Seeds vary collection's sampling, MoL's and GRPO's seeds; the tasks stay.

    python benchmarks/headline_code.py --model runs/smollm2/model --mbpp ../shared/data/mbpp/mbpp.jsonl \\
        --mint ../shared/data/traces/mint --humaneval ../shared/data/humaneval/HumanEval.jsonl.gz --seeds 3
    python benchmarks/headline_code.py ... --quick        # a check that every stage and the report run (minutes)

Resumable: each seed is a pipeline run (seed 0 in OUT/pipeline, seed N in OUT/seed-N/pipeline) whose finished stages
are reused; ``--seed N`` runs that seed alone and writes no report, so two seeds can run side by side in two
processes (``--seeds 3`` then reuses them and writes the report). The report is OUT/headline.md with
OUT/plots/headline.png; OUT/timings.json keeps each seed's stage seconds.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import sys
import time
from pathlib import Path

from real_model_rl import easy_split  # the same easy tasks as the one-seed GRPO benchmark

from molrl.cli import setup_logging
from molrl.demo.seeds import cell
from molrl.pipeline import run_pipeline
from molrl.pipeline.config import load_pipeline_config
from molrl.study.headline import seed_dirs, write_headline
from molrl.study.metrics import logged, quarter_rise
from molrl.study.claims import CLAIMS
from molrl.study.verdict import claim_line
from molrl.records.writes import write_text

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs/pipeline_code_pretrained.yaml"
QUICK = ["collect.episode.batch_size=10", "mol.train.max_steps=2", "mol.train.save_steps=1000",
         "rl.train.max_steps=2", "rl.train.save_steps=1000", "rl.sandbox.workers=1"]
"""--quick: the same stages, two optimiser steps each."""
CONTROL_STEPS = 40
"""The control's GRPO steps: 10 a quarter, 80 completions, so a rise of the reward shows over its standard error."""
INTRO = ("`{model}` as it is (no warm-up: it writes Python) is the base. Each seed collects the base's own traces on "
         "the training tasks in the sandbox (up to 3 turns; executed code is tested on the task's shown test), trains "
         "MoL on them, runs the same GRPO from the MoL model and from the base (binary reward: the held-back tests "
         "pass), and evaluates in a single turn without execution, greedy: held-out easy MBPP tasks (n = {n_held} a "
         "seed, scored on held-back tests) and general HumanEval tasks (n = {n_general} a seed).")
log = logging.getLogger("headline_code")


def general_split(humaneval: Path, out: Path, count: int) -> Path:
    """The ``count`` HumanEval tasks with the shortest reference solutions, as HumanEval records."""
    path = out / "general.jsonl"
    if not path.is_file():
        opener = gzip.open if humaneval.suffix == ".gz" else open
        with opener(humaneval, "rt") as fh:
            records = [json.loads(x) for x in fh if x.strip()]
        chosen = sorted(records, key=lambda r: (len(r["canonical_solution"]), r["task_id"]))[:count]
        out.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in chosen))
    return path


def run_seed(seed: int, out: Path, model: str, files: dict[str, Path], quick: bool) -> dict[str, float]:
    """One seed's pipeline (finished stages reused); returns the seconds each stage took in this invocation."""
    run_dir = seed_dirs(out, seed + 1)[seed]
    fixed = [f"model={model}", f"output_dir={run_dir}", f"collect.data.path={files['train']}",
             f"rl.data.path={files['train']}", f"eval.data.mbpp={files['held']}",
             f"eval.data.humaneval={files['general']}", f"collect.sampling.seed={seed}", f"mol.train.seed={seed}",
             f"rl.train.seed={seed}", f"title=molrl headline, easy MBPP, {Path(model).name}, seed {seed}"]
    cfg = load_pipeline_config(CONFIG, [*fixed, *(QUICK if quick else [])])
    started = time.time()
    run_pipeline(cfg, most_threads=2)
    log.info("seed %d finished in %.0f s", seed, time.time() - started)
    return json.loads((run_dir / "timings.json").read_text())


def room_split(out: Path, train: Path) -> Path:
    """The training tasks on which the base's own code passed the task's shown test in seed 0's collection, as MBPP
    records (OUT/data/room.jsonl): tasks where the base's samples can differ, so GRPO's groups have a gradient."""
    path = out / "data" / "room.jsonl"
    if not path.is_file():
        traces = seed_dirs(out, 1)[0] / "collect" / "traces.jsonl"
        passed = set()
        for line in traces.read_text().splitlines():
            meta = json.loads(line)["meta"]
            if any((o["observation"].get("grade") or {}).get("correct") for o in meta["observations"].values()):
                passed.add(str(meta["task_id"]))
        records = [x for x in train.read_text().splitlines() if x.strip() and str(json.loads(x)["task_id"]) in passed]
        if not records:
            raise SystemExit(f"{traces}: the base's code passed no shown test, so the control has no tasks")
        write_text(path, "".join(x + "\n" for x in records))
    return path


def run_control(out: Path, model: str, room: Path, quick: bool) -> dict[str, float]:
    """The control that tells a GRPO that cannot learn from one that has no room: the same GRPO from the base (seed
    0), ``CONTROL_STEPS`` steps, on the tasks of ``room_split`` only; returns its stage seconds."""
    run_dir = out / "control" / "pipeline"
    fixed = [f"model={model}", f"output_dir={run_dir}", "stages=[rl]", f"rl.data.path={room}",
             f"rl.train.max_steps={CONTROL_STEPS}", "rl.train.seed=0",
             f"title=molrl headline control, easy MBPP with room, {Path(model).name}"]
    cfg = load_pipeline_config(CONFIG, [*fixed, *(QUICK if quick else [])])
    cfg.rl_runs = [run for run in cfg.rl_runs if run.start == "base"]
    run_pipeline(cfg, most_threads=2)
    return json.loads((run_dir / "timings.json").read_text())


def control_lines(out: Path, room: Path) -> list[str]:
    """Whether the control's reward rose: its first quarter of steps against its last, over steps (one run)."""
    run_dir, tasks = out / "control" / "pipeline", len(room.read_text().splitlines())
    reward = logged(run_dir, "rl", "base+grpo", "reward")
    first, last, se = quarter_rise(reward)
    zero_first, zero_last, _ = quarter_rise(logged(run_dir, "rl", "base+grpo", "frac_reward_zero_std"))
    steps = len(reward)
    rose = "rose" if last - first > 2 * se else "fell" if first - last > 2 * se else "did not move beyond 2 s.e."
    return [f"**Control: the same GRPO where it has room.** From the base, seed 0, {steps} steps on the {tasks} "
            "training tasks whose shown test the base's own code passed in seed 0's collection (`control/`): reward "
            f"{first:.3f} -> {last:.3f} (first quarter of steps -> last; difference {last - first:+.3f} ± {se:.3f}, "
            f"standard error over steps): it {rose}. Groups whose samples all scored the same: {zero_first:.2f} -> "
            f"{zero_last:.2f}."]


def record_seconds(timings_file: Path, key: str, ran: dict[str, float]) -> None:
    """Add one run's stage seconds to OUT/timings.json under ``key``; a resumed run keeps the seconds its finished
    stages took before, and the stages it did not report this time. Read again just before writing: another process
    may have written its own seed meanwhile."""
    timings = json.loads(timings_file.read_text()) if timings_file.is_file() else {}
    kept = timings.get(key, {})
    timings[key] = {**kept, **{k: max(v, kept.get(k, 0.0)) for k, v in ran.items()}}
    write_text(timings_file, json.dumps(timings, indent=1))


def reward_lines(out: Path, seeds: int) -> list[str]:
    """Whether each GRPO run's reward (the share of completions passing the held-back tests) rose, and the share
    with no code, first quarter of the run against the last."""
    run_dirs = seed_dirs(out, seeds)
    lines = ["GRPO's training reward, the share of completions passing the held-back tests (binary reward), the "
             "share with no code, and the share of groups whose samples all scored the same (no gradient), mean of "
             "the run's first quarter of steps -> its last quarter:", "",
             "| run | reward, first quarter | reward, last quarter | no code, first | no code, last | "
             "equal groups, first | equal groups, last |", "|---|---|---|---|---|---|---|"]
    claims = []
    for run in ("base+grpo", "mol+grpo"):
        reward = [quarter_rise(logged(d, "rl", run, "reward")) for d in run_dirs]
        no_code = [quarter_rise(logged(d, "rl", run, "reward_stage/code/no_code") or [0.0]) for d in run_dirs]
        equal = [quarter_rise(logged(d, "rl", run, "frac_reward_zero_std")) for d in run_dirs]
        early, late = [r[0] for r in reward], [r[1] for r in reward]
        lines.append(f"| `{run}` | {cell(early)} | {cell(late)} | {cell([c[0] for c in no_code])} | "
                     f"{cell([c[1] for c in no_code])} | {cell([e[0] for e in equal])} | "
                     f"{cell([e[1] for e in equal])} |")
        claims.append(claim_line(CLAIMS["reward_rises"].fill(run=run), late, early))
    return [*lines, "", *claims]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the pretrained model as a transformers directory")
    p.add_argument("--mbpp", required=True, help="MBPP's full file (mbpp.jsonl)")
    p.add_argument("--mint", required=True, help="the MINT traces folder (tasks in it are left out)")
    p.add_argument("--humaneval", required=True, help="HumanEval.jsonl(.gz): the general tasks")
    p.add_argument("--out", default="runs/headline_code")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--seed", type=int, action="append", default=None,
                   help="run only this seed (repeatable; no report): seeds can run side by side in two processes")
    p.add_argument("--train-tasks", type=int, default=150)
    p.add_argument("--held-out", type=int, default=100)
    p.add_argument("--general", type=int, default=50, help="HumanEval tasks")
    p.add_argument("--control", action="store_true",
                   help="also run and report the control: the same GRPO from the base on the tasks it has room on")
    p.add_argument("--quick", action="store_true", help="20 training, 10 held-out and 5 general tasks, 2 steps")
    args = p.parse_args()
    setup_logging()
    out = Path(args.out)
    train_n, held_n, general_n = (20, 10, 5) if args.quick else (args.train_tasks, args.held_out, args.general)
    train, held = easy_split(Path(args.mbpp), Path(args.mint), out / "data", train_n + held_n, held_n)
    files = {"train": train, "held": held, "general": general_split(Path(args.humaneval), out / "data", general_n)}
    timings_file = out / "timings.json"
    for seed in args.seed if args.seed is not None else range(args.seeds):
        record_seconds(timings_file, str(seed), run_seed(seed, out, args.model, files, args.quick))
    room = room_split(out, train) if args.control else None
    if room is not None:
        record_seconds(timings_file, "control", run_control(out, args.model, room, args.quick))
    if args.seed is not None:
        return
    extra = reward_lines(out, args.seeds) + (["", *control_lines(out, room)] if room is not None else [])
    report = write_headline(out, args.seeds, args.model, task="easy MBPP", held_bench="mbpp",
                            general_bench="humaneval", intro=INTRO, extra=extra)
    print(report.read_text())
    print(f"stage seconds per seed: {timings_file.read_text()}", file=sys.stderr)


if __name__ == "__main__":
    main()
