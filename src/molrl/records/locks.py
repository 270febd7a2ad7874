"""Who may write an output: one run at a time, and in a folder output, one stage's run.

``folder_lock`` / ``file_lock`` hold an output for one run, whatever the stage: a folder output's lock is
``<folder>/.lock`` (``molrl.records.writes.LOCK``), a file output's is its folder's (so a file written into another run's
folder waits for that run), a stream has none. A second run on a held output is refused in one line naming the output
and the holder's pid (and host, when it is another machine's). The kernel frees the lock when its holder dies, kill -9
included; a run that ends removes its lock file, and the next run on a lock file a killed run left takes it over,
naming that run's pid. A forked child does not keep its parent's lock (a worker outliving a killed run would hold the
output for a dead run); should a lock still be held by processes of a run whose pid is gone on this machine, the next
run takes it over too. An output folder that cannot be written (read-only, another user's, a read-only filesystem) is
refused in one line naming it and the fix.

A folder holds one stage's run: ``folder_lock(..., stage=...)`` (every stage takes its output folder so) writes the
stage's name to ``<folder>/.molrl_stage`` (``molrl.records.writes.STAGE``), and refuses, in one line naming that stage, a
folder holding another stage's run, before anything loads; so the run there stays resumable by its own stage. A run
written before that file existed is known by what it left (``MADE_BEFORE``); a folder holding nothing but a lock and a
stage file (its run ended before making anything) is any stage's to take.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import socket
import time
from pathlib import Path
from typing import Iterator

from molrl.errors import MolrlError
from molrl.records.writes import LOCK, STAGE, WHOLE, alive, resolve_output, write_text

log = logging.getLogger(__name__)


@contextlib.contextmanager
def folder_lock(out: str | Path, fix: str, stage: str | None = None) -> Iterator[None]:
    """Hold the folder output ``out`` for this run while the block runs (its lock: ``<out>/.lock``); refuse
    (``MolrlError``, one line naming ``out`` and the holder's pid, then ``fix``) when another run holds it. With
    ``stage``, the folder is that stage's run (``claim_folder``): one holding another stage's run is refused."""
    folder = resolve_output(out, folder=True).path
    with _hold(folder / LOCK, out, fix):
        if stage is None:
            yield
            return
        claimed = claim_folder(folder, stage, out, fix)
        try:
            yield
        except BaseException:
            if claimed is not None and _entries(folder) == claimed:  # the run left nothing: the folder is no one's
                (folder / STAGE).unlink(missing_ok=True)
            raise


def file_lock(path: str | Path, fix: str) -> contextlib.AbstractContextManager[None]:
    """Hold the file output ``path`` for this run while the block runs: its folder's lock, as ``folder_lock``
    takes it; a stream (a FIFO, a device) needs none. Refuses as ``folder_lock`` does."""
    out = resolve_output(path)
    if out.kind == "stream":
        return contextlib.nullcontext()
    return _hold(out.path.parent / LOCK, path, fix)


MADE_BEFORE = {"collect": ("traces*.jsonl", "episode"), "mol": ("data_stats.json", "loss"),
               "rl": ("data_summary.json", "algorithm"), "eval": ("*/samples.jsonl", "benchmarks"),
               "pipeline": ("environment.json", "stages"), "export": ("config.json", None)}
"""Per stage, how a run written before ``STAGE`` existed is known: a file only its runs leave, and a top-level key of
the ``config.yaml`` it saved beside it (an export saves none: its folder is one ``write_folder`` wrote, with
``WHOLE``)."""


def claim_folder(folder: Path, stage: str, output: str | Path, fix: str) -> set[str] | None:
    """Make the folder output ``folder`` ``stage``'s run, or refuse it (``MolrlError``, one line naming the stage whose
    run it holds, then ``fix``); returns what the folder held when this call wrote its ``STAGE`` file (None: the file
    named the stage already, or another rank of the launch writes it)."""
    owners = folder_stages(folder)
    if owners and stage not in owners:
        owner, evidence = next(iter(owners.items()))
        raise MolrlError(f"{output}: holds a {owner} run ({evidence}); molrl {stage} does not write into another "
                         f"stage's run, so molrl {owner} can still resume it; {fix}")
    if owners.get(stage) == STAGE or os.environ.get("RANK", "0") != "0":
        return None
    held = _entries(folder)  # nothing, or a run of this stage written before stage files: named now
    write_text(folder / STAGE, f"{stage}\n")
    return held


def folder_stages(folder: Path) -> dict[str, str]:
    """The stage whose run ``folder`` holds, with the file that says so: its ``STAGE`` file, or for a run written
    before those, every stage whose ``MADE_BEFORE`` marks it holds; none for a folder that holds no run."""
    if not _entries(folder):
        return {}
    with contextlib.suppress(OSError):
        named = (folder / STAGE).read_text().strip()
        if named:
            return {named: STAGE}
    saved = _saved_keys(folder / "config.yaml")
    found = {}
    for stage, (pattern, key) in MADE_BEFORE.items():
        left = sorted(folder.glob(pattern))
        if left and ((folder / WHOLE).is_file() if key is None else key in saved):
            found[stage] = str(left[0].relative_to(folder))
    return found


def _saved_keys(config: Path) -> set[str]:
    """The top-level keys of a run's saved ``config.yaml`` (none when it is missing, too large or not a mapping)."""
    import yaml

    try:
        if config.stat().st_size > 1 << 20:
            return set()
        data = yaml.safe_load(config.read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return set()
    return set(data) if isinstance(data, dict) else set()


def _entries(folder: Path) -> set[str]:
    """What ``folder`` holds but its lock and stage files (and a killed write's temporary of one)."""
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return set()
    return {n for n in names if n not in (LOCK, STAGE) and not n.startswith(f".{STAGE}.tmp-")}


@contextlib.contextmanager
def _hold(lock: Path, output: str | Path, fix: str) -> Iterator[None]:
    """Hold the lock file ``lock`` for writing ``output``; only rank 0 of a multi-process launch locks (every rank
    takes the same decisions; rank 0 writes). The file is removed on release, so an ended run leaves none behind."""
    if os.environ.get("RANK", "0") != "0":
        yield
        return
    fd = _take(lock, output, fix)
    _HELD.add(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n{socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        if fd in _HELD:  # else this is a forked child, which closed its copy at the fork (``_forked``)
            _HELD.discard(fd)
            if _is(fd, lock):
                lock.unlink()
            os.close(fd)  # closing the descriptor releases the lock


LOOK_AGAIN_S = 0.5
"""Seconds to wait before a lock held by processes of a run whose pid is gone is taken over: a new holder writes its
pid just after it locks, so the file may name the run before it for that long."""


def _take(lock: Path, output: str | Path, fix: str) -> int:
    """The descriptor of ``lock``, opened (created with its folder if need be) and locked for this run; refuses a
    lock another run holds, and an output that cannot be written, each in one line."""
    looked_again = False
    while True:
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise MolrlError(_unwritable(output, err, fix)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder, seen = _holder(fd), os.fstat(fd)
            os.close(fd)
            if not _gone(holder):
                raise MolrlError(f"{output} is being written by another run ({_named(holder)}); wait for it to end, "
                                 f"or {fix}") from None
            if not looked_again:
                looked_again = True
                time.sleep(LOOK_AGAIN_S)
                continue
            log.warning("%s: its run (%s) is gone, but processes it left hold its lock %s; taking over", output,
                        _named(holder), lock)
            with contextlib.suppress(FileNotFoundError):
                if (os.stat(lock).st_dev, os.stat(lock).st_ino) == (seen.st_dev, seen.st_ino):
                    lock.unlink()  # they keep the old file; this run locks a new one
            continue
        if _is(fd, lock):
            left = _holder(fd)
            if left[0]:
                log.warning("%s: taking over from the run that held it (%s), which ended without releasing it "
                            "(killed)", output, _named(left))
            return fd
        os.close(fd)  # its last holder removed it between our open and our lock: lock the file there now


def _holder(fd: int) -> tuple[str, str]:
    """(pid, host) a lock file names: the run that holds it, or held it last; empty strings where it names none."""
    lines = os.pread(fd, 512, 0).decode("utf-8", "replace").split()
    return (lines[0] if lines and lines[0].isdigit() else "", lines[1] if len(lines) > 1 else "")


def _named(holder: tuple[str, str]) -> str:
    """A lock's holder as an error line names it: its pid, and its host when that is another machine."""
    pid, host = holder
    elsewhere = f" on {host}" if host and host != socket.gethostname() else ""
    return f"pid {pid or 'unknown'}{elsewhere}"


def _gone(holder: tuple[str, str]) -> bool:
    """Whether the run a lock file names has ended: a pid of this machine (the file names this host, or none, as files
    written before hosts were named) that no process has."""
    pid, host = holder
    if not pid or int(pid) == os.getpid() or host not in ("", socket.gethostname()):
        return False
    return not alive(pid)


def _unwritable(output: str | Path, err: OSError, fix: str) -> str:
    """The one line refusing an output whose lock could not be made there (``err``), naming the folder and the fix."""
    where = Path(err.filename or output)
    folder = where.parent if where.name == LOCK or not where.is_dir() else where
    if err.errno == errno.EROFS:
        return f"{output}: {folder} is on a read-only filesystem; give an output on a writable one, or {fix}"
    if err.errno in (errno.EACCES, errno.EPERM):
        return f"{output}: {folder} is not writable by this user; make it writable (chmod u+w {folder}), or {fix}"
    return f"{output}: cannot write {where} ({err.strerror}); {fix}"


_HELD: set[int] = set()
"""The descriptors of the locks this process holds."""


def _forked() -> None:
    """In a forked child, close its copies of the parent's lock descriptors: a lock is held until every copy is closed,
    and a child that outlives its parent (an engine's worker, say) would hold the output for a run that is gone."""
    for fd in _HELD:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_forked)


def _is(fd: int, path: Path) -> bool:
    """Whether the open file ``fd`` is the file at ``path`` now."""
    try:
        there = os.stat(path)
    except FileNotFoundError:
        return False
    here = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)
