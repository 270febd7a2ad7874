"""Where jobs execute: the ``Backend`` interface and the local pool of pre-forked worker slots.

A backend takes raw jobs (plain dicts, see ``SandboxPool``) and returns raw outcomes in the same
order. ``LocalBackend`` keeps one long-lived worker per slot, each inside its own bubblewrap
sandbox (network, pid, ipc and uts namespaces, read-only system binds, a size-limited private
/tmp) with its own pair of unprivileged uids. A remote execution service plugs in by
implementing ``execute`` and ``close``.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from molrl.sandbox.runtime import task as wire
from molrl.sandbox.types import SandboxConfig

log = logging.getLogger(__name__)

RUNTIME_DIR = Path(__file__).resolve().parent / "runtime"
SANDBOX_RUNTIME = "/opt/molrl/runtime"
"""Where the runtime directory appears inside a bubblewrap sandbox."""
THREAD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}


class Backend(ABC):
    """Runs raw jobs; implementations: ``LocalBackend`` here, a remote service elsewhere."""

    name: str = "backend"

    @abstractmethod
    def execute(self, jobs: list[dict]) -> list[dict]:
        """Run ``jobs`` (in parallel where possible); one raw outcome dict per job, in order."""

    @abstractmethod
    def close(self) -> None:
        """Stop every worker and remove every temporary file."""


_PROCESS_WARNING = (
    "sandbox: running tasks as plain processes WITHOUT network, pid or mount isolation (the host "
    "filesystem is readable where permissions allow; local services are reachable unless seccomp blocks sockets)"
)


def detect_backend(cfg: SandboxConfig) -> str:
    """'bwrap' when bubblewrap can create a sandbox here, else 'process' (logging what is lost)."""
    if cfg.backend == "process":
        log.warning(_PROCESS_WARNING)
        return "process"
    bwrap = shutil.which("bwrap")
    works = False
    if bwrap:
        probe = [bwrap, "--unshare-net", "--unshare-pid", "--ro-bind", "/", "/", "true"]
        works = subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    if works:
        return "bwrap"
    if cfg.backend == "bwrap":
        from molrl.errors import MolrlError

        raise MolrlError("sandbox.backend=bwrap but bubblewrap is missing or cannot create namespaces here; install the 'bubblewrap' package or set sandbox.backend=process")
    log.warning("sandbox: bubblewrap unavailable here. " + _PROCESS_WARNING)
    return "process"


class _Slot:
    """One long-lived worker process and its uids."""

    def __init__(self, index: int, cfg: SandboxConfig, backend: str, uid: int):
        self.index, self.cfg, self.backend, self.uid = index, cfg, backend, uid
        self.host_dir = tempfile.mkdtemp(prefix="molrl-slot-") if backend == "process" else None
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        """How many times this slot's worker was found hung or dead and replaced."""
        self.start()

    def _command(self) -> list[str]:
        root = "/tmp/slot" if self.backend == "bwrap" else self.host_dir
        slot = {"uid": self.uid, "judge_uid": self.uid + 1, "root": root,
                "seccomp": self.cfg.seccomp, "preimport": list(self.cfg.preimport)}
        if self.backend == "process":
            return [sys.executable, "-I", str(RUNTIME_DIR / "worker.py"), json.dumps(slot)]
        return bwrap_command(self.cfg) + [sys.executable, "-I", f"{SANDBOX_RUNTIME}/worker.py", json.dumps(slot)]

    def start(self) -> None:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **THREAD_ENV}
        self.proc = subprocess.Popen(self._command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, cwd=self.host_dir or "/")
        hello = self._read(time.monotonic() + 120)
        if not isinstance(hello, dict) or not hello.get("ready"):
            err = self._stderr()
            self.stop()
            raise RuntimeError(f"sandbox worker {self.index} failed to start: {err or hello}")
        self.info = hello

    def _read(self, deadline: float):
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return None
        try:
            return wire.read_msg(fd)
        except (OSError, ValueError):
            return None

    def _stderr(self) -> str:
        try:
            os.set_blocking(self.proc.stderr.fileno(), False)
            return (self.proc.stderr.read() or b"").decode(errors="replace")[-2000:]
        except (OSError, ValueError, TypeError):
            return ""

    def execute(self, job: dict) -> dict:
        """Send one job and wait for its outcome; a hung or dead worker is replaced."""
        judge = job.get("judge")
        try:
            if judge:  # the test programs go separately, after the task process is forked
                wire.write_msg(self.proc.stdin.fileno(), dict(job, judge={"entry_point": judge["entry_point"]}))
                wire.write_msg(self.proc.stdin.fileno(), {"sources": judge["sources"]})
            else:
                wire.write_msg(self.proc.stdin.fileno(), job)
        except OSError as err:
            return self._replace(f"worker {self.index} gone: {err}")
        out = self._read(time.monotonic() + float(job["timeout_s"]) + self.cfg.worker_grace_s)
        if out is None:
            return self._replace(f"worker {self.index} hung or died ({self._stderr() or 'no message'})")
        return out

    def _replace(self, reason: str) -> dict:
        log.warning("sandbox: %s; restarting it", reason)
        self.restarts += 1
        self.stop()
        self.start()
        return {"status": "sandbox_error", "error": reason}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()
            for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                stream.close()

    def close(self) -> None:
        self.stop()
        if self.host_dir:
            shutil.rmtree(self.host_dir, ignore_errors=True)


def bwrap_command(cfg: SandboxConfig) -> list[str]:
    """The bubblewrap prefix that confines one worker slot."""
    cmd = ["bwrap", "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
           "--unshare-cgroup-try", "--new-session", "--hostname", "sandbox",
           "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    python_dirs = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    python_dirs |= {sys.prefix, os.path.dirname(os.path.realpath(sys.executable))}
    made: set[str] = set()
    for path in sorted(python_dirs):
        if path.startswith("/usr/") or not os.path.isdir(path):
            continue
        # parents bwrap would create copy the host's modes (/root is 0700): make them traversable
        for parent in reversed(Path(path).parents[:-1]):
            if str(parent) not in made:
                made.add(str(parent))
                cmd += ["--perms", "0755", "--dir", str(parent)]
        cmd += ["--ro-bind", path, path]
    cmd += ["--ro-bind", str(RUNTIME_DIR), SANDBOX_RUNTIME, "--proc", "/proc", "--dev", "/dev",
            "--size", str(cfg.tmpfs_mb << 20), "--tmpfs", "/tmp", "--chdir", "/tmp", "--clearenv",
            "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp"]
    for key, value in THREAD_ENV.items():
        cmd += ["--setenv", key, value]
    if os.geteuid() == 0:
        cmd += ["--cap-drop", "ALL"]
        for cap in ("SETUID", "SETGID", "KILL", "CHOWN", "DAC_OVERRIDE", "FOWNER"):
            cmd += ["--cap-add", f"CAP_{cap}"]
    return cmd


def _world_readable(path: str) -> bool:
    """True when every directory down to ``path`` can be entered by any uid."""
    parts = Path(os.path.realpath(path))
    return all(os.stat(p).st_mode & 0o001 for p in [parts, *parts.parents])


class LocalBackend(Backend):
    """Pre-forked worker slots on this host; jobs are spread over them by a thread per slot."""

    def __init__(self, cfg: SandboxConfig):
        self.cfg = cfg
        self.name = detect_backend(cfg)
        n = cfg.workers or os.cpu_count() or 1
        if os.geteuid() == 0 and self.name == "process" and not _world_readable(sys.base_prefix):
            log.warning("sandbox: %s is not readable by unprivileged uids, so tasks can import only "
                        "the preloaded modules (install Python outside /root or use the bwrap backend)",
                        sys.base_prefix)
        if os.geteuid() != 0:
            log.warning("sandbox: not root, so tasks run under your own uid: a task can signal your "
                        "other processes of that uid and RLIMIT_NPROC counts them too")
        base = 1_000_000 + (os.getpid() % 100_000) * 256
        with ThreadPoolExecutor(max_workers=n) as ex:
            self.slots = list(ex.map(lambda i: _Slot(i, cfg, self.name, base + 2 * i), range(n)))
        if cfg.seccomp and not self.slots[0].info.get("seccomp"):
            log.warning("sandbox: libseccomp not found; tasks may open sockets and call ptrace/mount")
        self.free: queue.SimpleQueue[_Slot] = queue.SimpleQueue()
        for slot in self.slots:
            self.free.put(slot)
        self.executor = ThreadPoolExecutor(max_workers=n, thread_name_prefix="sandbox")
        self._lock = threading.Lock()

    def _one(self, job: dict) -> dict:
        slot = self.free.get()
        try:
            return slot.execute(job)
        except Exception as err:  # noqa: BLE001 - a failed restart must not hang the batch
            log.error("sandbox: worker %d failed: %s", slot.index, err)
            return {"status": "sandbox_error", "error": str(err)}
        finally:
            self.free.put(slot)

    def execute(self, jobs: list[dict]) -> list[dict]:
        return list(self.executor.map(self._one, jobs))

    def close(self) -> None:
        self.executor.shutdown(wait=True)
        for slot in self.slots:
            slot.close()
