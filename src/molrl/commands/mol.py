"""``molrl mol``: MoL continual training on agent traces (CE on feedback, KL to the base on decisions).

    molrl mol --config configs/mol_tiny.yaml [key.sub=value ...]
    molrl mol --config configs/mol_qwen3_8b.yaml data.traces=[a.jsonl,b.jsonl] output_dir=runs/mol8b
    molrl mol --describe          # every config key with its default and meaning

Re-running the same command after an interruption resumes from the newest checkpoint; on a finished
run it says so and trains nothing; a raised train.max_steps extends the run; any other changed key is
refused, naming it (start a new run with another output_dir).
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    from molrl.cli import add_stage_parser

    p = add_stage_parser(subparsers, "mol", help="MoL continual training on traces (LoRA or full fine-tuning), resumable",
                         doc=__doc__, config="MolConfig", example="loss.mode=ce")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from molrl.config import load_config
    from molrl.config.variants import describe_stage
    from molrl.records.input_checks import check_inputs
    from molrl.mol.config import MolConfig

    if args.describe:
        print("\n".join(describe_stage(MolConfig, "mol")))
        return 0
    cfg = load_config(MolConfig, args.config, args.overrides)
    check_inputs("mol", cfg)
    from molrl.mol.run import run_mol  # it loads torch only after the re-run rule (molrl.records.rerun) let it train

    run_mol(cfg)
    return 0
