"""A memory cap for a whole worker slot through a cgroup, where the host lets us make one.

RLIMIT_AS bounds each task process; a task that forks up to ``max_processes`` children could
still hold ``max_processes * memory_mb`` in total. A per-slot memory cgroup bounds the sum. Both
cgroup v2 (``memory.max``) and v1 (``memory.limit_in_bytes``) are handled; when neither is
writable the caller logs that the cap is missing.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_memory_cgroup() -> tuple[Path, str] | None:
    """(directory of this process's memory cgroup, limit file name), or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # v1 memory hierarchy
            base = CGROUP_ROOT / "memory"
            return base / path.lstrip("/"), "memory.limit_in_bytes"
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: usable when the memory controller is enabled below us
            for base in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
                here = base / path.lstrip("/")
                try:
                    if "memory" in (here / "cgroup.subtree_control").read_text().split():
                        return here, "memory.max"
                except OSError:
                    continue
    return None


class SlotCgroup:
    """A memory cgroup holding one slot's processes; ``None``-safe no-op when unavailable."""

    def __init__(self, name: str, limit_mb: int):
        self.path: Path | None = None
        found = _own_memory_cgroup()
        if found is None:
            return
        parent, self.limit_file = found
        path = parent / name
        try:
            path.mkdir(exist_ok=True)
            (path / self.limit_file).write_text(str(limit_mb << 20))
        except OSError as err:
            log.debug("no memory cgroup at %s: %s", path, err)
            try:
                path.rmdir()
            except OSError:
                pass
            return
        self.path = path

    def add(self, pids: list[int]) -> None:
        """Move processes (and so all their future children) into the cgroup."""
        if self.path is None:
            return
        for pid in pids:
            try:
                (self.path / "cgroup.procs").write_text(str(pid))
            except OSError:  # already gone
                pass

    def oom_kills(self) -> int:
        """How many processes the kernel killed for exceeding the cap so far (0 without a cgroup)."""
        if self.path is None:
            return 0
        events = "memory.oom_control" if self.limit_file == "memory.limit_in_bytes" else "memory.events"
        try:
            for line in (self.path / events).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def remove(self) -> None:
        """Delete the cgroup (its processes must have exited)."""
        if self.path is None:
            return
        for _ in range(100):  # the slot's last processes may still be exiting
            try:
                os.rmdir(self.path)
                break
            except OSError as err:
                last = err
                time.sleep(0.02)
        else:
            log.warning("sandbox: could not remove cgroup %s: %s", self.path, last)
        self.path = None
