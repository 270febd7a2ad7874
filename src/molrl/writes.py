"""How a run writes what it leaves: whole or not at all, and one writer per output.

Every file or folder a stage leaves for good (an adapter, a final model, ``config.yaml``, a summary, a report,
a pipeline stage's ``DONE`` marker) is written through ``write_text`` / ``write_bytes`` / ``write_folder``: the
content goes to a temporary name in the same folder (``.NAME.tmp-PID`` for a file, ``NAME.tmp-PID/`` for a
folder), is flushed to disk (fsync), and is renamed into place (``os.replace``), so a reader, or a re-run after a
kill, sees either the old thing or the new one, never half of one. A temporary left by a killed writer is removed
by the next write of the same name. Append-only logs (``metrics.jsonl``, ``completions.jsonl``, samples, traces)
are appended to instead: a kill tears at most their last line, which their readers repair (``molrl.jsonl``).

``output_lock`` holds an output for one run: a second run on the same output (of any stage) is refused in one line
naming the output and the holder's pid. The kernel frees the lock when its holder dies, kill -9 included.

For tests, the environment variable ``MOLRL_KILL_AT=NAME`` makes the process kill itself (SIGKILL) when a write of
``NAME`` (a file's or folder's name, e.g. ``adapter``) has its content on disk under the temporary name and is about
to be renamed into place: the worst moment for a kill.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
from pathlib import Path
from typing import Iterator

from molrl.errors import MolrlError

KILL_AT = "MOLRL_KILL_AT"
"""The environment variable naming the write a test kills the process at (see the module docstring)."""


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically: whole, or not at all."""
    write_bytes(path, text.encode("utf-8"))


def write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary name in the same folder, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")  # per process: ranks writing one file do not collide
    with tmp.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    _kill_point(path.name)
    os.replace(tmp, path)
    _sync_folder(path.parent)


@contextlib.contextmanager
def write_folder(path: str | Path, *, writer: bool = True) -> Iterator[Path]:
    """Yield a temporary folder to fill; on a clean exit it replaces ``path`` whole (an old ``path`` goes).

    ``writer`` false (the other ranks of a multi-process launch) yields the same temporary folder and renames
    nothing: rank 0 commits it. Its name holds the process group's id, which every rank of a launch shares.
    """
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp-{_writer_id()}")
    if writer:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(path)
        tmp.mkdir()
    yield tmp
    if not writer:
        return
    for file in tmp.rglob("*"):
        if file.is_file():
            with file.open("rb") as handle:
                os.fsync(handle.fileno())
    _kill_point(path.name)
    old = path.with_name(f"{path.name}.old-{_writer_id()}")
    if path.exists():
        os.replace(path, old)  # a kill between here and the next rename leaves no path: a re-run rebuilds it
    os.replace(tmp, path)
    _sync_folder(path.parent)
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def output_lock(lock: str | Path, output: str | Path, fix: str) -> Iterator[None]:
    """Hold the lock file ``lock`` for writing ``output`` while the block runs; refuse (``MolrlError``, one line naming
    ``output`` and the holder's pid, then ``fix``) when another run holds it. Only rank 0 of a multi-process launch
    locks (every rank takes the same decisions; rank 0 writes)."""
    if os.environ.get("RANK", "0") != "0":
        yield
        return
    lock = Path(lock)
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            raise MolrlError(f"{output} is being written by another run (pid {holder}); wait for it to end, or "
                             f"{fix}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def folder_lock(out: str | Path, fix: str) -> contextlib.AbstractContextManager[None]:
    """``output_lock`` for a stage whose output is a folder: the lock file is ``<out>/.lock``."""
    return output_lock(Path(out) / ".lock", out, fix)


def _writer_id() -> int:
    """The process group's id: this process's, or the launcher's that every rank of a launch shares."""
    return os.getpgrp() if "RANK" in os.environ else os.getpid()


def _remove_stale(path: Path) -> None:
    """Remove temporaries of ``path`` a killed writer left: those whose writer (the process or process group their
    name ends with) is gone. A live one is another rank of this launch writing the same file."""
    for stale in [*path.parent.glob(f".{path.name}.tmp-*"), *path.parent.glob(f"{path.name}.tmp-*"),
                  *path.parent.glob(f"{path.name}.old-*")]:
        if _alive(stale.name.rsplit("-", 1)[-1]):
            continue
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


def _alive(writer: str) -> bool:
    """Whether the process (or process group) ``writer`` names still runs (never this process's own leftovers)."""
    if not writer.isdigit() or int(writer) in (os.getpid(), 0):
        return False
    try:
        os.kill(int(writer), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_point(name: str) -> None:
    if os.environ.get(KILL_AT) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def _sync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` itself durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
