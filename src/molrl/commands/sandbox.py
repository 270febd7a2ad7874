"""``molrl sandbox run FILE.py``: run one file in the sandbox and print the result as JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

from molrl.errors import MolrlError


def register(subparsers) -> None:
    """Add ``molrl sandbox run``."""
    parser = subparsers.add_parser("sandbox", help="run code in the sandbox (debug a reward)")
    sub = parser.add_subparsers(dest="sandbox_command", metavar="ACTION", required=True)
    run = sub.add_parser("run", help="run FILE.py in the sandbox and print the ExecResult as JSON")
    run.add_argument("file", type=Path, help="the Python program to run")
    run.add_argument("--stdin", type=Path, default=None, help="file fed to the program's standard input")
    run.add_argument("--timeout", type=float, default=10.0, help="wall-clock limit in seconds (default 10)")
    run.add_argument("--memory-mb", type=int, default=1024, help="address-space limit in MiB (default 1024)")
    run.add_argument("--backend", choices=["auto", "bwrap", "process"], default="auto", help="isolation backend")
    run.set_defaults(func=run_file)


def run_file(args: argparse.Namespace) -> int:
    """Run the file once; exit status 0 when it ran ok, 1 otherwise."""
    from molrl.config import check_values
    from molrl.sandbox import SandboxConfig, SandboxPool

    for path in (args.file, args.stdin):
        if path is not None and not path.is_file():
            raise MolrlError(f"{path}: file not found")
    code = args.file.read_text(encoding="utf-8")
    stdin = args.stdin.read_text(encoding="utf-8") if args.stdin else None
    cfg = SandboxConfig(workers=1, timeout_s=args.timeout, memory_mb=args.memory_mb, backend=args.backend,
                        cache_size=0, preimport=[])
    check_values(cfg, "molrl sandbox run (--timeout sets timeout_s, --memory-mb memory_mb)")
    with SandboxPool(cfg) as pool:
        result = pool.run(code, stdin=stdin)
    print(result.to_json())
    return 0 if result.status == "ok" else 1
