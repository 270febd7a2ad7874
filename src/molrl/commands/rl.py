"""``molrl rl``: RL post-training of a (MoL) policy with sandbox-execution rewards.

Algorithms: grpo, dr_grpo, dr_grpo_std, opd (on-policy distillation), ppo (over macro actions);
rollout options: partial rollouts, PROPS (docs/rl.md).

    molrl rl --config configs/rl_tiny.yaml [key.sub=value ...]
    molrl rl --config configs/rl_qwen3_8b.yaml model.adapter=runs/mol data.path=mbpp.jsonl
    molrl rl --describe        # every config key with its default and meaning

Re-running the same command resumes from the newest checkpoint; on a finished run it says so and trains
nothing; a raised train.max_steps extends the run; any other changed key is refused, naming it (start a new
run with another output_dir). The training keys sit under ``train.`` as in ``molrl mol``; ``molrl grpo``, the
command's first name, still runs it.

Several processes: ``accelerate launch [--config_file ...] -m molrl.cli rl --config FILE ...``
(on CPU: ``ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 ...``); see docs/rl.md.
"""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    from molrl.cli import add_stage_parser  # molrl.cli imports this module to register it

    p = add_stage_parser(subparsers, "rl", help="RL post-training (GRPO, Dr.GRPO, OPD, PPO) with code and math rewards",
                         doc=__doc__, config="RlConfig", example="algorithm=grpo beta=0.04", aliases=["grpo"])
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from molrl.config import load_config
    from molrl.config.variants import describe_stage
    from molrl.records.input_checks import check_inputs
    from molrl.rl.config import RlConfig

    if args.command == "grpo":
        log.warning("molrl grpo is now molrl rl, the same command under its one name")
    if args.describe:
        print("\n".join(describe_stage(RlConfig, "rl")))
        return 0
    cfg = load_config(RlConfig, args.config, args.overrides)
    check_inputs("rl", cfg)
    from molrl.rl.run import run_rl  # torch and TRL load inside it, after the re-run rule (molrl.records.rerun) let it train

    out = run_rl(cfg)
    print(out)
    return 0
