"""Math grading in a worker process that the caller can kill, under a time budget per batch.

math-verify bounds its sympy work with ``signal.alarm``, which works only on a process's main
thread and cannot interrupt one long C call (an exact power of a huge integer); off the main
thread it has no bound at all. So answers are graded one at a time in a worker process
(``python -m molrl.graders.math``: ``serve`` running ``math.grade_here``), where the alarm
(``math.TIMEOUT_S`` per step) ends most slow answers, and the caller, from any thread, kills the
worker when:

- one answer takes longer than ``ROW_LIMIT_S``: that answer is graded ``wrong`` with the reason;
- the batch runs past its budget, ``max(BATCH_MIN_S, BATCH_ROW_S * n)`` for n answers (starting
  the worker the first time is not counted): the answers not yet graded are ``grader_error``
  ("not graded"), not the completion's fault.

The worker starts on first use, serves every thread of the process (one batch at a time) and is
started again after a kill. It holds at most ``MEMORY_MB`` of address space, and exits when the
caller does (its stdin closes), after at most ``CPU_LIMIT_S`` on the answer in hand.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import resource
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from molrl.graders.grade import Grade

log = logging.getLogger(__name__)

ROW_LIMIT_S = 5.0
"""An answer whose grading takes longer is graded wrong and its worker killed."""
BATCH_MIN_S = 10.0
"""The smallest time budget of a batch..."""
BATCH_ROW_S = 0.5
"""...which grows by this much per answer: max(BATCH_MIN_S, BATCH_ROW_S * n) seconds for n answers."""
START_LIMIT_S = 120.0
"""How long starting the worker (importing math-verify and sympy) may take before grading fails."""
MEMORY_MB = 4096
"""The worker's address-space limit: an answer that needs more fails with MemoryError (grader_error)."""
CPU_LIMIT_S = 20
"""CPU seconds one answer may use in the worker: bounds an answer still running after its caller died."""


def batch_budget_s(n: int) -> float:
    """The time budget of a batch of ``n`` answers, in seconds."""
    return max(BATCH_MIN_S, BATCH_ROW_S * n)


class WorkerError(RuntimeError):
    """The worker could not be started or died without answering."""


class MathWorker:
    """The client side of one worker process: send an answer, wait for its grade with a deadline."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self._buffer = b""
        self._ready = False

    def _start(self) -> None:
        package_root = str(Path(__file__).resolve().parents[2])  # the directory holding molrl/
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen([sys.executable, "-m", "molrl.graders.math"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, close_fds=True)
        self._buffer, self._ready = b"", False

    def ensure_ready(self, timeout_s: float) -> bool:
        """Start the worker if it is not running; whether it has loaded math-verify within ``timeout_s``."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        if not self._ready:
            line = self._read_line(time.monotonic() + timeout_s)
            if line is None:
                return False
            if line != b'{"ready": true}':
                self.kill()
                raise WorkerError(f"the math grading worker started with {line[:200]!r}")
            self._ready = True
        return True

    def _read_line(self, deadline: float) -> bytes | None:
        """The next line from the worker, None at the deadline; WorkerError when it exits."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                code = self.proc.wait()
                self.kill()
                raise WorkerError(f"the math grading worker exited with code {code}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def grade(self, completion: str, answer: str, limit_s: float) -> Grade | None:
        """The worker's grade of one answer, or None when it took longer than ``limit_s`` (worker killed)."""
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"completion": completion, "answer": answer}).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError as err:
            self.kill()
            raise WorkerError(f"the math grading worker stopped reading: {err}") from None
        line = self._read_line(time.monotonic() + limit_s)
        if line is None:
            self.kill()
            return None
        try:
            return Grade(**json.loads(line))
        except (ValueError, TypeError):
            self.kill()
            raise WorkerError(f"the math grading worker answered {line[:200]!r}") from None

    def kill(self) -> None:
        """Stop the worker now (the next answer starts a new one)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            for stream in (self.proc.stdin, self.proc.stdout):
                if stream is not None:
                    stream.close()
        self.proc, self._buffer, self._ready = None, b"", False


_WORKER = MathWorker()
_LOCK = threading.Lock()


def _after_fork_in_child() -> None:
    """A forked child shares nothing with its parent's worker: it starts its own when it needs one."""
    global _WORKER, _LOCK
    _WORKER, _LOCK = MathWorker(), threading.Lock()


def _stop() -> None:
    _WORKER.kill()


atexit.register(_stop)
os.register_at_fork(after_in_child=_after_fork_in_child)


def grade_batch(completions: list[str], answers: list[str]) -> list[Grade]:
    """One grade per (completion, gold answer), graded in the worker within the batch's time budget."""
    if len(completions) != len(answers):
        raise ValueError(f"grade_batch: {len(completions)} completions but {len(answers)} answers")
    with _LOCK:
        return _grade_batch(_WORKER, completions, answers)


def _grade_batch(worker: MathWorker, completions: list[str], answers: list[str]) -> list[Grade]:
    try:
        started = worker.ensure_ready(START_LIMIT_S)
    except WorkerError as err:
        started, error = False, str(err)
    else:
        error = f"the math grading worker did not start within {START_LIMIT_S:.0f} s"
    if not started:
        worker.kill()
        log.error("math grading: %s", error)
        return [_failed(error) for _ in completions]
    budget = batch_budget_s(len(completions))
    spent = f"not graded: the batch's time budget of {budget:.1f} s was spent"
    deadline = time.monotonic() + budget
    grades: list[Grade] = []
    for completion, answer in zip(completions, answers):
        try:
            left = deadline - time.monotonic()
            if left <= 0 or not worker.ensure_ready(left):  # a worker started again after a kill counts
                grades.append(_failed(spent))
                continue
            left = deadline - time.monotonic()
            grade = worker.grade(completion, answer, min(ROW_LIMIT_S, left))
        except WorkerError as err:  # the worker died on this answer: it alone fails
            log.error("math grading: %s", err)
            grades.append(_failed(str(err)))
            continue
        if grade is None and left < ROW_LIMIT_S:
            grade = _failed(spent)
        elif grade is None:
            grade = Grade(0.0, False, "wrong", None, {"reason": f"grading took longer than {ROW_LIMIT_S:.1f} s"})
        grades.append(grade)
    return grades


def _failed(error: str) -> Grade:
    return Grade(0.0, False, "grader_error", None, {"error": error})


def serve(grade: Callable[[str, str], Grade]) -> None:
    """The worker's loop: read one JSON request per line from stdin, write its grade as one JSON line.

    It ends when stdin closes, as it does when the caller exits or dies. An answer graded while the
    caller dies is still bounded, by a CPU-time limit of ``CPU_LIMIT_S`` per answer (SIGXCPU).
    """
    _limit(resource.RLIMIT_AS, MEMORY_MB << 20)
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything the graders print goes to stderr, never into the answers
    grade("\\boxed{1}", "1")  # loads math-verify and sympy before the ready line, so no answer pays for it
    out.write(b'{"ready": true}\n')
    out.flush()
    for line in sys.stdin.buffer:
        request = json.loads(line)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        _limit(resource.RLIMIT_CPU, int(usage.ru_utime + usage.ru_stime) + CPU_LIMIT_S)
        out.write(json.dumps(grade(request["completion"], request["answer"]).to_dict()).encode() + b"\n")
        out.flush()


def _limit(which: int, soft: int) -> None:
    """Set a soft resource limit, below the hard one (which an unprivileged process cannot raise again)."""
    _, hard = resource.getrlimit(which)
    resource.setrlimit(which, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
