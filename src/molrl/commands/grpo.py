"""``molrl grpo``: GRPO / Dr.GRPO post-training of a (MoL) policy with sandbox-execution rewards.

    molrl grpo --config configs/grpo_tiny.yaml [key.sub=value ...]
    molrl grpo --config configs/grpo_qwen3_8b.yaml policy.mol_adapter=runs/mol train.path=mbpp.jsonl
    molrl grpo --describe        # every config key with its default and meaning

Several processes: ``accelerate launch [--config_file ...] -m molrl.cli grpo --config FILE ...``
(on CPU: ``ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 ...``); see docs/grpo.md.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    from molrl.cli import add_stage_parser

    p = add_stage_parser(subparsers, "grpo", help="GRPO / Dr.GRPO post-training with code and math rewards",
                         doc=__doc__, config="GrpoConfig", example="algorithm=grpo beta=0.04")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from molrl.config import describe, load_config
    from molrl.grpo.config import GrpoConfig

    if args.describe:
        print("\n".join(describe(GrpoConfig)))
        return 0
    cfg = load_config(GrpoConfig, args.config, args.overrides)
    from molrl.grpo.run import run_grpo

    out = run_grpo(cfg)
    print(out)
    return 0
