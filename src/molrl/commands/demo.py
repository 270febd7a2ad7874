"""``molrl demo``: the whole method on a laptop CPU, in a world molrl builds itself.

    molrl demo                 # 5-6 minutes on 2 cores: runs/demo/pipeline/report.md
    molrl demo --quick         # the same steps, smaller, in about 2 minutes
    molrl demo --out DIR [key.sub=value ...]   # pipeline overrides, e.g. grpo.max_steps=60

A hidden digit rule that only code execution reveals, a tiny base model trained from scratch
to use the tool, then the real pipeline: collection in the sandbox, MoL and its ablations,
GRPO and Dr.GRPO, single-step evaluation on held-out problems and general tasks, report.md.
Re-running with the same --out reuses finished steps.
"""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo",
        help="the whole method end to end on a self-built tiny world (CPU, minutes)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("overrides", nargs="*", metavar="key=value", help="overrides of configs/pipeline_tiny.yaml")
    p.add_argument("--quick", action="store_true", help="the small preset (about 2 minutes)")
    p.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="repeat with world and training seeds 0..N-1 and report the headline over seeds (N times as long)")
    p.add_argument("--out", default=None, help="run directory (default runs/demo, or runs/demo_quick with --quick)")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from molrl.demo.run import run_demo

    preset = "quick" if args.quick else "default"
    out = args.out or ("runs/demo_quick" if args.quick else "runs/demo")
    report = run_demo(out, preset, args.overrides, seeds=args.seeds)
    print(report)
    return 0
