"""One worker slot: a long-lived worker process, its uids, and the pipes the pool talks to it over.

Jobs go in on the worker's stdin and outcomes come back on its stdout (length-prefixed JSON).
Assert tests' programs bypass the worker: they go down a separate pipe that only the judge
process reads, and the judge's verdicts come back up another, so the worker never holds a test's
expected values. A worker that hangs, dies or cannot clean up after a job is replaced.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import time

from molrl.sandbox.cgroup import SlotCgroup
from molrl.sandbox.command import RUNTIME_DIR, SANDBOX_RUNTIME, THREAD_ENV, bwrap_command
from molrl.sandbox.runtime import task as wire
from molrl.sandbox.runtime.cleanup import descendants, remove_tree
from molrl.sandbox.types import SandboxConfig

log = logging.getLogger(__name__)

F_SETPIPE_SZ = 1031
PIPE_BYTES = 1 << 20
"""Capacity of the test-program and verdict pipes."""
MAX_SOURCES_BYTES = PIPE_BYTES // 2
"""Largest block of test programs one job may send to its judge."""


def _pipe() -> tuple[int, int]:
    read_fd, write_fd = os.pipe()
    try:
        fcntl.fcntl(write_fd, F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:  # capped by /proc/sys/fs/pipe-max-size: the default size still works
        pass
    return read_fd, write_fd


def _drain(fd: int) -> bytes:
    """Everything readable on a non-blocking fd right now."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


class WorkerSlot:
    """A worker process and the pipes to it; ``execute`` runs one job at a time."""

    def __init__(self, index: int, cfg: SandboxConfig, backend: str, uid: int):
        self.index, self.cfg, self.backend, self.uid = index, cfg, backend, uid
        self.host_dir = tempfile.mkdtemp(prefix="molrl-slot-") if backend == "process" else None
        # normalised: a python started as ../.venv/bin/python has the cwd in its path, which bwrap does not mount
        python = os.path.normpath(sys.executable)
        if backend == "process":
            self.prefix = [python, "-I", str(RUNTIME_DIR / "worker.py")]
        else:
            self.prefix = bwrap_command(cfg) + [python, "-I", f"{SANDBOX_RUNTIME}/worker.py"]
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **THREAD_ENV}
        self.proc: subprocess.Popen | None = None
        limit = cfg.slot_memory_mb or 2 * cfg.memory_mb + 256
        self.cgroup = SlotCgroup(f"molrl-uid{uid}", limit)  # the slot's uid is unique on the host
        self.seq = 0
        self.restarts = 0
        """How many times this slot's worker was found hung or dead and replaced."""
        try:
            self.start()
        except BaseException:
            self.close()
            raise

    def start(self) -> None:
        """Start the worker and wait for it to report ready."""
        src_r, self.sources_w = _pipe()
        self.verdicts_r, verd_w = _pipe()
        self.sources_peek = os.dup(src_r)  # to discard programs a judge never read
        for fd in (self.sources_w, self.verdicts_r, self.sources_peek):
            os.set_blocking(fd, False)
        slot = {"uid": self.uid, "judge_uid": self.uid + 1, "seccomp": self.cfg.seccomp,
                "root": "/tmp/slot" if self.backend == "bwrap" else self.host_dir,
                "preimport": list(self.cfg.preimport), "sources_fd": src_r, "verdicts_fd": verd_w,
                "pid_namespace": self.backend == "bwrap"}
        self.proc = subprocess.Popen(self.prefix + [json.dumps(slot)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env,
                                     cwd=self.host_dir or "/", pass_fds=(src_r, verd_w))
        os.close(src_r)
        os.close(verd_w)
        hello = self._read(time.monotonic() + 120)
        if not isinstance(hello, dict) or not hello.get("ready"):
            err = self._stderr()
            self.stop()
            raise RuntimeError(f"sandbox worker {self.index} failed to start: {err or hello}")
        self.info = hello
        self.cgroup.add([self.proc.pid, *(descendants(self.proc.pid) or ())])
        self.info["slot_memory_cap"] = self.cgroup.path is not None

    def _read(self, deadline: float):
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return None
        try:
            return wire.read_msg(fd)
        except (OSError, ValueError, RecursionError):
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
        self.seq += 1
        _drain(self.sources_peek)  # programs of judges that never started
        _drain(self.verdicts_r)  # verdicts of judges past their deadline
        try:
            if judge:
                data = json.dumps({"seq": self.seq, "sources": judge["sources"]}).encode()
                if len(data) > MAX_SOURCES_BYTES:
                    return {"status": "sandbox_error", "error": f"test programs of {len(data)} bytes exceed {MAX_SOURCES_BYTES}"}
                wire.write_msg(self.sources_w, {"seq": self.seq, "sources": judge["sources"]})
                job = dict(job, judge={"entry_point": judge["entry_point"], "seq": self.seq})
            wire.write_msg(self.proc.stdin.fileno(), job)
        except OSError as err:
            return self._replace(f"worker {self.index} gone: {err}")
        ooms = self.cgroup.oom_kills()
        out = self._read(time.monotonic() + float(job["timeout_s"]) + self.cfg.worker_grace_s)
        if out is None:
            return self._replace(f"worker {self.index} hung or died ({self._stderr() or 'no message'})")
        if self.cgroup.oom_kills() > ooms and out.get("status") in ("ok", "runtime_error"):
            out["status"] = "memory_limit"  # the slot's cgroup cap killed one of the job's processes
        if judge:
            out["verdicts"] = self._verdicts()
        if out.get("cleanup_error") or out.get("replace"):  # this outcome stands; the next job gets a fresh worker
            try:
                self._restart(f"worker {self.index} could not clean up after a job: "
                              f"{out.get('cleanup_error') or out.get('error')}")
            except Exception as err:  # noqa: BLE001 - later jobs on this slot fail as sandbox_error
                log.error("sandbox: worker %d could not be restarted: %s", self.index, err)
        return out

    def _verdicts(self) -> list[dict]:
        """This job's verdict records (the judge has exited: all it wrote is in the pipe)."""
        records = []
        for line in _drain(self.verdicts_r).split(b"\n"):
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(record, dict) and record.get("seq") == self.seq:
                records.append(record)
        return records

    def _replace(self, reason: str) -> dict:
        self._restart(reason)
        return {"status": "sandbox_error", "error": reason}

    def _restart(self, reason: str) -> None:
        """Replace the worker: a fresh sandbox (processes, /tmp, IPC namespace) for the next job."""
        log.warning("sandbox: %s; restarting it", reason)
        self.restarts += 1
        self.stop(graceful=False)
        if self.host_dir:  # the process backend's files outlive the worker: start from a new dir
            self._remove_host_dir()
            self.host_dir = tempfile.mkdtemp(prefix="molrl-slot-")
        self.start()

    def _remove_host_dir(self) -> None:
        left = remove_tree(self.host_dir)
        if left:
            log.warning("sandbox: could not remove slot %d's files: %s", self.index, left)

    def stop(self, graceful: bool = True) -> None:
        """Stop the worker (end of input, then SIGKILL if it lingers) and close the pipes."""
        if self.proc is None:
            return
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=2 if graceful else 0)
        except subprocess.TimeoutExpired:
            for pid in [*(descendants(self.proc.pid) or ()), self.proc.pid]:  # bwrap's init, the worker, its tasks
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()
        for fd in (self.sources_w, self.verdicts_r, self.sources_peek):
            os.close(fd)
        self.proc = None

    def close(self) -> None:
        """Stop the worker and remove its temporary directory and cgroup."""
        self.stop()
        self.cgroup.remove()
        if self.host_dir:
            self._remove_host_dir()
