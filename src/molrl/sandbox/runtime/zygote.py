"""Zygotes: pristine copies of the worker that fork each job's task and judge processes.

The worker forks its zygotes at start, before any job exists, and then serves jobs itself as the
job server (reads them, waits on them, reads their results and output). A zygote never reads a
job, a result or any output, only one-byte requests from the job server, so each task process
forked from it starts from memory that never held another job's code, arguments, output or
results, live or freed. A forked task reads its own job from its own pipe, then confines itself.
The job server's memory, which does hold earlier jobs, is never inherited by a task.

Requests (job server -> zygote, one byte): ``T`` fork a task, ``J`` fork a task and a judge,
``R`` reap the job's processes (the server has killed them). Replies (one line each):
``pids T [J]``, ``exit PID STATUS`` as each exits, ``reaped`` after ``R``.
"""

from __future__ import annotations

import ctypes
import fcntl
import gc
import marshal
import os
import select
import signal
import struct

from . import task
from .cleanup import kill_all, reap_exited

_libc = ctypes.CDLL(None, use_errno=True)
F_SETPIPE_SZ = 1031
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PIPES = ("spawn", "report", "result", "task_job", "judge_job")
"""The pipes between the job server and one zygote (and the processes it forks)."""


class Pipes:
    """A zygote's long-lived pipes, made before the job server and the zygote part."""

    def __init__(self, fds: dict[str, int]):
        self.fds = fds
        for name, fd in fds.items():
            setattr(self, name, fd)

    @classmethod
    def make(cls) -> Pipes:
        """All pipes; the job pipes sized for a job's largest code (a 1 MiB write does not block)."""
        fds = {}
        for name in PIPES:
            read_fd, write_fd = os.pipe()
            if name.endswith("job"):
                try:
                    fcntl.fcntl(write_fd, F_SETPIPE_SZ, 1 << 20)
                except OSError:  # capped by /proc/sys/fs/pipe-max-size: writes may block instead
                    pass
            fds.update({f"{name}_r": read_fd, f"{name}_w": write_fd})
        return cls(fds)

    def keep(self, names: tuple[str, ...]) -> None:
        """Close every pipe end not named (each process keeps only its own ends)."""
        for name in [n for n in self.fds if n not in names]:
            os.close(self.fds.pop(name))


SERVER_ENDS = ("spawn_w", "report_r", "result_r", "task_job_r", "task_job_w", "judge_job_r", "judge_job_w")
"""The job server's pipe ends: it keeps the job pipes' read ends only to drain stale jobs."""
ZYGOTE_ENDS = ("spawn_r", "report_w", "result_w", "task_job_r", "judge_job_r")


def start(uids: tuple, program: bytes | None, judge_fds: tuple[int, int], pid_namespace: bool,
          close: tuple[int, ...]) -> ZygoteLink:
    """Fork a zygote from this process as it is now (it closes ``close``); the job server's link to it."""
    pipes = Pipes.make()
    gc.freeze()  # keep the preloaded heap shared with every forked task (no GC writes to it)
    parent = os.getpid()
    pid = os.fork()
    if pid:
        pipes.keep(SERVER_ENDS)
        return ZygoteLink(pid, pipes)
    try:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # never outlive the job server
        if os.getppid() != parent:
            os._exit(0)
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # the job's orphans re-parent here
        pipes.keep(ZYGOTE_ENDS)
        for fd in close:
            os.close(fd)
        serve_forks(pipes, uids, program, judge_fds)
        kill_all([], uids, pid_namespace)  # the job server is gone: leave nothing behind
    finally:
        os._exit(0)


def serve_forks(pipes: Pipes, uids: tuple, program: bytes | None, judge_fds: tuple[int, int]) -> None:
    """The zygote's loop: fork, report and reap job processes until the job server goes away.

    Every wake-up also reaps exited orphans (they re-parent here), so their zombies never count
    against the next task's process limit.
    """
    children: dict[int, int] = {}  # pid -> pidfd (a pidfd only wakes this loop when its process exits)
    while True:
        ready, _, _ = select.select([pipes.spawn_r, *children.values()], [], [])
        if pipes.spawn_r in ready:
            request = os.read(pipes.spawn_r, 1)
            if not request:
                return
            if request == b"R":  # the job server has killed the job's processes
                for pid in list(children):
                    _report_exit(pipes.report_w, children, pid, os.waitpid(pid, 0)[1])
            _reap_exited(pipes.report_w, children)
            if request in (b"T", b"J"):
                pids = _fork_job(request == b"J", pipes, uids, program, judge_fds)
                children.update((pid, os.pidfd_open(pid)) for pid in pids)
                _say(pipes.report_w, "pids " + " ".join(map(str, pids)))
            elif request == b"R":
                _say(pipes.report_w, "reaped")
        else:
            _reap_exited(pipes.report_w, children)


def _reap_exited(report_w: int, children: dict[int, int]) -> None:
    """Reap every exited child (job processes and orphans alike), reporting the job's own."""
    for pid, status in reap_exited().items():
        if pid in children:
            _report_exit(report_w, children, pid, status)


def _report_exit(report_w: int, children: dict[int, int], pid: int, status: int) -> None:
    os.close(children.pop(pid))
    _say(report_w, f"exit {pid} {status}")


def _say(fd: int, line: str) -> None:
    os.write(fd, line.encode() + b"\n")  # short lines: one atomic pipe write each


def _fork_job(judged: bool, pipes: Pipes, uids: tuple, program: bytes | None, judge_fds: tuple[int, int]) -> list[int]:
    """Fork the task (and the judge, joined to it by a request and a response pipe); their pids."""
    if not judged:
        return [_fork(pipes.task_job_r, uids[0], program, lambda job: task.run_task(job, pipes.result_w, None),
                      {pipes.result_w})]
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    task_pid = _fork(pipes.task_job_r, uids[0], program,
                     lambda job: task.run_task(job, pipes.result_w, (req_r, resp_w)), {pipes.result_w, req_r, resp_w})
    fds = {"sources": judge_fds[0], "verdicts": judge_fds[1], "req": req_w, "resp": resp_r}
    judge_pid = _fork(pipes.judge_job_r, uids[1], program, lambda job: task.run_judge(job, fds), set(fds.values()))
    for fd in (req_r, req_w, resp_r, resp_w):
        os.close(fd)
    return [task_pid, judge_pid]


def _fork(job_fd: int, uid: int | None, program: bytes | None, body, keep: set[int]) -> int:
    """Fork a process that reads its job, confines itself and runs ``body(job)``; its pid."""
    pid = os.fork()
    if pid:
        return pid
    try:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        job, io = _read_job(job_fd)
        task.confine(job, uid, program, keep, io)
    except BaseException:  # noqa: BLE001
        os._exit(task.SETUP_FAILED_EXIT)
    code = 1
    try:
        code = body(job)
    except BaseException:  # noqa: BLE001 - show it on the process's stderr, then exit
        import traceback

        traceback.print_exc()
    finally:
        task.finish(code)


def send_job(fd: int, job: dict, io: dict) -> None:
    """Hand a forked process its job (marshal: plain data only, and cheaper to load than JSON)."""
    data = marshal.dumps((job, io))
    view = memoryview(struct.pack("<I", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_job(fd: int) -> tuple[dict, dict]:
    (size,) = struct.unpack("<I", task.read_exact(fd, 4))
    return marshal.loads(task.read_exact(fd, size))


class ZygoteLink:
    """The job server's end of one zygote's pipes."""

    def __init__(self, pid: int, pipes: Pipes):
        self.pid, self.pipes = pid, pipes
        self._buffer = b""
        self._pending: list[str] = []  # lines read past the one a request waited for
        os.set_blocking(pipes.report_r, False)

    def fds(self) -> tuple[int, ...]:
        """The job server's pipe ends to this zygote (a later zygote closes them)."""
        return tuple(self.pipes.fds.values())

    def lines(self, timeout: float | None) -> list[str]:
        """The complete reply lines available within ``timeout`` seconds (None: wait for one)."""
        if self._pending:
            lines, self._pending = self._pending, []
            return lines
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([self.pipes.report_r], [], [], timeout)
            if not ready:
                return []
            self._read()
        *lines, self._buffer = self._buffer.split(b"\n")
        return [line.decode() for line in lines]

    def _read(self) -> None:
        try:
            chunk = os.read(self.pipes.report_r, 1 << 16)
        except BlockingIOError:
            return
        if not chunk:
            raise OSError(f"the zygote (pid {self.pid}) is gone")
        self._buffer += chunk

    def spawn(self, judged: bool) -> list[int]:
        """Ask for the job's processes; their pids (they then wait for their job on their pipes)."""
        os.write(self.pipes.spawn_w, b"J" if judged else b"T")
        while True:
            lines = self.lines(None)
            for n, line in enumerate(lines):
                if line.startswith("pids "):
                    self._pending = lines[n + 1:]
                    return [int(p) for p in line.split()[1:]]

    def reap(self) -> dict[int, int]:
        """Have the zygote reap the job's killed processes; the exit statuses it reports."""
        os.write(self.pipes.spawn_w, b"R")
        statuses = {}
        while True:
            for line in self.lines(None):
                if line == "reaped":
                    return statuses
                statuses.update(exit_statuses([line]))


class Zygotes:
    """The job server's zygotes: lean (the test programs' modules) and warm (the preimports too)."""

    def __init__(self, lean: ZygoteLink, warm: ZygoteLink | None, warm_modules: list[str]):
        self.lean, self.warm = lean, warm
        self.warm_names = sorted({name.split(".")[0] for name in warm_modules})

    def for_job(self, job: dict) -> ZygoteLink:
        """The warm zygote for code that names a module only it has loaded; else the lean one."""
        if self.warm is not None:
            text = job.get("code", "") + (job.get("setup_code") or "")
            if any(name in text for name in self.warm_names):
                return self.warm
        return self.lean

    def pids(self) -> list[int]:
        """The zygotes' pids."""
        return [link.pid for link in (self.lean, self.warm) if link is not None]


def exit_statuses(lines: list[str]) -> dict[int, int]:
    """pid -> wait status from the zygote's ``exit`` lines."""
    found = {}
    for line in lines:
        if line.startswith("exit "):
            _, pid, status = line.split()
            found[int(pid)] = int(status)
    return found
