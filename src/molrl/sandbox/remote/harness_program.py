"""molrl's run_code harness: one molrl sandbox job run on a server that only runs Python programs.

A run_code server (SandboxFusion's ``POST /run_code``) runs this program as ``python3 FILE``. Its text is the same for
every job: ``molrl.sandbox.remote.harness`` fills in ``RUNTIME`` (molrl's sandbox runtime modules and the child
program, since the server has no molrl). The job and a nonce arrive as one line on stdin, which the server passes
through a pipe, so neither is ever in a file on the server. The program

1. deletes its own file, makes itself non-dumpable (a process of the same uid can then neither read its memory nor open
   its fds) and a child subreaper (what the job leaves running re-parents to it, to be killed);
2. starts the model's code in a child: a fresh interpreter exec'd with ``harness_child.py``'s text (never a fork of
   this process, which holds the nonce and the test programs), given on a pipe only what it runs (code, setup code,
   the calls' arguments, limits), with unlinked files as its stdin, stdout and stderr; the child confines itself as a
   local task process does and writes its result records on another pipe;
3. for assert-style tests, is itself the judge: it runs the test programs, which never leave this process, with the
   entry point bound to a proxy that sends encoded arguments to the child and decodes what comes back into plain
   builtins (``task.run_judge``);
4. kills the child's process group at the deadline, then whatever is left below it (and of its uid, when it has one of
   its own), and writes the outcome ``worker._report`` builds, with the verdicts, as the one line of its stdout:
   ``MOLRL-HARNESS <nonce> <outcome JSON>``.

Run as root with an interpreter every uid can read, the child gets a uid of its own (one no process or account uses);
otherwise it shares the harness's uid, without capabilities. docs/sandbox.md says what each leaves open.
"""

from __future__ import annotations

import base64
import ctypes
import fcntl
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
import zlib

RUNTIME = "@MOLRL_RUNTIME@"
"""zlib-compressed JSON in base64: {"modules": runtime module texts, "order": the order to install them in,
"child": harness_child.py's text, "env": the child's environment}."""
TAG = "MOLRL-HARNESS"
"""The first word of the result line."""
TASK_KEYS = ("code", "module_name", "setup_code", "calls", "timeout_s", "memory_mb", "max_file_mb", "max_processes")
"""What of the job the child receives: never the judge's test programs."""
READER_GRACE_S = 1.0
"""Seconds to wait, once the job's processes are dead, for the last result records to be read."""
VERDICT_PIPE_BYTES = 1 << 20
"""Capacity asked for the verdict pipe (a verdict record is at most a few hundred bytes)."""
F_SETPIPE_SZ = 1031

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 4, 36


def main() -> None:
    """Read the job from stdin, run it, and write the one result line."""
    if not RUNTIME or RUNTIME[0] == "@":
        sys.exit("this is the harness template; molrl.sandbox.remote.harness.run_code_request makes the program")
    result_fd = os.dup(1)
    os.dup2(2, 1)  # anything printed here (a test program's print) goes to stderr: the result line is alone on stdout
    isolation = {"file_removed": _remove_own_file(), "undumpable": _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0,
                 "subreaper": _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0, "fresh_uid": False}
    nonce = "-"
    try:
        request = json.loads(zlib.decompress(base64.b64decode(sys.stdin.buffer.readline())))
        nonce = request["nonce"]
        outcome = run_job(request["job"], json.loads(zlib.decompress(base64.b64decode(RUNTIME))), isolation)
    except BaseException as err:  # noqa: BLE001 - any failure of the harness is reported, never a silence
        print(f"molrl harness: {type(err).__name__}: {err}", file=sys.stderr)
        outcome = failed_outcome(f"harness: {type(err).__name__}: {err}"[:1000])
    outcome["isolation"] = isolation
    line = f"{TAG} {nonce} {json.dumps(outcome, separators=(',', ':'))}\n".encode()
    _write_all(result_fd, line)
    sys.stderr.flush()
    os._exit(0)  # no thread of the judge, and no exit hook, runs past the result line


def failed_outcome(error: str) -> dict:
    """The outcome of a job the harness could not run: a sandbox error, never a verdict."""
    return {"status": "sandbox_error", "exit_code": None, "stdout": "", "stderr": "", "stdout_bytes": 0,
            "stderr_bytes": 0, "truncated": False, "duration_s": 0.0, "events": [], "verdicts": [], "error": error}


def _remove_own_file() -> bool:
    """Delete the file this program was started from; whether it is gone."""
    path = getattr(sys.modules["__main__"], "__file__", None)
    if not path:
        return False
    try:
        os.unlink(path)
    except OSError:
        return not os.path.exists(path)
    return True


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def run_job(job: dict, runtime: dict, isolation: dict) -> dict:
    """Run ``job`` in a confined child, judging its assert tests here; its raw outcome."""
    child_ns: dict = {"__name__": "molrl_harness_child"}
    exec(compile(runtime["child"], "harness_child.py", "exec"), child_ns)
    rt = child_ns["install_runtime"](runtime["modules"], runtime["order"])
    private = tempfile.mkdtemp(prefix="molrl-harness-")
    os.chmod(private, 0o711)  # a child of its own uid reaches its work dir by an absolute path, and lists nothing here
    try:
        uids: dict = {"__name__": "molrl_harness_uids"}
        exec(compile(runtime["uids"], "harness_uids.py", "exec"), uids)
        uid = uids["fresh_uid"](rt.cleanup)
        isolation["fresh_uid"] = uid is not None
        return _finish(_start(private, job, runtime, rt, uid), job, rt, uid)
    finally:
        rt.cleanup.remove_tree(private)


class _HarnessRun:
    """A started job: the child, the readers of its records and verdicts, its stdout and stderr, and its clock."""

    def __init__(self, proc: subprocess.Popen, events: _Collector, judge: _Judge | None, outputs: tuple[int, int],
                 own_io: dict, started: float):
        self.proc, self.events, self.judge, self.outputs, self.own_io = proc, events, judge, outputs, own_io
        self.started = started


def _start(private: str, job: dict, runtime: dict, rt, uid: int | None) -> _HarnessRun:
    """Start the child under ``uid`` (None: this process's own), with its files under ``private``, and the threads
    that feed it its job, read its result records and judge its assert tests."""
    work = os.path.join(private, "work")
    os.mkdir(work, 0o700)
    if uid is not None:
        os.chown(work, uid, uid)
    stdio, child_io, own_io = _stdio_files(private, job.get("stdin") or "")
    task_job = {key: job[key] for key in TASK_KEYS}
    if uid is None and task_job.get("max_processes"):  # RLIMIT_NPROC counts every process of the shared uid
        task_job["max_processes"] = int(task_job["max_processes"]) + len(rt.cleanup.scan_proc((os.getuid(),), -1)) + 64
    _within_own_limits(task_job)
    judged = job.get("judge") is not None
    job_r, job_w = os.pipe()
    result_r, result_w = os.pipe()
    req_r, req_w = os.pipe() if judged else (-1, -1)
    resp_r, resp_w = os.pipe() if judged else (-1, -1)
    child_fds = [fd for fd in (job_r, result_w, req_r, resp_w) if fd >= 0]
    message = {"job": task_job, "io": dict(child_io, work=work), "uid": uid, "harness": os.getpid(),
               "runtime": {name: runtime["modules"][name] for name in ("codec", "task")}}
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-I", "-c", runtime["child"], str(job_r), str(result_w), str(req_r),
                             str(resp_w)], stdin=stdio[0], stdout=stdio[1], stderr=stdio[2], pass_fds=child_fds,
                            env=dict(runtime["env"], PATH=os.environ.get("PATH", "/usr/bin:/bin")), cwd="/")
    for fd in (*child_fds, stdio[0]):  # stdout and stderr stay open here: they are read back through these fds
        os.close(fd)
    _thread(_feed, job_w, json.dumps(message).encode())
    events = _Collector(result_r, int(job["max_result_kb"]) << 10)
    judge = _judge(rt.task, job["judge"], req_w, resp_r) if judged else None
    return _HarnessRun(proc, events, judge, (stdio[1], stdio[2]), own_io, started)


def _within_own_limits(task_job: dict) -> None:
    """Lower the child's limits to this process's own hard limits, which the child cannot raise (a server that
    limits the harness, such as ``molrl sandbox serve``, holds the child to them as well)."""
    import resource

    for key, which, shift in (("memory_mb", resource.RLIMIT_AS, 20), ("max_file_mb", resource.RLIMIT_FSIZE, 20),
                              ("max_processes", resource.RLIMIT_NPROC, 0)):
        hard = resource.getrlimit(which)[1]
        if task_job.get(key) and hard != resource.RLIM_INFINITY:
            task_job[key] = min(int(task_job[key]), hard >> shift)


def _finish(run: _HarnessRun, job: dict, rt, uid: int | None) -> dict:
    """Wait for the job to end or reach its deadline, kill whatever is left of it, and build its raw outcome."""
    deadline = run.started + float(job["timeout_s"])
    pid, judge = run.proc.pid, run.judge
    status = _wait_exit(pid, deadline)
    if status is not None and judge is not None:
        judge.thread.join(max(0.0, deadline - time.monotonic()))
    timed_out = status is None or (judge is not None and judge.thread.is_alive())
    verdicts = _verdict_records(_drain(judge.verdicts_r)) if judge is not None else []  # those decided in time
    if status is None:  # the deadline: the child dies first, and its -9 is its exit code, as in the local pool
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, 9)
            except OSError:
                pass
        status = _wait_exit(pid, time.monotonic() + 5.0)
    stray = rt.cleanup.kill_all([pid], (uid,), uid is not None)
    run.proc.returncode = 0 if status is None else os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    run.events.done.wait(READER_GRACE_S)
    out = rt.worker._report(job, run.own_io, status, run.events.snapshot(), timed_out, run.started)
    for fd in run.outputs:
        os.close(fd)
    out["verdicts"] = verdicts
    if out["status"] == "sandbox_error":
        out["error"] = f"the task process did not start (exit code {out['exit_code']})"
    out["stray_processes"] = stray
    return out


def _stdio_files(private: str, stdin: str) -> tuple[tuple[int, int, int], dict, dict]:
    """The task's stdin, stdout and stderr: their fds, and the paths the child and this process reopen them by.

    Where /proc/self/fd exists the files are unlinked once open, so no other process can open them by name (a
    concurrent job of a shared uid would otherwise read its sibling's answers from its stdout).
    """
    anonymous = os.path.isdir("/proc/self/fd")
    fds, child_io, own_io = [], {}, {}
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        if name == "stdin" and not stdin:
            fds.append(os.open(os.devnull, os.O_RDONLY))
            child_io[name] = own_io[name] = os.devnull
            continue
        path = os.path.join(private, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        if name == "stdin":
            _write_all(fd, stdin.encode())
            os.lseek(fd, 0, os.SEEK_SET)
        if anonymous:
            os.unlink(path)
        fds.append(fd)
        child_io[name] = f"/proc/self/fd/{i}" if anonymous else path
        own_io[name] = f"/proc/self/fd/{fd}" if anonymous else path
    return (fds[0], fds[1], fds[2]), child_io, own_io


def _wait_exit(pid: int, deadline: float) -> int | None:
    """The child's wait status once it exits, or None at ``deadline``.

    The child is left unreaped (a zombie keeps its pid and process group), so killing its group later can reach no
    other process.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        while True:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if info is not None and info.si_pid == pid:
                if info.si_code == os.CLD_EXITED:
                    return info.si_status << 8
                return info.si_status | (0x80 if info.si_code == os.CLD_DUMPED else 0)
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if pidfd is not None:
                select.select([pidfd], [], [], left)
            else:
                time.sleep(min(left, 0.005))
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _thread(target, *args) -> threading.Thread:
    """Start ``target(*args)`` on a daemon thread."""
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def _feed(fd: int, data: bytes) -> None:
    """Write ``data`` to the pipe ``fd`` and close it (quietly, if its reader is gone)."""
    try:
        _write_all(fd, data)
    except OSError:
        pass
    finally:
        os.close(fd)


def _send(task, fd: int, message: dict) -> None:
    """Write ``message`` to the pipe ``fd`` in ``task``'s framing and close it (quietly, if its reader is gone)."""
    try:
        task.write_msg(fd, message)
    except OSError:
        pass
    finally:
        os.close(fd)


class _Collector:
    """Reads a pipe on its own thread until end of file, keeping at most ``cap`` bytes."""

    def __init__(self, fd: int, cap: int):
        self.fd, self.cap = fd, cap
        self.data = bytearray()
        self.lock = threading.Lock()
        self.done = threading.Event()
        _thread(self._read)

    def _read(self) -> None:
        """Append what arrives until end of file."""
        try:
            while True:
                chunk = os.read(self.fd, 1 << 16)
                if not chunk:
                    break
                with self.lock:
                    if len(self.data) < self.cap:
                        self.data += chunk[: self.cap - len(self.data)]
        except OSError:
            pass
        finally:
            os.close(self.fd)
            self.done.set()

    def snapshot(self) -> bytearray:
        """What has arrived so far."""
        with self.lock:
            return bytearray(self.data)


class _Judge:
    """The judge's thread and the read end of the pipe its verdict records go to."""

    def __init__(self, thread: threading.Thread, verdicts_r: int):
        self.thread, self.verdicts_r = thread, verdicts_r


def _judge(task, judge: dict, req_w: int, resp_r: int) -> _Judge:
    """Start ``task.run_judge`` on a thread of this process, its test programs and verdicts on pipes of their own.

    The verdicts are read once the judge is done, or at the deadline (before the child is killed: a test cut short
    by the deadline has no verdict, as in the local pool), so their pipe holds a megabyte where the kernel allows.
    """
    sources_r, sources_w = os.pipe()
    verdicts_r, verdicts_w = os.pipe()
    try:
        fcntl.fcntl(verdicts_w, F_SETPIPE_SZ, VERDICT_PIPE_BYTES)
    except OSError:
        pass
    _thread(_send, task, sources_w, {"seq": 1, "sources": judge["sources"]})
    fds = {"sources": sources_r, "verdicts": verdicts_w, "req": req_w, "resp": resp_r}

    def run() -> None:
        try:
            task.run_judge({"judge": {"entry_point": judge["entry_point"], "seq": 1}}, fds)
        finally:
            for fd in fds.values():  # the child's serving loop sees end of file
                os.close(fd)

    return _Judge(_thread(run), verdicts_r)


def _drain(fd: int) -> bytes:
    """Everything the pipe ``fd`` holds now (without waiting for more)."""
    os.set_blocking(fd, False)
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


def _verdict_records(raw: bytes) -> list[dict]:
    """The judge's verdict records, whole lines only, without the sequence number."""
    records = []
    for line in bytes(raw).split(b"\n"):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            record.pop("seq", None)
            records.append(record)
    return records


if __name__ == "__main__":
    main()
