"""The command that starts a sandbox worker: the bubblewrap prefix that confines one slot, and what it sees.

A worker runs ``runtime/worker.py`` (bound read-only at ``SANDBOX_RUNTIME``) under ``bwrap_command`` with a
/dev of only ``DEVICES`` and single-threaded numeric libraries (``THREAD_ENV``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from molrl.sandbox.types import SandboxConfig

RUNTIME_DIR = Path(__file__).resolve().parent / "runtime"
SANDBOX_RUNTIME = "/opt/molrl/runtime"
"""Where the runtime directory appears inside a bubblewrap sandbox."""
THREAD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}


def bwrap_command(cfg: SandboxConfig) -> list[str]:
    """The bubblewrap prefix that confines one worker slot."""
    cmd = ["bwrap", "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
           "--unshare-cgroup-try", "--new-session", "--hostname", "sandbox",
           "--ro-bind", "/usr", "/usr",
           # the private /tmp comes before the Python binds: an interpreter or venv under /tmp
           # (a checkout in /tmp, say) is then bound on top of it rather than hidden by it
           "--size", str(cfg.tmpfs_mb << 20), "--tmpfs", "/tmp"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    python_dirs = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    python_dirs |= {sys.prefix, os.path.dirname(os.path.realpath(sys.executable))}
    made: set[str] = set()
    bound: list[str] = []
    for path in sorted(python_dirs):
        if path.startswith("/usr/") or not os.path.isdir(path) or any(path.startswith(b + "/") for b in bound):
            continue
        bound.append(path)
        # parents bwrap would create copy the host's modes (/root is 0700): make them traversable
        for parent in reversed(Path(path).parents[:-1]):
            if str(parent) not in made:
                made.add(str(parent))
                cmd += ["--perms", "0755", "--dir", str(parent)]
        cmd += ["--ro-bind", path, path]
    cmd += ["--ro-bind", str(RUNTIME_DIR), SANDBOX_RUNTIME, "--proc", "/proc", *dev_args(),
            "--chdir", "/tmp", "--clearenv",
            "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp"]
    for key, value in THREAD_ENV.items():
        cmd += ["--setenv", key, value]
    if os.geteuid() == 0:
        cmd += ["--cap-drop", "ALL"]
        for cap in ("SETUID", "SETGID", "KILL", "CHOWN", "DAC_OVERRIDE", "FOWNER"):
            cmd += ["--cap-add", f"CAP_{cap}"]
    return cmd


DEVICES = ("null", "zero", "random", "urandom")
"""The only device nodes in a sandbox's /dev. bwrap's own --dev adds a devpts instance (ptys), whose
count is shared by the whole host: one task could open every pty and leave none for another slot."""


def dev_args() -> list[str]:
    """bwrap arguments for a /dev holding only ``DEVICES`` and the /proc/self/fd links."""
    args = ["--tmpfs", "/dev"]
    for name in DEVICES:
        args += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    args += ["--symlink", "/proc/self/fd", "/dev/fd"]
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        args += ["--symlink", f"/proc/self/fd/{fd}", f"/dev/{name}"]
    return args
