"""``molrl collect``: run a model as an agent on tasks and append multi-turn feedback traces.

    molrl collect --model M --tasks FILE --format humaneval|mbpp|math500|aime|jsonl \\
        --out DIR [--samples N] [--max-turns T] [--limit N] [--config FILE] [key=value ...]

The traces go to DIR/traces.jsonl. Re-running the same command resumes: finished (task, sample) pairs there are
skipped; a finished run says so and is left alone; other settings on the same --out are refused, naming each key.
Overrides reach every field, e.g. ``sampling.temperature=0.8 episode.feedback=execution,verdict``.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    from molrl.cli import add_stage_parser

    p = add_stage_parser(subparsers, "collect",
                         help="run a model as an agent on code/math tasks and write multi-turn feedback traces",
                         doc=__doc__, config="CollectConfig", example="sampling.temperature=0.8")
    p.add_argument("--model", help="model directory or hub name (tiny:chatml for smoke runs)")
    p.add_argument("--adapter", help="PEFT adapter directory to put on the model")
    p.add_argument("--tasks", help="task file")
    p.add_argument("--format", choices=["humaneval", "mbpp", "math500", "aime", "jsonl"], help="task file format")
    p.add_argument("--out", help="run directory (output_dir): traces.jsonl, config.yaml; re-running resumes it")
    p.add_argument("--samples", type=int, help="episodes per task")
    p.add_argument("--max-turns", type=int, help="most model turns per episode")
    p.add_argument("--limit", type=int, help="use only the first N tasks")
    p.set_defaults(func=handle)


FLAGS = {
    "model": "model.path", "adapter": "model.adapter", "tasks": "data.path", "format": "data.format", "out": "output_dir",
    "samples": "sampling.n", "max_turns": "episode.max_turns", "limit": "data.limit",
}
"""Command-line flags and the config keys they set."""


def handle(args: argparse.Namespace) -> int:
    from molrl.collect.config import CollectConfig
    from molrl.config import describe, load_config
    from molrl.input_checks import check_inputs

    if args.describe:
        print("\n".join(describe(CollectConfig)))
        return 0
    overrides = [f"{key}={getattr(args, attr)}" for attr, key in FLAGS.items() if getattr(args, attr) is not None]
    cfg = load_config(CollectConfig, args.config, overrides + list(args.overrides))
    check_inputs("collect", cfg)
    from molrl.collect.run import run_collect  # torch loads only now: a config error is reported before it

    run_collect(cfg)
    return 0
