"""A long-lived worker: the job server of one slot, and the two zygotes it forks tasks from.

Started (inside bubblewrap when the host has it) as ``python worker.py SLOT_JSON``; speaks
length-prefixed JSON on its stdin/stdout with the pool in the caller. Before it reads any job it
imports the modules test programs use, forks the *lean zygote*, imports the pool's ``preimport``
modules (numpy and the like), forks the *warm zygote*, and then serves jobs as the *job server*:
it reads each job, has a zygote (see ``zygote.py``; neither ever reads a job) fork the task process
(and the judge process for assert-style tests), hands them the job, waits on them until the
deadline, then kills their process groups and every process left under the slot's uids or below
that zygote (a child subreaper, so orphans of the task re-parent to it), has them reaped, removes
the job's files and SysV IPC objects, and reports the outcome. A task never inherits the job
server's memory, which holds earlier jobs. When the pool's end of the job pipe closes (its process
died, even by SIGKILL, mid-job or between jobs) the job server kills the running job and exits, and
with it the sandbox: bubblewrap's init ends and the kernel kills what is left in its pid namespace,
and the zygotes die with the job server (PR_SET_PDEATHSIG).

Two zygotes because a fork costs in proportion to the memory it copies: code that names a
preimported module (``numpy`` in its text) is forked from the warm zygote, where that module is
already loaded; all other code from the lean one, about half the size, so most tasks start and
exit faster. Code that imports a module without naming it runs in the lean zygote and imports it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time

if __package__ in (None, ""):  # run as a script inside the sandbox
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    __package__ = "runtime"

from . import codec, seccomp, task, zygote  # noqa: E402
from .cleanup import kill_all, remove_ipc, remove_tree, scan_proc  # noqa: E402


class PoolGone(Exception):
    """The pool closed the job pipe while a job ran: its process is gone, and so should this one be."""


def main() -> None:
    """Fork the lean and the warm zygote, then serve jobs until the pool closes the pipe."""
    slot = json.loads(sys.argv[1])
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    judge_modules = task.JUDGE_PRELUDE.split("import", 1)[1].replace(",", " ").split()
    _import(judge_modules)
    compile("0", "warm-up", "eval")  # compile() builds its AST types on first use: here, not in every task
    lib = seccomp.load_library() if slot["seccomp"] else None
    program = None
    if lib is not None:  # the main deny-list binds this worker and so every fork; tasks add the rest
        seccomp.load_filter(seccomp.compile_filter(lib))
        program = seccomp.compile_filter(lib, seccomp.IDENTITY_SYSCALLS, clone_namespaces=False)
    is_root = os.geteuid() == 0
    uids = (slot["uid"], slot["judge_uid"]) if is_root else (None, None)
    # without a uid of its own, RLIMIT_NPROC counts all the user's processes: allow for those
    nproc_base = 0 if is_root else len(scan_proc((os.getuid(),), -1)) + 64
    os.makedirs(slot["root"], exist_ok=True)
    judge_fds = (slot["sources_fd"], slot["verdicts_fd"])
    pid_namespace = bool(slot.get("pid_namespace"))
    lean = zygote.start(uids, program, judge_fds, pid_namespace, close=(proto_in, proto_out))
    warm_modules = _import([name for name in slot.get("preimport", []) if name not in sys.modules])
    warm = None
    if warm_modules:
        warm = zygote.start(uids, program, judge_fds, pid_namespace, close=(proto_in, proto_out, *lean.fds()))
    for fd in judge_fds:  # test programs and verdicts pass between the pool and the judges only
        os.close(fd)
    zygotes = zygote.Zygotes(lean, warm, warm_modules)
    task.write_msg(proto_out, {"ready": True, "pid": os.getpid(), "zygotes": zygotes.pids(),
                               "seccomp": program is not None, "root": is_root})
    serve(proto_in, proto_out, zygotes, slot, uids, nproc_base)


def _import(names: list[str]) -> list[str]:
    """Import each module named; the names that imported."""
    loaded = []
    for name in names:
        try:
            __import__(name)
            loaded.append(name)
        except Exception:  # noqa: BLE001 - a missing optional module only costs speed
            pass
    return loaded


def serve(proto_in: int, proto_out: int, zygotes: zygote.Zygotes, slot: dict, uids: tuple, nproc_base: int) -> None:
    """The job server's loop: read a job, run it, report its outcome, until the pool closes the pipe."""
    while True:
        job = task.read_msg(proto_in)
        if job is None:
            return
        job["received_at"] = time.monotonic()
        if job.get("max_processes"):
            job["max_processes"] = int(job["max_processes"]) + nproc_base
        try:
            result = run_job(job, slot, zygotes.for_job(job), uids, proto_in)
        except PoolGone:
            return
        except Exception as err:  # noqa: BLE001 - report, never die silently; the pool replaces us
            result = {"status": "sandbox_error", "replace": True, "error": f"worker: {type(err).__name__}: {err}"}
        task.write_msg(proto_out, result)


def run_job(job: dict, slot: dict, link: zygote.ZygoteLink, uids: tuple, pool_fd: int) -> dict:
    """Run one job to completion or deadline, forked from the zygote ``link`` leads to; the raw outcome.

    Raises ``PoolGone``, with the job's processes killed, when ``pool_fd`` (the job pipe) closes meanwhile.

    Assert tests' programs never pass through this process: the judge reads them straight from
    the pool (``slot["sources_fd"]``) and writes its verdicts straight back (``slot["verdicts_fd"]``).
    """
    pipes = link.pipes
    cap = int(job["max_result_kb"]) << 10
    for fd in (pipes.result_r, pipes.task_job_r, pipes.judge_job_r):  # whatever an earlier job left
        _drain(fd, bytearray(), 0, once=False)
    io = _prepare_dirs(job, slot, uids[0])
    judged = job.get("judge") is not None
    started = time.monotonic()
    deadline = started + float(job["timeout_s"])
    pids = link.spawn(judged)
    zygote.send_job(pipes.task_job_w, job, io)
    if judged:
        zygote.send_job(pipes.judge_job_w, job, dict(io, stdout=os.devnull, stderr=os.devnull, work="/"))
    events = bytearray()
    try:
        statuses, timed_out = _wait(link, pids, events, deadline, cap, pool_fd)
    except PoolGone:
        kill_all(pids, uids, bool(slot.get("pid_namespace")), root=link.pid)
        raise
    killed_at = time.monotonic()
    stray = kill_all(pids, uids, bool(slot.get("pid_namespace")), root=link.pid)
    if stray or not set(pids) <= set(statuses):  # else the zygote has reaped them all already
        for pid_, status in link.reap().items():
            statuses.setdefault(pid_, status)
    reap_ms = (time.monotonic() - killed_at) * 1000
    _drain(pipes.result_r, events, cap, once=False)
    out = _report(job, io, statuses.get(pids[0]), events, timed_out, started)
    if judged and statuses.get(pids[1]) is not None:
        out["judge_exit_code"] = os.waitstatus_to_exitcode(statuses[pids[1]])
    out.update(reap_ms=round(reap_ms, 3), stray_processes=stray)
    start_event = next((e for e in out["events"] if e.get("e") == "started"), {})
    if isinstance(start_event.get("t"), float):  # job received -> model code about to run
        out["start_ms"] = round((start_event["t"] - job["received_at"]) * 1000, 3)
    left = _clean_up(io, uids)
    if left:  # the pool replaces a worker that cannot clean up; this job's outcome stands
        out["cleanup_error"] = "; ".join(left)
    return out


def _prepare_dirs(job: dict, slot: dict, uid: int | None) -> dict:
    root = slot["root"]
    work = os.path.join(root, "work")
    left = remove_tree(work)
    if left:
        raise OSError(f"cannot remove the last job's work dir {left}")
    os.mkdir(work, 0o700)
    if uid is not None:
        os.chown(work, uid, uid)
    io_dir = os.path.join(root, "io")
    os.makedirs(io_dir, mode=0o700, exist_ok=True)
    paths = {name: os.path.join(io_dir, name) for name in ("stdin", "stdout", "stderr")}
    if job.get("stdin"):
        with open(paths["stdin"], "w", encoding="utf-8") as fh:
            fh.write(job["stdin"])
    else:
        paths["stdin"] = os.devnull
    return dict(paths, work=work)


def _clean_up(io: dict, uids: tuple) -> list[str]:
    """Remove the job's files and SysV IPC objects (its processes are gone); what could not be."""
    left = [f"IPC {error}" for error in remove_ipc(uids)]
    for name in ("stdin", "stdout", "stderr"):
        if io[name] != os.devnull:
            try:
                os.unlink(io[name])
            except FileNotFoundError:
                pass
            except OSError as err:
                left.append(f"{io[name]}: {err.strerror}")
    work = remove_tree(io["work"])
    return left + ([f"work dir {work}"] if work else [])


def _wait(link: zygote.ZygoteLink, pids: list[int], events: bytearray, deadline: float, cap: int, pool_fd: int):
    """Collect result records until the job's processes exit, or the deadline: (statuses, timed out).

    Waiting stops when the processes themselves exit, not when a pipe closes: a daemonised
    grandchild holding the result pipe open must not stretch the job to its deadline. The job pipe
    ``pool_fd`` carries nothing while a job runs (the pool waits for the outcome), so its turning
    readable means end of file: ``PoolGone``.
    """
    result_r, report_r = link.pipes.result_r, link.pipes.report_r
    statuses = zygote.exit_statuses(link.lines(0))
    while not set(pids) <= set(statuses):
        left = deadline - time.monotonic()
        if left <= 0:
            return statuses, True
        ready, _, _ = select.select([report_r, result_r, pool_fd], [], [], left)
        if pool_fd in ready:
            raise PoolGone()
        if result_r in ready:
            _drain(result_r, events, cap, once=True)
        if report_r in ready:
            statuses.update(zygote.exit_statuses(link.lines(0)))
    return statuses, False


def _drain(fd: int, buf: bytearray, cap: int, once: bool) -> None:
    """Read what ``fd`` has now (one chunk when ``once``), keeping at most ``cap`` bytes in ``buf``.

    Polls rather than setting O_NONBLOCK, which the job pipes' other readers would share.
    """
    for _ in range(1 if once else 1024):
        if not select.select([fd], [], [], 0)[0]:
            return
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return
        if len(buf) < cap:
            buf += chunk[: cap - len(buf)]


def _read_head(path: str, limit: int) -> tuple[str, int]:
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(limit)
    except OSError:
        return "", 0
    return head.decode("utf-8", errors="replace"), size


MAX_RECORD_DEPTH = 3 * (codec.MAX_DEPTH + 2) + 2
"""Deepest JSON nesting of a result record: an encoded value nests at most three JSON levels per
level of the value (a dict's pairs), plus the record around it. Deeper records are unreadable, so
the outcome that carries them can always be parsed again in the pool."""
MAX_UNREADABLE = 10
"""Unreadable records described one by one in an outcome; the rest are only counted."""


def _events(raw: bytearray) -> list[dict]:
    """The task's result records; each line that is not one becomes an ``unreadable`` record.

    A malformed record (bad JSON, nested too deep, not an object) costs only itself: the rows it
    would have answered have no result, and every other record stands.
    """
    events, unreadable = [], 0
    for number, line in enumerate(bytes(raw).split(b"\n")):
        if not line:
            continue
        why = None
        try:
            record = json.loads(line)
        except RecursionError:
            why = "JSON nested too deeply to parse"
        except ValueError as err:
            why = f"not JSON ({str(err)[:100]})"
        else:
            if not isinstance(record, dict):
                why = f"a JSON {type(record).__name__}, not an object"
            elif _nested_deeper(record, MAX_RECORD_DEPTH):
                why = f"nested deeper than {MAX_RECORD_DEPTH} levels"
        if why is None:
            events.append(record)
            continue
        unreadable += 1
        if unreadable <= MAX_UNREADABLE:
            events.append({"e": "unreadable", "record": number, "bytes": len(line), "error": why})
    if unreadable > MAX_UNREADABLE:
        events.append({"e": "unreadable", "record": None, "error": f"{unreadable - MAX_UNREADABLE} more"})
    return events


def _nested_deeper(value, limit: int) -> bool:
    """Whether JSON data nests deeper than ``limit`` (without recursion)."""
    todo = [(value, 1)]
    while todo:
        value, depth = todo.pop()
        if depth > limit:
            return True
        if type(value) is dict:
            todo += [(item, depth + 1) for item in value.values()]
        elif type(value) is list:
            todo += [(item, depth + 1) for item in value]
    return False


def _report(job, io, status, events_raw, timed_out, started) -> dict:
    limit = int(job["max_output_kb"]) << 10
    stdout, out_size = _read_head(io["stdout"], limit)
    stderr, err_size = _read_head(io["stderr"], limit)
    events = _events(events_raw)
    exit_code = os.waitstatus_to_exitcode(status) if status is not None else None
    file_limit = int(job["max_file_mb"]) << 20
    started_ok = any(e.get("e") == "started" for e in events)
    memory = any(e.get("type") == "MemoryError" for e in events) or "MemoryError" in stderr[-2000:]
    if timed_out:
        state = "timeout"
    elif not started_ok:
        state = "sandbox_error"
    elif max(out_size, err_size) >= file_limit or exit_code == -signal.SIGXFSZ:
        state = "output_limit"
    elif memory:
        state = "memory_limit"
    elif exit_code != 0:
        state = "runtime_error"
    else:
        state = "ok"
    return {
        "status": state, "exit_code": exit_code, "stdout": stdout, "stderr": stderr,
        "stdout_bytes": out_size, "stderr_bytes": err_size,
        "truncated": out_size > limit or err_size > limit,
        "duration_s": round(time.monotonic() - started, 6), "events": events,
    }


if __name__ == "__main__":
    main()
