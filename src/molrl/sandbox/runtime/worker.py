"""A long-lived worker: imports common modules once, then forks one confined process per job.

Started (inside bubblewrap when the host has it) as ``python worker.py SLOT_JSON``; speaks
length-prefixed JSON on its stdin/stdout with the pool in the caller. Per job it forks the task
process (and the judge process for assert-style tests), waits on them until the deadline, then
kills their process groups and every process left under the slot's uids or below itself (it is
a child subreaper, so orphans of the task re-parent to it), reaps them, and reports the outcome.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import select
import shutil
import signal
import sys
import time

if __package__ in (None, ""):  # run as a script inside the sandbox
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    __package__ = "runtime"

from . import seccomp, task  # noqa: E402

PR_SET_CHILD_SUBREAPER = 36


def main() -> None:
    """Serve jobs from the pool until it closes the pipe."""
    slot = json.loads(sys.argv[1])
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    judge_modules = task.JUDGE_PRELUDE.split("import", 1)[1].replace(",", " ").split()
    for name in [*judge_modules, *slot.get("preimport", [])]:
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - a missing optional module only costs speed
            pass
    lib = seccomp.load_library() if slot["seccomp"] else None
    program = None
    if lib is not None:  # the main deny-list binds this worker and so every fork; tasks add the rest
        seccomp.load_filter(seccomp.compile_filter(lib))
        program = seccomp.compile_filter(lib, seccomp.IDENTITY_SYSCALLS, clone_namespaces=False)
    is_root = os.geteuid() == 0
    # without a uid of its own, RLIMIT_NPROC counts all the user's processes: allow for those
    nproc_base = 0 if is_root else len(_scan_proc((os.getuid(),), -1)) + 64
    os.makedirs(slot["root"], exist_ok=True)
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    gc.freeze()  # keep the preloaded heap shared with every forked task (no GC writes to it)
    task.write_msg(proto_out, {"ready": True, "pid": os.getpid(), "seccomp": program is not None, "root": is_root})
    while True:
        job = task.read_msg(proto_in)
        if job is None:
            return
        job["received_at"] = time.monotonic()
        if job.get("max_processes"):
            job["max_processes"] = int(job["max_processes"]) + nproc_base
        try:
            result = run_job(job, slot, program, is_root)
        except Exception as err:  # noqa: BLE001 - report, never die silently
            result = {"status": "sandbox_error", "error": f"worker: {type(err).__name__}: {err}"}
        task.write_msg(proto_out, result)


def run_job(job: dict, slot: dict, program: bytes | None, is_root: bool) -> dict:
    """Run one job to completion or deadline; the raw outcome for the pool.

    Assert tests' programs never pass through this process: the judge reads them straight from
    the pool (``slot["sources_fd"]``) and writes its verdicts straight back (``slot["verdicts_fd"]``),
    so no job's expected values can linger in memory that a later task process inherits.
    """
    io = _prepare_dirs(job, slot, is_root)
    uids = (slot["uid"], slot["judge_uid"]) if is_root else (None, None)
    result_r, result_w = os.pipe()
    serve = job.get("judge") is not None
    if serve:
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
    started = time.monotonic()
    deadline = started + float(job["timeout_s"])
    pid = os.fork()
    if pid == 0:
        keep = {result_w, req_r, resp_w} if serve else {result_w}
        _child(lambda: task.run_task(job, result_w, (req_r, resp_w) if serve else None),
               job, uids[0], program, keep, io)
    pids = [pid]
    if serve:
        judge_pid = os.fork()
        if judge_pid == 0:
            fds = {"sources": slot["sources_fd"], "verdicts": slot["verdicts_fd"], "req": req_w, "resp": resp_r}
            _child(lambda: task.run_judge(job, fds), job, uids[1], program, set(fds.values()),
                   dict(io, stdout=os.devnull, stderr=os.devnull, work="/"))
        pids.append(judge_pid)
        for fd in (req_r, req_w, resp_r, resp_w):
            os.close(fd)
    os.close(result_w)
    events = bytearray()
    statuses, timed_out = _wait(pids, {result_r: events}, deadline, int(job["max_result_kb"]) << 10)
    killed_at = time.monotonic()
    stray = _kill_all(pids, uids, bool(slot.get("pid_namespace")))
    for pid_, status in _reap(pids).items():
        statuses.setdefault(pid_, status)
    reap_ms = (time.monotonic() - killed_at) * 1000
    os.close(result_r)
    out = _report(job, io, statuses.get(pid), events, timed_out, started)
    if serve and statuses.get(pids[1]) is not None:
        out["judge_exit_code"] = os.waitstatus_to_exitcode(statuses[pids[1]])
    out.update(reap_ms=round(reap_ms, 3), stray_processes=stray)
    start_event = next((e for e in out["events"] if e.get("e") == "started"), {})
    if isinstance(start_event.get("t"), float):  # job received -> model code about to run
        out["start_ms"] = round((start_event["t"] - job["received_at"]) * 1000, 3)
    _remove(io["work"])
    return out


def _prepare_dirs(job: dict, slot: dict, is_root: bool) -> dict:
    root = slot["root"]
    work = os.path.join(root, "work")
    _remove(work)
    os.mkdir(work, 0o700)
    if is_root:
        os.chown(work, slot["uid"], slot["uid"])
    io_dir = os.path.join(root, "io")
    os.makedirs(io_dir, mode=0o700, exist_ok=True)
    paths = {name: os.path.join(io_dir, name) for name in ("stdin", "stdout", "stderr")}
    if job.get("stdin"):
        with open(paths["stdin"], "w", encoding="utf-8") as fh:
            fh.write(job["stdin"])
    else:
        paths["stdin"] = os.devnull
    return dict(paths, work=work)


def _remove(path: str) -> None:
    """Remove a work directory (usually empty, so try the one-syscall way first)."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError:
        shutil.rmtree(path, ignore_errors=True)


def _child(body, job: dict, uid: int | None, program: bytes | None, keep: set[int], io: dict) -> None:
    """In a freshly forked process: confine, run ``body``, exit. Never returns."""
    try:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        task.confine(job, uid, program, keep, io)
    except BaseException:  # noqa: BLE001
        os._exit(task.SETUP_FAILED_EXIT)
    code = 1
    try:
        code = body()
    except BaseException:  # noqa: BLE001 - show it on the process's stderr, then exit
        import traceback

        traceback.print_exc()
    finally:
        task.finish(code)


def _wait(pids: list[int], readers: dict[int, bytearray], deadline: float, cap: int):
    """Collect pipe output until the job's processes exit (then drain the pipes), or the deadline.

    Waiting stops when the processes themselves exit, not when their pipes close: a daemonised
    grandchild holding a pipe open must not stretch the job to its deadline.
    """
    pidfds = {os.pidfd_open(pid): pid for pid in pids}
    statuses: dict[int, int] = {}
    for fd in readers:
        os.set_blocking(fd, False)
    open_readers = set(readers)
    try:
        while pidfds:
            left = deadline - time.monotonic()
            if left <= 0:
                return statuses, True
            ready, _, _ = select.select(list(pidfds) + list(open_readers), [], [], left)
            for fd in ready:
                if fd in pidfds:
                    pid = pidfds.pop(fd)
                    os.close(fd)
                    statuses[pid] = os.waitpid(pid, 0)[1]
                else:
                    _drain(fd, readers[fd], cap, open_readers, once=True)
        for fd in list(open_readers):
            _drain(fd, readers[fd], cap, open_readers, once=False)
        return statuses, False
    finally:
        for fd in pidfds:
            os.close(fd)


def _drain(fd: int, buf: bytearray, cap: int, open_readers: set[int], once: bool) -> None:
    """Read what ``fd`` has now (one chunk when ``once``), keeping at most ``cap`` bytes."""
    for _ in range(1 if once else 1024):
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if not chunk:
            open_readers.discard(fd)
            return
        if len(buf) < cap:
            buf += chunk[: cap - len(buf)]


def _task_processes(uids: tuple, own_pid: int, full_scan: bool) -> list[int]:
    """Every live process that belongs to the job: a descendant of this worker (orphans re-parent
    to it, a subreaper) or, inside a pid namespace where the scan is cheap, any process of its uids."""
    found = descendants(own_pid)
    if found is None or full_scan:
        found = set(found or ()) | set(_scan_proc(uids, own_pid))
    return sorted(found)


def descendants(own_pid: int) -> set[int] | None:
    """Live descendants from /proc/PID/task/TID/children, or None where the kernel lacks that file."""
    found: set[int] = set()
    todo = [own_pid]
    while todo:
        pid = todo.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                    kids = [int(k) for k in fh.read().split()]
            except FileNotFoundError:
                if pid == own_pid:
                    return None
                kids = []
            except OSError:
                kids = []
            fresh = [k for k in kids if k not in found and not _is_zombie(k)]
            found.update(fresh)
            todo.extend(fresh)
    return found


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


def _scan_proc(uids: tuple, own_pid: int) -> list[int]:
    """Every live process under the job's uids, from a full /proc scan."""
    wanted = {uid for uid in uids if uid is not None}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == own_pid or not wanted:
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as fh:
                fields = dict(line.split(b":", 1) for line in fh if b":" in line)
        except OSError:
            continue
        if fields[b"State"].split()[0] != b"Z" and int(fields[b"Uid"].split()[0]) in wanted:
            found.append(int(entry))
    return found


def _kill_all(pids: list[int], uids: tuple, full_scan: bool) -> int:
    """SIGKILL the job's process groups and every remaining job process; how many strays there were."""
    for pid in pids:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    own = os.getpid()
    strays: set[int] = set()
    for attempt in range(10_000):
        found = [p for p in _task_processes(uids, own, full_scan) if p not in pids]
        if not found:
            break
        strays.update(found)
        if attempt % 50 == 0:  # again now and then: kill(-1) as the uid catches whatever forked since
            for uid in uids:
                if uid is not None:
                    _kill_uid(uid)
        for p in found:
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        _reap([])
        time.sleep(0.001)
    return len(strays)


def _kill_uid(uid: int) -> None:
    """kill(-1, SIGKILL) as ``uid``: the kernel signals all its processes in one pass, so a fork
    bomb cannot outrun it (a fork with a fatal signal pending fails)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(uid)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _reap(pids: list[int]) -> dict[int, int]:
    """Reap the job's processes (blocking: they were killed) and any exited orphan."""
    statuses = {}
    for pid in pids:
        try:
            _, status = os.waitpid(pid, 0)
            statuses[pid] = status
        except ChildProcessError:
            pass
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
    return statuses


def _read_head(path: str, limit: int) -> tuple[str, int]:
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(limit)
    except OSError:
        return "", 0
    return head.decode("utf-8", errors="replace"), size


def _events(raw: bytearray) -> list[dict]:
    events = []
    for line in bytes(raw).split(b"\n"):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            events.append(record)
    return events


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
