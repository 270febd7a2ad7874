"""Where jobs execute: the ``Backend`` interface and the local pool of pre-forked worker slots.

A backend takes raw jobs (plain dicts, see ``SandboxPool``) and returns raw outcomes in the same
order. ``LocalBackend`` keeps one long-lived worker per slot, each inside its own bubblewrap
sandbox (network, pid, ipc and uts namespaces, read-only system binds, a size-limited private
/tmp, a /dev of four devices) with its own pair of unprivileged uids. A remote execution service plugs in by
implementing ``execute`` and ``close`` (``molrl.sandbox.remote.client.RemoteBackend``); ``molrl.sandbox.pool.open_backend`` picks one.
"""

from __future__ import annotations

import fcntl
import logging
import os
import queue
import shutil
import subprocess
import sys
import tempfile
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from molrl.sandbox.slot import WorkerSlot
from molrl.sandbox.types import SandboxConfig

log = logging.getLogger(__name__)

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
    if cfg.backend == "remote":
        raise ValueError("a remote sandbox config has no local backend; open it with open_backend")
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


def _world_readable(path: str) -> bool:
    """True when every directory down to ``path`` can be entered by any uid."""
    parts = Path(os.path.realpath(path))
    return all(os.stat(p).st_mode & 0o001 for p in [parts, *parts.parents])


MAX_SLOTS = 64
"""Worker slots per pool (each uses two uids from the pool's block of 128)."""
UID_BASE, UID_BLOCK = 1_000_000, 128
UID_BLOCKS = (2**32 - 2 - UID_BASE) // UID_BLOCK
"""Blocks of slot uids between UID_BASE and the largest uid."""


def _registry_dir() -> Path:
    """Where pools on this host record the uid blocks they hold (one locked file per block)."""
    run_lock = Path("/run/lock")
    base = run_lock if os.access(run_lock, os.W_OK) else Path(tempfile.gettempdir())
    path = base / "molrl-uid-blocks"
    path.mkdir(mode=0o755, exist_ok=True)
    return path


def claim_uid_block() -> tuple[int, int]:
    """(first uid of a block of 128 no other live pool on the host holds, the fd that holds it).

    A block is held by an exclusive ``flock`` on its file for as long as the fd stays open, so
    every pool, in this process or another, gets its own uids (kills and RLIMIT_NPROC go by uid)
    and memory cgroups (named by uid); a pool that dies releases its block with its fds.
    """
    registry = _registry_dir()
    for block in range(UID_BLOCKS):
        fd = os.open(registry / f"{block}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return UID_BASE + block * UID_BLOCK, fd
    raise RuntimeError(f"every uid block in {registry} is held")


def _start_slots(cfg: SandboxConfig, backend: str, base: int, n: int) -> list[WorkerSlot]:
    """Start n slots in parallel; if any fails, stop the others and say why."""
    with ThreadPoolExecutor(max_workers=n) as ex:
        futures = [ex.submit(WorkerSlot, i, cfg, backend, base + 2 * i) for i in range(n)]
    slots, errors = [], []
    for future in futures:
        try:
            slots.append(future.result())
        except Exception as err:  # noqa: BLE001 - reported below after cleaning up
            errors.append(err)
    if errors:
        for slot in slots:
            slot.close()
        from molrl.errors import MolrlError

        raise MolrlError(f"sandbox workers failed to start ({backend} backend): {errors[0]}; "
                         "try sandbox.backend=process, or check that bwrap works here")
    return slots


class LocalBackend(Backend):
    """Pre-forked worker slots on this host; jobs are spread over them by a thread per slot."""

    def __init__(self, cfg: SandboxConfig):
        self.cfg = cfg
        self.name = detect_backend(cfg)
        n = min(cfg.workers or 2 * (os.cpu_count() or 1), MAX_SLOTS)
        if os.geteuid() == 0 and self.name == "process" and not _world_readable(sys.base_prefix):
            log.warning("sandbox: %s is not readable by unprivileged uids, so tasks can import only "
                        "the preloaded modules (install Python outside /root or use the bwrap backend)",
                        sys.base_prefix)
        if os.geteuid() != 0:
            log.warning("sandbox: not root, so tasks run under your own uid: a task can signal your "
                        "other processes of that uid and RLIMIT_NPROC counts them too")
        base, self._uid_block = claim_uid_block()
        try:
            self.slots = _start_slots(cfg, self.name, base, n)
        except BaseException:
            os.close(self._uid_block)
            raise
        if not self.slots[0].info.get("slot_memory_cap"):
            log.warning("sandbox: no writable memory cgroup; a task's processes together may use up to "
                        "max_processes x memory_mb (%d MiB)", cfg.max_processes * cfg.memory_mb)
        if cfg.seccomp and not self.slots[0].info.get("seccomp"):
            log.warning("sandbox: libseccomp not found; tasks may open sockets and call ptrace/mount")
        self.free: queue.SimpleQueue[WorkerSlot] = queue.SimpleQueue()
        for slot in self.slots:
            self.free.put(slot)
        self.executor = ThreadPoolExecutor(max_workers=n, thread_name_prefix="sandbox")

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
        if self._uid_block >= 0:
            os.close(self._uid_block)  # the block's uids are free again
            self._uid_block = -1
