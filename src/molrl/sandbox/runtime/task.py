"""The two processes a worker forks per job: the task (model code) and the judge (test programs).

The task process drops to its slot's uid, applies rlimits and the seccomp deny-list, runs the
code, then calls the requested functions and writes their encoded return values as JSON lines on
its result pipe. For assert-style tests it then serves calls from the judge: a separate process,
under another uid, that runs the test program with the entry point bound to a proxy. Only plain
encoded values cross between the two, so the verdict is reached in a process the model's code
never ran in, and the judge never sees an object the model built.
"""

from __future__ import annotations

import builtins
import json
import os
import resource
import struct
import sys
import traceback
import time
import types

from . import codec

SETUP_FAILED_EXIT = 125
"""Exit code of a task process whose sandbox setup (rlimits, uid, seccomp) failed."""
MAX_MESSAGE_BYTES = 16 << 20
"""Largest framed message accepted on a pipe."""

JUDGE_PRELUDE = "import math, re, sys, string, itertools, functools, collections, heapq, bisect, copy, random\n"
"""Modules a test program may use without importing them (the original harnesses ran tests in
the solution's namespace, where solutions usually imported them)."""


def write_msg(fd: int, obj: object) -> None:
    """Write one length-prefixed JSON message to ``fd``."""
    data = json.dumps(obj, separators=(",", ":")).encode()
    view = memoryview(struct.pack("<I", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def read_exact(fd: int, n: int) -> bytes | None:
    """Exactly ``n`` bytes from ``fd``, or None at end of file."""
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_msg(fd: int) -> object | None:
    """One length-prefixed JSON message from ``fd``, or None at end of file."""
    head = read_exact(fd, 4)
    if head is None:
        return None
    (size,) = struct.unpack("<I", head)
    if size > MAX_MESSAGE_BYTES:
        raise ValueError(f"message of {size} bytes exceeds the limit")
    body = read_exact(fd, size)
    return None if body is None else json.loads(body)


def confine(job: dict, uid: int | None, seccomp_program: bytes | None, keep_fds: set[int], io: dict) -> None:
    """Enter the task's confinement: own session, redirected stdio, rlimits, uid, seccomp."""
    os.setsid()
    fds = [os.open(io["stdin"], os.O_RDONLY)]
    for name in ("stdout", "stderr"):
        fds.append(os.open(io[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    _close_other_fds(keep_fds | {0, 1, 2})
    os.chdir(io["work"])
    os.environ["TMPDIR"] = os.getcwd()  # the one place a task may write: tempfile's first choice
    if "tempfile" in sys.modules:  # a preimported tempfile chose its directory before the task's uid was set
        sys.modules["tempfile"].tempdir = None
    limits = {
        resource.RLIMIT_AS: int(job["memory_mb"]) << 20,
        resource.RLIMIT_CPU: int(job["timeout_s"]) + 2,
        resource.RLIMIT_FSIZE: int(job["max_file_mb"]) << 20,
        resource.RLIMIT_NOFILE: 256,
        resource.RLIMIT_CORE: 0,
    }
    if job.get("max_processes"):
        limits[resource.RLIMIT_NPROC] = int(job["max_processes"])
    for which, value in limits.items():
        resource.setrlimit(which, (value, value))
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    if seccomp_program is not None:
        from . import seccomp

        seccomp.load_filter(seccomp_program)


def _close_other_fds(keep: set[int]) -> None:
    low = 0
    for fd in sorted(keep):
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 4096)


def _emit(fd: int, record: dict) -> None:
    line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    view = memoryview(line)
    while view:
        view = view[os.write(fd, view):]


def _describe(err: BaseException) -> str:
    try:
        return f"{type(err).__name__}: {err}"[:1000]
    except BaseException:  # noqa: BLE001 - a hostile __str__
        return "unprintable exception"


def run_task(job: dict, result_fd: int, serve_fds: tuple[int, int] | None) -> int:
    """Run the model's code and the requested calls; returns the process exit code."""
    name = job["module_name"]
    module = types.ModuleType(name)
    module.__dict__["__builtins__"] = builtins
    sys.modules[name] = module
    ns = module.__dict__
    _emit(result_fd, {"e": "started", "t": time.monotonic()})
    try:
        exec(compile(job["code"], "solution.py", "exec"), ns)
    except SystemExit as stop:
        _emit(result_fd, {"e": "exit", "code": repr(stop.code)[:200]})
        return _exit_code(stop.code)
    except BaseException as err:  # noqa: BLE001 - the model's code may raise anything
        # Skip this runner's own frame: the model sees the traceback `python solution.py` prints.
        traceback.print_exception(type(err), err, err.__traceback__.tb_next if err.__traceback__ else None)
        _emit(result_fd, {"e": "load_error", "error": _describe(err), "type": type(err).__name__})
        return 1
    _emit(result_fd, {"e": "loaded"})
    if job.get("setup_code"):
        try:
            exec(compile(job["setup_code"], "setup.py", "exec"), ns)
        except BaseException as err:  # noqa: BLE001
            _emit(result_fd, {"e": "setup_error", "error": _describe(err)})
            return 1
    for i, call in enumerate(job.get("calls") or []):
        _emit(result_fd, {"e": "call", "i": i, **_call(ns, call)})
    if serve_fds is not None:
        _serve(ns, *serve_fds)
    return 0


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    return code if type(code) is int else 1


def _call(ns: dict, call: dict) -> dict:
    """Call one function in the model's namespace; the encoded value or the error."""
    try:
        if call.get("args_source"):
            args = eval(compile(call["args_source"], "test_args", "eval"), ns)
        else:
            args = codec.decode(call["args"])
        fn = ns.get(call["fn"])
        if fn is None:
            return {"error": f"NameError: name {call['fn']!r} is not defined"}
        return {"value": codec.encode(fn(*args))}
    except BaseException as err:  # noqa: BLE001
        return {"error": _describe(err), "type": type(err).__name__}


def _serve(ns: dict, req_fd: int, resp_fd: int) -> None:
    """Answer the judge's calls until it closes its end."""
    while True:
        try:
            msg = read_msg(req_fd)
        except (OSError, ValueError):
            return
        if msg is None:
            return
        reply = _call(ns, {"fn": msg["fn"], "args": msg["args"]})
        try:
            write_msg(resp_fd, reply)
        except OSError:
            return


class CandidateError(Exception):
    """The function under test raised, timed out or returned something unreadable."""


def _read_sources(fd: int, seq: int) -> list[str]:
    """This job's test programs from the pool's pipe, skipping any left by judges that never ran."""
    while True:
        msg = read_msg(fd)
        if msg is None:
            raise CandidateError("the pool closed the test-program pipe")
        if msg.get("seq") == seq:
            return msg["sources"]


def run_judge(job: dict, fds: dict[str, int]) -> int:
    """Run each assert-style test program against a proxy of the entry point.

    Verdicts go straight to the pool, tagged with the job's sequence number.
    """
    judge = job["judge"]
    seq = judge["seq"]

    def report(record: dict) -> None:
        _emit(fds["verdicts"], {"seq": seq, **record})

    def proxy(*args):
        try:
            write_msg(fds["req"], {"fn": judge["entry_point"], "args": codec.encode(args)})
            reply = read_msg(fds["resp"])
        except (OSError, ValueError) as err:
            raise CandidateError(f"lost the task process: {err}") from None
        if not isinstance(reply, dict) or "value" not in reply:
            raise CandidateError(str(reply.get("error") if isinstance(reply, dict) else "no reply"))
        try:
            return codec.decode(reply["value"])
        except (ValueError, TypeError, KeyError) as err:
            raise CandidateError(f"unreadable return value: {err}") from None

    try:
        sources = _read_sources(fds["sources"], seq)
        base: dict = {"__name__": "__judge__", "__builtins__": builtins}
        exec(JUDGE_PRELUDE, base)
    except BaseException as err:  # noqa: BLE001
        report({"e": "judge_error", "error": _describe(err)})
        return 1
    for i, source in enumerate(sources):
        ns = dict(base, candidate=proxy)
        ns[judge["entry_point"]] = proxy
        try:
            exec(compile(source, f"test_{i}.py", "exec"), ns)
            report({"e": "verdict", "i": i, "passed": True})
        except BaseException as err:  # noqa: BLE001 - a failed assert or a candidate error
            report({"e": "verdict", "i": i, "passed": False, "error": _describe(err)[:300]})
    return 0


def finish(code: int) -> None:
    """Flush the task's output and leave without running the model's exit hooks."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass
    os._exit(code)
