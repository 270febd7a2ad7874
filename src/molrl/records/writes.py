"""How a run writes what it leaves: whole or not at all, and one writer per output.

Every file or folder a stage leaves for good (an adapter, a final model, ``config.yaml``, a summary, a report,
a pipeline stage's ``DONE`` marker) is written through ``write_text`` / ``write_bytes`` / ``write_folder``: the
content goes to a temporary name in the same folder (``.NAME.tmp-PID`` for a file, ``NAME.tmp-PID/`` for a
folder), is flushed to disk (fsync), and is renamed into place (``os.replace``), so a reader, or a re-run after a
kill, sees either the old thing or the new one, never half of one. A temporary left by a killed writer is removed
by the next write of the same name. Append-only logs (``metrics.jsonl``, ``completions.jsonl``, samples, traces)
are appended to instead (``append_text``): a kill tears at most their last line, which their readers repair
(``molrl.records.jsonl``).

One rule for what an output path may already be (``resolve_output``), for every writer here and every appender:
  * nothing, or a regular file: written whole as above (a file output), or appended to;
  * a folder: a folder output is replaced whole; a file output there is refused in one line;
  * a FIFO or a character device (``/dev/null``, a terminal): a stream, written in place and never renamed over,
    so ``--rejects /dev/null`` drops what it is given and a FIFO's reader gets the lines (opening a FIFO waits for
    its reader, as a shell's ``> fifo`` does); a folder output there is refused;
  * a socket, a block device (a disk) or any other special file: refused in one line naming the path and the fix;
  * a symbolic link is followed to what it finally names, and the rule applies there: the file it points to is
    replaced (the link stays a link), a link to nothing creates its target, a loop is refused.

Who may write an output (one run at a time, and one stage's run in a folder) is ``molrl.records.locks``'s.

For tests, the environment variable ``MOLRL_KILL_AT=NAME`` makes the process kill itself (SIGKILL) when a write of
``NAME`` (a file's or folder's name, e.g. ``adapter``) has its content on disk under the temporary name and is about
to be renamed into place: the worst moment for a kill.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

from molrl.errors import MolrlError

KILL_AT = "MOLRL_KILL_AT"
"""The environment variable naming the write a test kills the process at (see the module docstring)."""


@dataclass(frozen=True)
class Output:
    """Where a write of an output path lands, by the module's rule (``resolve_output``)."""

    path: Path
    """The path written: the one given, or what its symbolic links finally name."""
    kind: str
    """``new`` (nothing there yet), ``file``, ``folder`` or ``stream`` (a FIFO or character device)."""


def resolve_output(path: str | Path, *, folder: bool = False) -> Output:
    """Where a write of the output ``path`` (a folder output when ``folder``) lands, by the module's rule; raises
    ``MolrlError`` (one line naming the path and the fix) for what may not be written: a socket, a block device, a
    symbolic-link loop, a folder for a file output, or a file or stream for a folder output."""
    path = Path(path)
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    named = f"{path} (a link to {target})" if target != path else str(path)
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        return Output(target, "new")
    kind = _KINDS.get(stat.S_IFMT(mode))
    if kind is None:
        raise MolrlError(f"{named}: {_REFUSED.get(stat.S_IFMT(mode), 'is a special file')}, which molrl never writes "
                         "over; give the path of a file or a folder")
    if folder and kind != "folder":
        what = "a file" if kind == "file" else "a FIFO or device"
        raise MolrlError(f"{named}: is {what}, and this output is a folder; give a folder path (or remove it)")
    if not folder and kind == "folder":
        raise MolrlError(f"{named}: is a folder, and this output is a file; give a file path (or remove the folder)")
    return Output(target, kind)


_KINDS = {stat.S_IFREG: "file", stat.S_IFDIR: "folder", stat.S_IFIFO: "stream", stat.S_IFCHR: "stream"}
_REFUSED = {stat.S_IFSOCK: "is a socket", stat.S_IFBLK: "is a block device (a disk)",
            stat.S_IFLNK: "is a symbolic link that never reaches a file (a loop)"}


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically: whole, or not at all."""
    write_bytes(path, text.encode("utf-8"))


def write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary name in the same folder, fsync, rename); a stream in place."""
    with open_output(path) as handle:
        handle.write(data)


@contextlib.contextmanager
def open_output(path: str | Path) -> Iterator[BinaryIO]:
    """A binary handle whose writes become ``path`` by the module's rule: a file whole when the block ends cleanly
    (temporary name, fsync, rename; nothing changes when it raises), a stream in place as they are made."""
    out = resolve_output(path)
    if out.kind == "stream":
        with open(os.open(out.path, os.O_WRONLY), "wb") as handle:  # no O_TRUNC, no rename: a device stays one
            yield handle
        return
    path = out.path
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")  # per process: ranks writing one file do not collide
    try:
        with tmp.open("wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _kill_point(path.name)
    os.replace(tmp, path)
    _sync_folder(path.parent)


def append_text(path: str | Path, text: str, *, sync: bool = False) -> None:
    """Append ``text`` (UTF-8) to the log ``path`` by the module's rule (a file, created if new, or a stream), in one
    write; ``sync`` flushes it to disk before returning."""
    out = resolve_output(path)
    out.path.parent.mkdir(parents=True, exist_ok=True)
    with out.path.open("ab") as handle:
        handle.write(text.encode("utf-8"))
        handle.flush()
        if sync and out.kind != "stream":
            os.fsync(handle.fileno())


LOCK = ".lock"
"""The lock file of a folder output, inside it, or of a file output, beside it (``molrl.records.locks``)."""
WHOLE = ".molrl_whole"
"""An empty file ``write_folder`` puts in every folder it writes: such a folder is replaced whole by the next write."""
STAGE = ".molrl_stage"
"""The file naming the stage whose run a folder output holds (``molrl.records.locks.claim_folder``), carried over when
``write_folder`` replaces the folder."""


def would_lose(old: Path, new: Path) -> list[str]:
    """The entries of the existing folder ``old`` that replacing it with ``new`` would delete: none when ``old`` is
    a folder ``write_folder`` wrote (it holds ``WHOLE``), else the names in ``old`` that ``new`` does not write again
    (an export into a run folder, or a folder of the user's own), but for the run's own lock file."""
    if not old.is_dir() or (old / WHOLE).is_file():
        return []
    return sorted(set(os.listdir(old)) - set(os.listdir(new)) - {LOCK})


@contextlib.contextmanager
def write_folder(path: str | Path, *, writer: bool = True) -> Iterator[Path]:
    """Yield a temporary folder to fill; on a clean exit it replaces ``path`` whole (an old ``path`` goes), unless
    that would delete what ``path`` holds and the new folder does not (``would_lose``): then nothing is replaced and
    the error names the entries.

    ``writer`` false (the other ranks of a multi-process launch) yields the same temporary folder and renames
    nothing: rank 0 commits it. Its name holds the process group's id, which every rank of a launch shares.
    """
    given, path = path, resolve_output(path, folder=True).path
    tmp = path.with_name(f"{path.name}.tmp-{_writer_id()}")
    if writer:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(path)
        tmp.mkdir()
    yield tmp
    if not writer:
        return
    (tmp / WHOLE).touch()
    if (path / STAGE).is_file() and not (tmp / STAGE).exists():
        shutil.copyfile(path / STAGE, tmp / STAGE)  # the folder stays its stage's run (molrl.records.locks)
    lost = would_lose(path, tmp)
    if lost:
        shutil.rmtree(tmp, ignore_errors=True)
        more = f" and {len(lost) - 3} more" if len(lost) > 3 else ""
        raise MolrlError(f"{given}: already holds {', '.join(lost[:3])}{more}, which writing the folder whole would "
                         "delete; give a new or empty folder, or move those out first")
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


def plain_name(name: str) -> bool:
    """Whether ``name`` (a run's or an adapter's, which becomes a folder's) is one plain folder name: not empty, not
    ``.`` or ``..``, and without ``/``, ``\\`` or NUL, so that it stays inside the folder it is put in."""
    return isinstance(name, str) and name not in ("", ".", "..") and not any(c in name for c in "/\\\0")


def _writer_id() -> int:
    """The process group's id: this process's, or the launcher's that every rank of a launch shares."""
    return os.getpgrp() if "RANK" in os.environ else os.getpid()


def _remove_stale(path: Path) -> None:
    """Remove temporaries of ``path`` a killed writer left: those whose writer (the process or process group their
    name ends with) is gone. A live one is another rank of this launch writing the same file."""
    for stale in [*path.parent.glob(f".{path.name}.tmp-*"), *path.parent.glob(f"{path.name}.tmp-*"),
                  *path.parent.glob(f"{path.name}.old-*")]:
        if alive(stale.name.rsplit("-", 1)[-1]):
            continue
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


def alive(writer: str) -> bool:
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
