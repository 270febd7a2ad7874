"""``molrl export``: turn a trained adapter into a standalone model directory.

    molrl export --merge --adapter runs/mol/adapter --out runs/mol/merged [--base MODEL] [--dtype bfloat16]

The base model is read from the adapter's ``adapter_config.json`` unless ``--base`` is given
(``tiny:chatml`` / ``tiny:llama3`` for in-process tiny models). The result, with the tokenizer,
loads with plain ``transformers.AutoModelForCausalLM.from_pretrained``.
"""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "export",
        help="merge a LoRA adapter into its base model and save a plain transformers model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--merge", action="store_true", required=True, help="merge the adapter into the base weights")
    p.add_argument("--adapter", required=True, help="PEFT adapter directory (e.g. runs/mol/adapter)")
    p.add_argument("--out", required=True, help="directory to write the merged model and tokenizer to")
    p.add_argument("--base", help="base model (default: the adapter's base_model_name_or_path)")
    p.add_argument("--dtype", default="float32", help="dtype to load and save in (float32 / bfloat16)")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from molrl.mol.export import merge_adapter

    out = merge_adapter(args.adapter, args.out, base=args.base, dtype=args.dtype)
    log.info("merged model written to %s", out)
    return 0
