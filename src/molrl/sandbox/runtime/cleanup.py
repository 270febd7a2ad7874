"""What a job leaves behind, found and removed before the next job: processes, files, SysV IPC.

Processes are found as descendants of the job server (a child subreaper, so orphans re-parent to
it) or, inside a pid namespace where the scan is cheap, by the slot's uids. Files are removed
without recursion, relative to directory fds, so no tree is too deep or too long to remove. SysV
IPC objects (shared memory, message queues, semaphores) outlive their creator by design; those the
slot's uids created are removed as their creator.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import os
import signal
import time

_libc = ctypes.CDLL(None, use_errno=True)
_IPC_RMID = 0
_SYSV_REMOVERS = {  # /proc/sysvipc file -> (id column, remove(id) -> 0 or -1)
    "shm": ("shmid", lambda id_: _libc.shmctl(id_, _IPC_RMID, None)),
    "msg": ("msqid", lambda id_: _libc.msgctl(id_, _IPC_RMID, None)),
    "sem": ("semid", lambda id_: _libc.semctl(id_, 0, _IPC_RMID, 0)),
}


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
    """Whether ``pid`` has finished exiting: a zombie, dead, or gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except OSError:
        return True


def scan_proc(uids: tuple, own_pid: int) -> list[int]:
    """Every live process under ``uids`` (None entries ignored), from a full /proc scan."""
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


def _task_processes(uids: tuple, root: int, full_scan: bool) -> list[int]:
    """Every live process that belongs to the job: a descendant of ``root`` or, with ``full_scan``,
    any process of its uids."""
    found = descendants(root)
    if found is None or full_scan:
        found = set(found or ()) | set(scan_proc(uids, root))
    return sorted(found)


def kill_all(pids: list[int], uids: tuple, full_scan: bool, root: int | None = None) -> int:
    """SIGKILL the job's process groups and every remaining job process (below ``root``, default this
    process, or with ``full_scan`` under the job's uids); how many strays there were.

    The tree is read before anything is killed, and each later look waits until what was killed
    before it has died: a dying parent hands its children to the subreaper, and the children files
    are read one process at a time, so a look during that hand-over can find the child in neither
    list and leave it running.
    """
    own = os.getpid()
    root = root or own
    standing = [p for p in _task_processes(uids, root, full_scan) if p != own]
    strays: set[int] = {p for p in standing if p not in pids}
    for pid in pids:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    dying = _kill_each(strays) + list(pids)
    until = time.monotonic() + 10.0
    for attempt in itertools.count():
        _wait_dead(dying, until)
        found = [p for p in _task_processes(uids, root, full_scan) if p not in pids and p != own]
        if not found or time.monotonic() > until:
            break
        strays.update(found)
        if attempt % 50 == 0:  # again now and then: kill(-1) as the uid catches whatever forked since
            for uid in uids:
                if uid is not None:
                    _kill_uid(uid)
        dying = _kill_each(found)
        reap_exited()
    return len(strays)


def _kill_each(pids) -> list[int]:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return list(pids)


def _wait_dead(pids: list[int], until: float) -> None:
    """Wait (until ``until`` at most: a process stuck in the kernel may take longer) until every one
    of ``pids`` is a zombie or gone: by then it has handed its children to the subreaper."""
    while any(not _is_zombie(p) for p in pids) and time.monotonic() < until:
        reap_exited()
        time.sleep(0.0005)


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


def reap_exited() -> dict[int, int]:
    """Reap every child that has exited, without waiting; pid -> wait status."""
    statuses = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return statuses
        if pid == 0:
            return statuses
        statuses[pid] = status


def remove_ipc(uids: tuple) -> list[str]:
    """Remove the SysV IPC objects that ``uids`` created (their processes are gone); what failed.

    Each is removed as its creator (a creator may always remove its object), so no privilege
    beyond changing the effective uid is needed.
    """
    wanted = {uid for uid in uids if uid is not None}
    failed = []
    for kind, (id_column, remove) in _SYSV_REMOVERS.items() if wanted else ():
        try:
            with open(f"/proc/sysvipc/{kind}") as fh:
                head, *rows = fh.read().splitlines()
        except (OSError, ValueError):
            continue
        columns = head.split()
        for row in rows:
            fields = dict(zip(columns, row.split()))
            creator = int(fields["cuid"])
            if creator not in wanted:
                continue
            own_euid = os.geteuid()
            os.seteuid(creator)
            try:
                if remove(int(fields[id_column])) != 0:
                    failed.append(f"{kind} {fields[id_column]}: {os.strerror(ctypes.get_errno())}")
            finally:
                os.seteuid(own_euid)
    return failed


def remove_tree(path: str) -> str | None:
    """Remove the directory ``path`` and everything under it; None when it is gone, else why not.

    Iterative and relative to directory fds: neither the depth of the tree nor the length of its
    paths limits it, and symlinks are removed, never followed.
    """
    try:
        os.rmdir(path)  # the usual case: the task left its work dir empty
        return None
    except FileNotFoundError:
        return None
    except OSError:
        pass
    try:
        _empty(path)
        os.rmdir(path)
    except OSError as err:
        return f"{path}: {err.strerror or err}"
    return None


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def _open_dir(name: str, dir_fd: int | None) -> int:
    """Open a directory for removing its entries, making it readable and writable first if need be."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        os.chmod(name, 0o700, dir_fd=dir_fd)
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    try:
        os.fchmod(fd, 0o700)  # entries of a read-only directory cannot be unlinked
    except OSError:
        pass
    return fd


def _empty(path: str) -> None:
    """Remove everything under ``path``, one directory level held open at a time."""
    fd = _open_dir(path, None)
    pending = [_unlink_files(fd)]  # per level: its subdirectories still to remove
    entered: list[str] = []  # the names of the directories descended into
    try:
        while pending:
            if pending[-1]:
                name = pending[-1].pop()
                try:
                    os.rmdir(name, dir_fd=fd)
                    continue
                except OSError as err:
                    if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                        raise
                child = _open_dir(name, fd)
                os.close(fd)
                fd = child
                entered.append(name)
                pending.append(_unlink_files(fd))
                continue
            pending.pop()
            if entered:
                parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = parent
                os.rmdir(entered.pop(), dir_fd=fd)
    finally:
        os.close(fd)


def _unlink_files(fd: int) -> list[str]:
    """Unlink every non-directory in the directory ``fd``; the names of its subdirectories."""
    with os.scandir(fd) as entries:
        listed = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
    for name, is_dir in listed:
        if not is_dir:
            os.unlink(name, dir_fd=fd)
    return [name for name, is_dir in listed if is_dir]
