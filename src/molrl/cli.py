"""The ``molrl`` console script: one subcommand per stage.

Each stage lives in ``molrl.commands.<name>`` and exposes ``register(subparsers)``, which adds
its parser and sets ``func`` to a handler taking the parsed namespace. Heavy imports (torch,
transformers) happen inside handlers so ``molrl --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from molrl import __version__

# Stage modules in the order ``molrl --help`` lists them.
COMMANDS = [
    "molrl.commands.traces",
    "molrl.commands.collect",
    "molrl.commands.eval",
    "molrl.commands.mol",
    "molrl.commands.export",
    "molrl.commands.rl",
    "molrl.commands.serve",
    "molrl.commands.sandbox",
    "molrl.commands.pipeline",
    "molrl.commands.demo",
]


def count(text: str) -> int:
    """An integer flag of 1 or more (an argparse ``type``): 0 or less is refused as the flag is read."""
    return _at_least(text, 1)


def natural(text: str) -> int:
    """An integer flag of 0 or more (an argparse ``type``): a negative one is refused as the flag is read."""
    return _at_least(text, 0)


def _at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"{value}: give {low} or more")
    return value


def add_stage_parser(
    subparsers: argparse._SubParsersAction, name: str, *, help: str, doc: str | None, config: str, example: str,
    aliases: list[str] | None = None, overrides_help: str | None = None,
) -> argparse.ArgumentParser:
    """A stage's subparser with the common ``key=value`` overrides (``overrides_help``: their help, when the
    positional arguments take more than overrides), ``--config`` and ``--describe``."""
    p = subparsers.add_parser(name, help=help, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter,
                              aliases=aliases or [])
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help=overrides_help or f"config overrides, e.g. {example}")
    p.add_argument("--config", help=f"YAML {config} file (see configs/)")
    p.add_argument("--describe", action="store_true", help="print every config key with its default and meaning, then exit")
    return p


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser with every registered stage."""
    parser = argparse.ArgumentParser(
        prog="molrl",
        description="MoL-RL: absorb multi-step environment feedback into an LLM, then reason without it.",
    )
    parser.add_argument("--version", action="version", version=f"molrl {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="detail: debug logging, third-party warnings, every raw training log line")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def setup_logging(verbose: bool = False) -> None:
    """Console logging for every stage (``molrl.logs.console``): quiet by default, detailed with -v."""
    from molrl.logs.console import setup_logging as setup

    setup(verbose)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``molrl`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    setup_logging(args.verbose)
    from molrl.errors import MolrlError

    try:
        return int(args.func(args) or 0)
    except MolrlError as err:
        logging.getLogger("molrl").error(str(err))
        return 1
    except KeyboardInterrupt:
        logging.getLogger("molrl").error("interrupted; re-run the same command to resume")
        return 130


if __name__ == "__main__":
    sys.exit(main())
