"""``molrl demo``: the whole method on a laptop CPU, in a world molrl builds itself.

    molrl demo                 # about 6 minutes on 2 cores: runs/demo/pipeline/report.md
    molrl demo --quick         # the same steps, smaller (a smoke run), in about 2 minutes
    molrl demo --out DIR [key.sub=value ...]   # pipeline overrides, e.g. rl.train.max_steps=60
    molrl demo --seeds 3       # the headline (MoL + GRPO vs base + GRPO) over 3 seeds
    molrl demo --world long    # chains of 1-24 steps, for telling RL methods apart (about 18 minutes)
    molrl demo --world long --teacher   # its base trained 5x as long: a feedback teacher near 0.9 (about 45 minutes)
    molrl demo --world digit   # one hidden digit per answer (about 5 minutes)
    molrl demo --study         # the paper's ablations and the KL claims, 3 seeds (about 2 hours): runs/study/
    molrl demo --study --world digit   # the digit world's ablations, code reward included (about 40 minutes)
    molrl demo --study --no-replay     # the forgetting claims without the general replay: runs/study_no_replay/
    molrl demo --model DIR --seeds 3   # the chain world on a pretrained chat model (runs/demo_pretrained/)
    molrl demo --world library # code tasks against a library only the sandbox runs (--model DIR: on a chat model)

A hidden digit rule that only code execution reveals, applied 1 to 6 times in a chain whose every
step the answer writes out; a tiny base model trained from scratch to use the tool; then the real
pipeline: collection in the sandbox, MoL, the same GRPO from the MoL model and from the base,
single-step evaluation on held-out problems and general tasks, report.md. The paper's ablations
are --study: MoL vs CE vs CE on feedback only, MoL's length before GRPO, GRPO vs Dr.GRPO, the KL
dose, and MoL's decision KL inside GRPO, each with a verdict over seeds (runs/study/study.md;
docs/study.md); --study --quick checks every table and verdict in a few minutes.
Re-running with the same --out reuses finished steps.
"""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    from molrl.cli import add_stage_parser, count

    p = add_stage_parser(subparsers, "demo", help="the whole method end to end on a self-built tiny world (CPU, minutes)",
                         doc=__doc__, config="PipelineConfig (default: the world's configs/pipeline_*.yaml)",
                         example="rl.train.max_steps=60")
    p.add_argument("--quick", action="store_true", help="the small preset, a smoke run (about 2 minutes on 2 cores)")
    p.add_argument("--teacher", action="store_true",
                   help="long world: train the base five times as long (25 to 32 minutes on 2 cores instead of 5), "
                        "so that it answers at about 0.9 when it reads the feedback (on-policy distillation's "
                        "feedback teacher; 0.2-0.7 with the 5-minute base)")
    p.add_argument("--seeds", type=count, default=None, metavar="N",
                   help="repeat with world and training seeds 0..N-1 and report the headline over seeds "
                        "(N times as long; default 1, or 3 with --study)")
    p.add_argument("--study", action="store_true",
                   help="the paper's ablations over seeds (default 3) in one report, study.md, with a verdict per claim "
                        "(chain world, or --world digit; see docs/study.md)")
    p.add_argument("--model", default=None, metavar="DIR",
                   help="a pretrained chat model (transformers directory) as the chain world's base, warmed up on "
                        "the world's formats first (never its rule); the report adds the four models' comparison "
                        "over seeds (headline.md)")
    p.add_argument("--no-replay", action="store_true",
                   help="with --study: the chain world's arms without the general replay (MoL, CE, CE on feedback "
                        "only, the KL dose, GRPO from MoL with its decision KL in merge_new mode), so that "
                        "forgetting has room to show (study_no_replay.md)")
    p.add_argument("--world", default=None, choices=["chain", "long", "digit", "library"],
                   help="the built-in world: chain (default: the hidden rule applied 1-6 times, every step written "
                        "out; see molrl.demo.chain), long (the same with 1-24 steps, long-tailed), digit (one "
                        "hidden digit per answer) or library (code tasks against a library only the sandbox runs, "
                        "see molrl.demo.library); --study runs on chain or digit, --model on chain or library")
    p.add_argument("--out", default=None,
                   help="run directory (default runs/demo, runs/study, runs/demo_WORLD or runs/study_WORLD for "
                        "other worlds, with _quick after --quick)")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from molrl.demo.run import run_demo
    from molrl.study.run import run_study
    from molrl.errors import MolrlError

    if args.describe:
        from molrl.config import describe
        from molrl.pipeline.config import PipelineConfig

        print("\n".join(describe(PipelineConfig)))
        return 0

    if args.study and args.world not in (None, "chain", "digit"):
        raise MolrlError(f"--study runs on the chain world (the default) or --world digit, not --world {args.world}")
    world = args.world or "chain"
    if args.model and (args.study or args.teacher or world not in ("chain", "library")):
        raise MolrlError("--model runs the demo's chain world (or --world library) on a pretrained model: use it "
                         "without --study and --teacher")
    if args.no_replay and (not args.study or world != "chain"):
        raise MolrlError("--no-replay is a study arm set of the chain world: use it with --study (and no --world "
                         "or --world chain)")
    if args.teacher and (world != "long" or args.quick or args.study):
        raise MolrlError("--teacher trains the long world's full base longer: use it with --world long, "
                         "without --quick or --study")
    preset = "quick" if args.quick else "teacher" if args.teacher else "default"
    name = ("study" if args.study else "demo") + ("" if world == "chain" else f"_{world}")
    name += "_no_replay" if args.no_replay else "_pretrained" if args.model else ""
    name += "" if preset == "default" else f"_{preset}"
    out = args.out or f"runs/{name}"
    if args.study:
        report = run_study(out, quick=args.quick, seeds=args.seeds or 3, overrides=args.overrides, world=world,
                           replay=not args.no_replay)
    else:
        report = run_demo(out, preset, args.overrides, seeds=args.seeds or 1,
                          config=args.config, world=world, model=args.model)
        if args.model:
            from molrl.study.headline import write_headline

            if world == "library":
                from molrl.study.headline import LIBRARY_INTRO

                report = write_headline(out, args.seeds or 1, args.model, task="library world", intro=LIBRARY_INTRO)
            else:
                report = write_headline(out, args.seeds or 1, args.model)
    print(report)
    return 0
