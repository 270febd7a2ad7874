"""``molrl collect``: run a model as an agent on tasks and append multi-turn feedback traces.

    molrl collect model=M data.path=FILE data.format=humaneval|mbpp|math500|aime|jsonl output_dir=DIR \\
        [sampling.n=N] [episode.max_turns=T] [data.limit=N] [--config FILE] [key=value ...]

The traces go to DIR/traces.jsonl. Re-running the same command resumes: finished (task, sample) pairs there are
skipped; a finished run says so and is left alone; other settings on the same output_dir are refused, naming each
key. Overrides reach every field, e.g. ``sampling.temperature=0.8 episode.feedback=execution,verdict``. Each flag is
a shorthand of one key (``FLAGS``: ``--out DIR`` is ``output_dir=DIR``); a flag and its key given different values
are refused.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    from molrl.cli import add_stage_parser

    p = add_stage_parser(subparsers, "collect",
                         help="run a model as an agent on code/math tasks and write multi-turn feedback traces",
                         doc=__doc__, config="CollectConfig", example="sampling.temperature=0.8")
    p.add_argument("--model", help="model.path: model directory or hub name (tiny:chatml for smoke runs)")
    p.add_argument("--adapter", help="model.adapter: PEFT adapter directory to put on the model")
    p.add_argument("--tasks", help="data.path: task file")
    p.add_argument("--format", choices=["humaneval", "mbpp", "math500", "aime", "jsonl"], help="data.format: task file format")
    p.add_argument("--out", help="output_dir: run directory (traces.jsonl, config.yaml); re-running resumes it")
    p.add_argument("--samples", type=int, help="sampling.n: episodes per task")
    p.add_argument("--max-turns", type=int, help="episode.max_turns: most model turns per episode")
    p.add_argument("--limit", type=int, help="data.limit: use only the first N tasks")
    p.set_defaults(func=handle)


FLAGS = {
    "model": "model.path", "adapter": "model.adapter", "tasks": "data.path", "format": "data.format", "out": "output_dir",
    "samples": "sampling.n", "max_turns": "episode.max_turns", "limit": "data.limit",
}
"""Each command-line flag (its attribute) and the config key it is a shorthand of."""


def handle(args: argparse.Namespace) -> int:
    from molrl.collect.config import CollectConfig
    from molrl.commands.flags import flag_items, refuse_clashes
    from molrl.config import load_config
    from molrl.config.variants import describe_stage
    from molrl.records.input_checks import check_inputs

    if args.describe:
        print("\n".join(describe_stage(CollectConfig, "collect")))
        return 0
    flagged = flag_items(FLAGS, args)
    refuse_clashes(CollectConfig, flagged, args.overrides)
    cfg = load_config(CollectConfig, args.config, [item for _, item in flagged] + list(args.overrides))
    check_inputs("collect", cfg)
    from molrl.collect.run import run_collect  # torch loads only now: a config error is reported before it

    run_collect(cfg)
    return 0
