"""``molrl pipeline``: collect -> MoL -> RL -> eval in one run directory, ending with report.md.

    molrl pipeline --config configs/pipeline_qwen3_8b.yaml [key.sub=value ...]
    molrl pipeline --config configs/pipeline_tiny.yaml stages=[mol,rl,eval] traces=[t.jsonl] ...
    molrl pipeline --describe       # every pipeline key with its default and meaning
    molrl pipeline --report RUN_DIR # rebuild report.md of a run from what is on disk

Re-running the same command skips finished stages and resumes an interrupted one.
"""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    from molrl.cli import add_stage_parser

    p = add_stage_parser(subparsers, "pipeline", help="the whole method: collect, MoL, GRPO, eval and report.md, resumable",
                         doc=__doc__, config="PipelineConfig", example="mol.train.epochs=3")
    p.add_argument("--report", metavar="RUN_DIR", help="only rebuild RUN_DIR/report.md")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from molrl.config import describe
    from molrl.records.input_checks import check_inputs
    from molrl.pipeline import run_pipeline
    from molrl.pipeline.config import PipelineConfig, load_pipeline_config

    if args.describe:
        print("\n".join(describe(PipelineConfig)))
        return 0
    if args.report:
        from molrl.report import write_report

        print(write_report(args.report))
        return 0
    cfg = load_pipeline_config(args.config, args.overrides)
    check_inputs("pipeline", cfg)
    out = run_pipeline(cfg)
    print(out / "report.md")
    return 0
