"""A trainer killed with SIGKILL mid-job leaves no process of its sandbox slots behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from molrl.sandbox.runtime.cleanup import descendants

TRAINER = (
    "import sys\nfrom molrl.sandbox import SandboxConfig, SandboxPool\n"
    "pool = SandboxPool(SandboxConfig(workers=1, timeout_s=60, cache_size=0, backend=sys.argv[1]))\n"
    "print('ready', flush=True)\n"
    "sys.stdin.readline()\n"
    "pool.run('import time\\ntime.sleep(60)')\n"
)
"""A stand-in trainer: holds a pool of one slot and, once told to on stdin, runs a job that lasts a minute."""


def _alive(pids: set[int]) -> list[int]:
    """The pids of ``pids`` that are still running (a zombie has ended, it only waits to be reaped)."""
    alive = []
    for pid in sorted(pids):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.append(pid)
    return alive


@pytest.mark.parametrize("backend", ["auto", "process"])
def test_no_process_of_the_slot_outlives_a_trainer_killed_mid_job(backend):
    # before the job server watched its job pipe, all 6 (bwrap: outer, init, worker, 2 zygotes, task;
    # process backend: 4) ran on to the job's 60 s deadline
    env = dict(os.environ, OMP_NUM_THREADS="1")
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, backend], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, env=env)
    slot: set[int] = set()
    try:
        assert trainer.stdout.readline() == "ready\n"
        idle = descendants(trainer.pid) or set()  # bwrap, the worker, its zygotes
        trainer.stdin.write("go\n")  # the job starts only now, after the idle slot was seen
        trainer.stdin.flush()
        deadline = time.monotonic() + 30
        while not slot - idle and time.monotonic() < deadline:  # until a process the idle slot lacked is up: the job's
            time.sleep(0.02)  # (a set, not a count: a start-up helper of the idle slot may have ended meanwhile)
            slot = descendants(trainer.pid) or set()
        assert slot - idle, "the job never started"
        os.kill(trainer.pid, signal.SIGKILL)
        trainer.wait()
        gone_by = time.monotonic() + 20.0  # far inside the job's 60 s, however loaded the machine
        while _alive(slot) and time.monotonic() < gone_by:
            time.sleep(0.02)
        assert _alive(slot) == [], f"{len(_alive(slot))} of the slot's {len(slot)} processes outlived the trainer by 20 s"
    finally:
        trainer.kill()
        trainer.wait()
        for pid in _alive(slot):  # leave nothing running if the test failed
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
