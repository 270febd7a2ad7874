"""``molrl export``: turn a trained adapter, or a GGUF file, into a standalone model directory.

    molrl export --merge --adapter runs/mol/adapter --out runs/mol/merged [--base MODEL] [--dtype bfloat16]
    molrl export --gguf models/SmolLM2-135M-Instruct.Q4_1.gguf --out models/smollm2-135m

The base model is read from the adapter's ``adapter_config.json`` unless ``--base`` is given
(``tiny:chatml`` / ``tiny:llama3`` for in-process tiny models). ``--gguf`` dequantises a GGUF file
(llama.cpp's format; transformers reads it with the ``gguf`` package) into plain weights. Either
result, with the tokenizer, loads with plain ``transformers.AutoModelForCausalLM.from_pretrained``
and every molrl stage takes it as ``model=DIR``. ``--out`` is written whole or not at all (a killed export
leaves the folder that was there before, or none), and one run at a time writes it.
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
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--merge", action="store_true", help="merge the adapter into the base weights")
    mode.add_argument("--gguf", help="a GGUF model file to dequantise into a plain transformers directory")
    p.add_argument("--adapter", help="PEFT adapter directory (e.g. runs/mol/adapter), with --merge")
    p.add_argument("--out", required=True, help="directory to write the merged model and tokenizer to")
    p.add_argument("--base", help="base model (default: the adapter's base_model_name_or_path)")
    p.add_argument("--dtype", default="float32", help="dtype to load and save in (float32 / bfloat16)")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    """Run ``molrl export`` with ``--out`` held for this run."""
    from molrl.records.locks import folder_lock

    with folder_lock(args.out, "give another --out", stage="export"):  # one run, of one stage, in an output folder
        return _export(args)


def _export(args: argparse.Namespace) -> int:
    from molrl.errors import MolrlError
    from molrl.engines.export import convert_gguf, merge_adapter  # torch and transformers: after the arguments parse

    if args.gguf:
        out = convert_gguf(args.gguf, args.out, dtype=args.dtype)
        log.info("plain model written to %s", out)
        return 0
    if not args.adapter:
        raise MolrlError("molrl export --merge needs --adapter DIR (the PEFT adapter to merge)")
    out = merge_adapter(args.adapter, args.out, base=args.base, dtype=args.dtype)
    log.info("merged model written to %s", out)
    return 0
