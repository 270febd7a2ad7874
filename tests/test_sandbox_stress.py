"""Many executions with 10% timeouts leave no stray process, no temp dir, no hung worker."""

from __future__ import annotations

import os
import tempfile

import pytest

from molrl.sandbox import ExecJob, SandboxConfig, SandboxPool

from test_sandbox_attacks import live_processes


def jobs(n: int) -> list[tuple[ExecJob, str]]:
    """n distinct jobs (the cache cannot help): every 10th loops past its deadline, others leave
    grandchildren, temp files and output behind."""
    out = []
    for i in range(n):
        if i % 10 == 0:
            out.append((ExecJob(f"# {i}\nwhile True:\n    pass", timeout_s=0.1), "timeout"))
        elif i % 10 == 5:
            code = f"import os, subprocess\nopen('f{i}', 'w').write('x' * 1000)\nif os.fork() == 0:\n    os.setsid()\n    os.execv('/bin/sleep', ['sleep', '30'])\nprint({i})"
            out.append((ExecJob(code, timeout_s=5), "ok"))
        else:
            out.append((ExecJob(f"print({i} * 3)", timeout_s=5), "ok"))
    return out


def run_stress(n: int, backend: str = "auto") -> None:
    tmp_before = set(os.listdir(tempfile.gettempdir()))
    cfg = SandboxConfig(workers=2, cache_size=0, backend=backend)
    with SandboxPool(cfg) as pool:
        pids = [slot.proc.pid for slot in pool.backend.slots]
        uids = {u for slot in pool.backend.slots for u in (slot.uid, slot.uid + 1)}
        batch = jobs(n)
        results = pool.run_many([job for job, _ in batch])
        assert [r.status for r in results] == [want for _, want in batch]
        assert all(r.stdout in ("", f"{i * 3}\n", f"{i}\n") for i, r in enumerate(results))
        assert live_processes(uids) == []
        assert [slot.proc.pid for slot in pool.backend.slots] == pids
        assert sum(slot.restarts for slot in pool.backend.slots) == 0
        # every timed-out job's processes reaped within the worker's grace (else its slot would be restarted): a
        # property, not a speed; a loaded machine took 3.8 s where an idle one takes milliseconds
        assert max(r.info["reap_ms"] for r in results if r.status == "timeout") < cfg.worker_grace_s * 1000
        cgroups = [slot.cgroup.path for slot in pool.backend.slots if slot.cgroup.path is not None]
    assert not any(path.exists() for path in cgroups)
    leaked = {name for name in set(os.listdir(tempfile.gettempdir())) - tmp_before if name.startswith("molrl-")}
    assert leaked == set()


@pytest.mark.skipif(os.geteuid() != 0, reason="uid-based leak checks need root")
def test_three_hundred_executions_leave_nothing_behind():
    run_stress(300)


@pytest.mark.skipif(os.geteuid() != 0, reason="uid-based leak checks need root")
def test_process_backend_leaves_no_temp_dir():
    run_stress(40, backend="process")


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="uid-based leak checks need root")
def test_ten_thousand_executions_leave_nothing_behind():
    run_stress(10_000)
