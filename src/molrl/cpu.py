"""How many CPU threads a stage should use on a machine it may share.

A torch parallel region waits for its slowest thread, so when another process keeps one of two
cores busy, two torch threads run about three times slower than one (measured on the demo: the
quick preset took 274 s with two threads beside a CPU-bound process, 118 s with one). The demo
therefore asks, before each stage, how many cores are idle right now and uses that many threads,
and while a stage trains, ``ThreadGovernor`` re-asks every few seconds how busy the other
processes keep the machine (``govern_threads`` installs one; ``tick`` is called once per step).

Every CPU stage (``mol``, ``rl``, ``eval``, ``collect``, ``pipeline``, the demo) sets its threads the same way,
through ``use_threads``: a stage's ``threads=N`` fixes the count, otherwise it follows the idle cores like this. An
in-process vLLM engine starts under the same count (``engine_environment``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Iterator, Mapping

log = logging.getLogger(__name__)


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


def own_cpu_seconds() -> float:
    """CPU seconds this process (all its threads) has used."""
    t = os.times()
    return t.user + t.system


def others_busy(busy_s: float, own_s: float, wall_s: float) -> float:
    """Cores kept busy by other processes: the machine's busy CPU seconds minus ours, per wall second.

    >>> others_busy(busy_s=6.0, own_s=2.0, wall_s=2.0), others_busy(busy_s=1.0, own_s=2.0, wall_s=1.0)
    (2.0, 0.0)
    """
    return max(0.0, busy_s - own_s) / wall_s if wall_s > 0 else 0.0


class ThreadGovernor:
    """Sets torch's thread count, every ``every_s`` seconds of ``tick`` calls, to the cores other processes leave idle."""

    def __init__(self, most: int, every_s: float = 5.0):
        self.most, self.every_s = most, every_s
        self.usable = len(os.sched_getaffinity(0))
        self.cores = os.cpu_count() or self.usable
        self.hz = os.sysconf("SC_CLK_TCK")
        self._last = self._reading()

    def _reading(self) -> tuple[float, float, float] | None:
        try:
            busy, _ = cpu_times()
        except (OSError, ValueError, IndexError):
            return None
        return time.monotonic(), busy / self.hz, own_cpu_seconds()

    def tick(self) -> int | None:
        """Re-measure if ``every_s`` has passed; returns the thread count it set, or None."""
        if self._last is None or time.monotonic() - self._last[0] < self.every_s:
            return None
        now = self._reading()
        if now is None:
            return None
        (t0, busy0, own0), (t1, busy1, own1) = self._last, now
        self._last = now
        idle = self.cores - others_busy(busy1 - busy0, own1 - own0, t1 - t0)
        threads = threads_for(idle, self.usable, self.most)
        import torch

        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        return threads


_GOVERNOR: ThreadGovernor | None = None


def govern_threads(most: int | None) -> None:
    """Adjust torch's threads to the idle cores during training (``None``: stop, leave the count as it is)."""
    global _GOVERNOR
    _GOVERNOR = ThreadGovernor(most) if most else None


def tick() -> None:
    """One training step passed: let the installed governor (if any) re-measure the machine."""
    if _GOVERNOR is not None:
        _GOVERNOR.tick()


# The one thread policy of every CPU stage (mol, rl, eval, collect, the pipeline and the demo).

_SCOPE: list[tuple[int | None, int | None]] = []
"""Enclosing ``stage_threads`` scopes, innermost last: (threads, most) that stages inside inherit."""


def fixed_threads(threads: int | None, environ: Mapping[str, str]) -> int | None:
    """A fixed thread count: the config's ``threads``, else a positive ``OMP_NUM_THREADS`` (what torch itself
    would take; ``torchrun`` and ``accelerate launch`` set it to 1 per process); None: follow the idle cores.

    >>> fixed_threads(3, {"OMP_NUM_THREADS": "1"}), fixed_threads(None, {"OMP_NUM_THREADS": "2"}), fixed_threads(None, {})
    (3, 2, None)
    """
    if threads:
        return threads
    omp = environ.get("OMP_NUM_THREADS", "").strip()
    return int(omp) if omp.isdigit() and int(omp) > 0 else None


def share_of_cores(usable: int, environ: Mapping[str, str]) -> int:
    """Most threads one process may take: the cores it may run on, shared among the processes of one machine
    (``LOCAL_WORLD_SIZE`` under a launcher), at least 1.

    >>> share_of_cores(16, {}), share_of_cores(16, {"LOCAL_WORLD_SIZE": "4"}), share_of_cores(2, {"LOCAL_WORLD_SIZE": "8"})
    (16, 4, 1)
    """
    processes = environ.get("LOCAL_WORLD_SIZE", "1")
    return max(1, usable // max(1, int(processes) if processes.isdigit() else 1))


def use_threads(threads: int | None, stage: str, most: int | None = None) -> int:
    """Set torch's CPU threads for ``stage`` and log the count; returns it.

    ``threads`` fixes the count. Unset, a stage takes its enclosing ``stage_threads`` scope's setting (the
    pipeline's, the demo's), else ``OMP_NUM_THREADS`` when the environment sets it, else as many threads as
    cores are idle now (at most ``most``, default this process's share of its cores), re-measured every few
    seconds while it runs (``ThreadGovernor``).
    """
    import torch

    if not threads and _SCOPE:
        threads, most = _SCOPE[-1][0], most or _SCOPE[-1][1]
    fixed = fixed_threads(threads, os.environ)
    if fixed is not None:
        govern_threads(None)
        count, why = fixed, f"threads={threads}" if threads else "OMP_NUM_THREADS"
    else:
        most = most or share_of_cores(len(os.sched_getaffinity(0)), os.environ)
        if _GOVERNOR is not None and _GOVERNOR.most == most:  # the stage before left one running: keep measuring
            count = torch.get_num_threads()
        else:
            count = idle_threads(most)
            govern_threads(most)
        why = f"the idle cores, at most {most}, re-measured while it runs; threads=N fixes it"
    torch.set_num_threads(count)
    log.info("%s: torch threads: %d (%s)", stage, count, why)
    return count


@contextlib.contextmanager
def stage_threads(threads: int | None, most: int | None = None) -> Iterator[None]:
    """Stages run inside take ``threads`` (or the idle cores, at most ``most``) unless their own config fixes a
    count; on leaving, the governor stops and torch's count is restored."""
    import torch

    before = torch.get_num_threads()
    outer = _SCOPE[-1] if _SCOPE else (None, None)
    _SCOPE.append((threads or outer[0], most or outer[1]))
    try:
        yield
    finally:
        _SCOPE.pop()
        govern_threads(None)
        torch.set_num_threads(before)


def engine_environment(threads: int, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables an in-process vLLM engine on a CPU starts under, for the stage's ``threads`` (``use_threads``).

    In this process the engine computes on torch's threads, which the stage's policy sets; its own CPU thread
    setup only runs in worker processes (``VLLM_ENABLE_V1_MULTIPROCESSING=1``), and there it would take every
    physical core but one and pin a thread to each (``VLLM_CPU_OMP_THREADS_BIND=auto``), whatever other processes
    keep busy: a pinned thread cannot leave a busy core, and every parallel region of a decoding step waits for it.
    So: the stage's count (``OMP_NUM_THREADS``, which worker processes read) and no pinning, unless the environment
    already names a binding.

    >>> engine_environment(2, {})
    {'OMP_NUM_THREADS': '2', 'VLLM_CPU_OMP_THREADS_BIND': 'nobind'}
    >>> engine_environment(1, {"VLLM_CPU_OMP_THREADS_BIND": "0-3"})["VLLM_CPU_OMP_THREADS_BIND"]
    '0-3'
    """
    return {"OMP_NUM_THREADS": str(max(1, threads)),
            "VLLM_CPU_OMP_THREADS_BIND": environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")}
