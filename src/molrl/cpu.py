"""How many CPU threads a stage should use on a machine it may share.

A torch parallel region waits for its slowest thread, so when another process keeps one of two
cores busy, two torch threads run about three times slower than one (measured on the demo: the
quick preset took 274 s with two threads beside a CPU-bound process, 118 s with one). The demo
therefore asks, before each stage, how many cores are idle right now and uses that many threads.
"""

from __future__ import annotations

import os
import time


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    with open("/proc/stat") as fh:
        fields = [float(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    return total - idle, total


def busy_cores(before: tuple[float, float], after: tuple[float, float], cores: int) -> float:
    """Cores kept busy between two ``cpu_times`` readings (0 .. ``cores``)."""
    busy, total = after[0] - before[0], after[1] - before[1]
    return cores * busy / total if total > 0 else 0.0


def threads_for(idle: float, usable: int, most: int) -> int:
    """Threads for a new compute stage: the idle cores (rounded to the nearest), at least 1, at most
    ``usable`` (the cores this process may run on) and ``most``.

    >>> threads_for(1.9, 2, 2), threads_for(1.1, 2, 2), threads_for(0.4, 2, 2), threads_for(15.0, 16, 4)
    (2, 1, 1, 4)
    """
    return max(1, min(most, usable, round(idle)))


def idle_threads(most: int, interval_s: float = 0.3) -> int:
    """How many threads to use now: the machine's cores that were idle over ``interval_s``."""
    usable = len(os.sched_getaffinity(0))
    cores = os.cpu_count() or usable
    try:
        before = cpu_times()
        time.sleep(interval_s)
        after = cpu_times()
    except (OSError, ValueError, IndexError):  # no /proc/stat: assume the machine is ours
        return max(1, min(most, usable))
    return threads_for(cores - busy_cores(before, after, cores), usable, most)
