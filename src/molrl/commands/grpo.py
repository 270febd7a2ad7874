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
    p = subparsers.add_parser(
        "grpo",
        help="GRPO / Dr.GRPO post-training with code and math rewards",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. algorithm=grpo beta=0.04")
    p.add_argument("--config", help="YAML GrpoConfig file (see configs/grpo_tiny.yaml)")
    p.add_argument("--describe", action="store_true", help="print every config key with its default and exit")
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
