"""``molrl sandbox run FILE.py``: run one file in the sandbox and print the result as JSON; ``molrl sandbox serve``:
the sandbox pool behind an HTTP port, for trainers on other machines (``sandbox.backend: remote``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from molrl.errors import MolrlError


def register(subparsers) -> None:
    """Add ``molrl sandbox run`` and ``molrl sandbox serve``."""
    from molrl.cli import count, natural

    parser = subparsers.add_parser("sandbox", help="run code in the sandbox (debug a reward)")
    sub = parser.add_subparsers(dest="sandbox_command", metavar="ACTION", required=True)
    run = sub.add_parser("run", help="run FILE.py in the sandbox and print the ExecResult as JSON")
    run.add_argument("file", type=Path, help="the Python program to run")
    run.add_argument("--stdin", type=Path, default=None, help="file fed to the program's standard input")
    run.add_argument("--timeout", type=float, default=10.0, help="wall-clock limit in seconds (default 10)")
    run.add_argument("--memory-mb", type=int, default=1024, help="address-space limit in MiB (default 1024)")
    run.add_argument("--backend", choices=["auto", "bwrap", "process"], default="auto", help="isolation backend")
    run.add_argument("--server", default=None, metavar="URL",
                     help="run it on this sandbox server (molrl sandbox serve, or a run_code service) instead")
    run.set_defaults(func=run_file)
    serve = sub.add_parser("serve", help="serve the sandbox pool over HTTP (molrl's batch protocol and run_code)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 exposes the "
                       "sandbox to the network: anyone who reaches the port runs code in it)")
    serve.add_argument("--port", type=natural, default=8300, help="port (default 8300; 0: any free port)")
    serve.add_argument("--workers", type=natural, default=0, help="slots run in parallel (default: two per core)")
    serve.add_argument("--backend", choices=["auto", "bwrap", "process"], default="auto", help="isolation backend")
    serve.add_argument("--queue-limit", type=natural, default=0,
                       help="jobs waiting or running before a request is answered busy (default: 8 per slot, at least 64)")
    serve.add_argument("--max-request-mb", type=float, default=16.0, help="largest request body (default 16)")
    for key, default, what in SERVE_CEILINGS:
        serve.add_argument(f"--{key.replace('_', '-')}", type=float if isinstance(default, float) else count,
                           default=default, help=f"largest {what} a job may ask (default {default})")
    serve.add_argument("--tmpfs-mb", type=count, default=256, help="each slot's private /tmp (bwrap backend)")
    serve.add_argument("--slot-memory-mb", type=natural, default=0,
                       help="memory cap of a whole slot via a cgroup where the host allows one (0: 2 x --memory-mb + 256)")
    serve.add_argument("--preimport", default=None, metavar="M1,M2",
                       help="modules each slot imports once (default: numpy, math, re and other common ones)")
    serve.set_defaults(func=serve_pool)


SERVE_CEILINGS = (("timeout_s", 120.0, "wall-clock limit in seconds"), ("memory_mb", 4096, "address space in MiB"),
                  ("max_output_kb", 1024, "stdout / stderr head in KiB"), ("max_file_mb", 64, "file in MiB"),
                  ("max_processes", 64, "process count"), ("max_result_kb", 16384, "block of return values in KiB"))
"""The limits that travel with each job, as ``molrl sandbox serve`` caps them: (key, default ceiling, what)."""


def serve_pool(args: argparse.Namespace) -> int:
    """Serve until interrupted or terminated."""
    import logging
    import signal

    from molrl.config import check_values
    from molrl.sandbox import SandboxConfig
    from molrl.sandbox.remote.server import SandboxServer, ServeConfig

    ceilings = {key: getattr(args, key) for key, _, _ in SERVE_CEILINGS}
    own = {"preimport": [m for m in args.preimport.split(",") if m]} if args.preimport is not None else {}
    cfg = SandboxConfig(workers=args.workers, backend=args.backend, tmpfs_mb=args.tmpfs_mb, cache_size=0,
                        slot_memory_mb=args.slot_memory_mb, **own, **ceilings)
    check_values(cfg, "molrl sandbox serve")
    if args.port > 65535 or args.max_request_mb <= 0:
        raise MolrlError("molrl sandbox serve: --port is 0-65535 and --max-request-mb more than 0")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    server = SandboxServer(ServeConfig(sandbox=cfg, host=args.host, port=args.port, queue_limit=args.queue_limit,
                                       max_request_mb=args.max_request_mb))
    info = server.info()
    print(f"molrl sandbox server on {server.url} ({info['slots']} slots, {info['backend']} backend, queue limit "
          f"{info['queue_limit']} jobs)", flush=True)
    def stop(*_: object) -> None:  # SIGTERM (a launcher's stop) ends it as Ctrl-C does: the pool is closed
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


def run_file(args: argparse.Namespace) -> int:
    """Run the file once; exit status 0 when it ran ok, 1 otherwise."""
    from molrl.config import check_values
    from molrl.sandbox import SandboxConfig, SandboxPool

    for path in (args.file, args.stdin):
        if path is not None and not path.is_file():
            raise MolrlError(f"{path}: file not found")
    code = args.file.read_text(encoding="utf-8")
    stdin = args.stdin.read_text(encoding="utf-8") if args.stdin else None
    remote = {"backend": "remote", "servers": [args.server]} if args.server else {"backend": args.backend, "preimport": []}
    cfg = SandboxConfig(workers=1, timeout_s=args.timeout, memory_mb=args.memory_mb, cache_size=0, **remote)
    check_values(cfg, "molrl sandbox run (--timeout sets timeout_s, --memory-mb memory_mb)")
    with SandboxPool(cfg) as pool:
        result = pool.run(code, stdin=stdin)
    print(result.to_json())
    return 0 if result.status == "ok" else 1
