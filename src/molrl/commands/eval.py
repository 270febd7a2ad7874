"""``molrl eval``: score a model (or a predictions file) on benchmarks; ``molrl eval compare`` runs.

    molrl eval --model M [--adapter A] --benchmarks math500,humaneval \\
        --data math500=PATH --data humaneval=PATH [--limit N] [--n N] [--mode single|interactive] [--turns N] \\
        [--out DIR] [--config FILE] [key=value ...]
    molrl eval --benchmarks humaneval --data humaneval=PATH --predictions samples.jsonl
    molrl eval compare RUN1 RUN2 ... [--out DIR] [--metric pass@1]
    molrl eval --describe       # every config key with its default and meaning

Each flag is a shorthand of config keys (``FLAGS``; ``--out DIR`` is ``output_dir=DIR``, ``--data NAME=PATH``
``data.NAME=PATH``, ``--turns N`` ``mode=interactive episode.max_turns=N``): ``molrl eval model=M
benchmarks=[humaneval] data.humaneval=PATH output_dir=DIR`` is the same run. A flag and its key given different
values are refused.
"""

from __future__ import annotations

import argparse
import logging
import re
from pathlib import Path

from molrl.errors import MolrlError
from molrl.records.writes import write_text

log = logging.getLogger(__name__)

NAMED = re.compile(r"^([A-Za-z0-9_.\-]+)=(.+)$")


def register(subparsers: argparse._SubParsersAction) -> None:
    from molrl.cli import add_stage_parser

    p = add_stage_parser(subparsers, "eval",
                         help="single-turn benchmark scores (MATH-500, AIME, HumanEval, MBPP, custom JSONL); compare runs",
                         doc=__doc__, config="EvalConfig", example="sampling.temperature=0",
                         overrides_help="config overrides (e.g. sampling.temperature=0), or `compare` and run "
                                        "directories")
    p.add_argument("--model", help="model.path: model directory or hub name (tiny:chatml for smoke runs)")
    p.add_argument("--adapter", help="model.adapter: PEFT adapter directory to put on the model")
    p.add_argument("--benchmarks", help="benchmarks, comma-separated: math500,aime24,aime25,humaneval,mbpp or custom "
                                        "names")
    p.add_argument("--data", action="append", default=[], metavar="NAME=PATH",
                   help="data.NAME: a benchmark's data file (or hub:DATASET[:SPLIT]); repeat per benchmark")
    p.add_argument("--predictions", action="append", default=[], metavar="[NAME=]PATH",
                   help="grade this JSONL of {id, completion} instead of sampling a model")
    p.add_argument("--limit", type=int, help="limit: first N problems of each benchmark")
    p.add_argument("--n", type=int, help="sampling.n: samples per problem")
    p.add_argument("--max-new-tokens", type=int, help="sampling.max_new_tokens: most tokens per completion")
    p.add_argument("--mode", choices=["single", "interactive"], help="mode: single turn (default) or the feedback "
                                                                      "loop")
    p.add_argument("--turns", type=int, metavar="N",
                   help="episode.max_turns with mode=interactive: the episode loop with up to N turns; 1 is "
                        "single-turn")
    p.add_argument("--thinking", action="store_true", help="thinking=true: the thinking block of Qwen3-style "
                                                           "templates")
    p.add_argument("--out", help="output_dir: run directory (eval), or where compare writes its table and chart")
    p.add_argument("--metric", default="pass@1", help="compare: metric to tabulate and plot")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    if args.overrides[:1] == ["compare"]:
        return compare(args.overrides[1:], args.out, args.metric)
    from molrl.config import load_config
    from molrl.config.variants import describe_stage
    from molrl.records.input_checks import check_inputs
    from molrl.eval.config import EvalConfig

    if args.describe:
        print("\n".join(describe_stage(EvalConfig, "eval")))
        return 0
    overrides = flag_overrides(args)
    bare = [p for p in args.predictions if not NAMED.match(p)]
    if bare:
        cfg = load_config(EvalConfig, args.config, overrides + list(args.overrides))
        if len(bare) > 1 or len(cfg.benchmarks) != 1:
            raise MolrlError("--predictions PATH without NAME= needs exactly one benchmark; "
                             "use --predictions NAME=PATH for each of several")
        overrides.append(f"predictions.{cfg.benchmarks[0]}={bare[0]}")
    cfg = load_config(EvalConfig, args.config, overrides + list(args.overrides))
    check_inputs("eval", cfg)
    from molrl.eval.run import run_eval  # torch loads only now: a config error is reported before it

    out = run_eval(cfg)
    print((out / "results.md").read_text(), end="")
    return 0


FLAGS = {"model": "model.path", "adapter": "model.adapter", "benchmarks": "benchmarks", "limit": "limit",
         "n": "sampling.n", "max_new_tokens": "sampling.max_new_tokens", "mode": "mode", "out": "output_dir"}
"""Each one-key command-line flag (its attribute) and the config key it is a shorthand of; ``flag_overrides`` writes
out the others (``--turns``, ``--thinking``, ``--data``, ``--predictions NAME=PATH``)."""


def flag_overrides(args: argparse.Namespace) -> list[str]:
    """The command-line flags as ``key=value`` overrides (applied before explicit ones); a flag and an explicit key
    it sets given different values are refused."""
    from molrl.commands.flags import flag_items, refuse_clashes
    from molrl.eval.config import EvalConfig

    flagged = flag_items(FLAGS, args)
    if args.turns is not None:
        if args.turns < 1:
            raise MolrlError(f"--turns {args.turns}: give 1 (single-turn) or more")
        if args.mode == "single" and args.turns > 1:
            raise MolrlError(f"--turns {args.turns} with --mode single: several turns are the interactive mode")
        keys = ["mode=single"] if args.turns == 1 else ["mode=interactive", f"episode.max_turns={args.turns}"]
        flagged += [(f"--turns {args.turns}", key) for key in keys]
    if args.thinking:
        flagged.append(("--thinking", "thinking=true"))
    for item in args.data:
        m = NAMED.match(item)
        if not m:
            raise MolrlError(f"--data {item!r}: expected NAME=PATH, e.g. --data humaneval=HumanEval.jsonl.gz")
        flagged.append((f"--data {item}", f"data.{m.group(1)}={m.group(2)}"))
    for item in args.predictions:
        m = NAMED.match(item)
        if m:
            flagged.append((f"--predictions {item}", f"predictions.{m.group(1)}={m.group(2)}"))
    refuse_clashes(EvalConfig, flagged, args.overrides)
    return [item for _, item in flagged]


def compare(runs: list[str], out: str | None, metric: str) -> int:
    """Print a table of ``metric`` for several run directories (labelled by folder name) and write it with a bar
    chart."""
    from molrl.eval.report import compare_chart, compare_table, load_run, run_labels

    if not runs:
        raise MolrlError("eval compare: name at least one run directory")
    loaded = list(zip(run_labels(runs), [load_run(r) for r in runs]))
    table = compare_table(loaded, metric)
    print(table, end="")
    out_dir = Path(out or "runs/compare")
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text(out_dir / "compare.md", table)
    chart = compare_chart(loaded, out_dir / "compare.png", metric)
    log.info("wrote %s and %s", out_dir / "compare.md", chart)
    return 0
