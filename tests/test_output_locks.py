"""One lock per output folder, whatever the stage (``molrl.writes.folder_lock`` / ``file_lock``): for every pair of
stages (the same stage twice included), one holding its lock on a folder X refuses the other on X, in one line
naming the holder's pid.

Each stage is run through the CLI on X (a file output: a file in X). First, with the lock primitive replaced by a
recorder, each stage's lock file is recorded; then, for each pair (A, B), this process holds A's lock file and B is
refused. Holding it in this process is enough: a lock is held by an open file, and B opens its own.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from pathlib import Path

import pytest

from molrl import writes
from molrl.cli import main
from molrl.errors import MolrlError

REPO = Path(__file__).resolve().parents[1]


def _traces(tmp_path: Path) -> Path:
    src = tmp_path / "in.jsonl"
    if not src.exists():
        src.write_text(json.dumps({"messages": [{"role": "user", "content": "t"},
                                                {"role": "assistant", "content": "a"}]}) + "\n")
    return src


STAGES = {
    "collect": lambda x, t: ["collect", "--model", "tiny:chatml", "--tasks", str(t / "mbpp.jsonl"), "--format", "mbpp",
                             "--limit", "1", "--out", str(x)],
    "mol": lambda x, t: ["mol", "--config", str(REPO / "configs/mol_tiny.yaml"), f"output_dir={x}",
                         f"data.traces=[{REPO / 'configs/data/mol_tiny_traces.jsonl'}]"],
    "rl": lambda x, t: ["rl", "--config", str(REPO / "configs/rl_tiny.yaml"), f"output_dir={x}"],
    "eval": lambda x, t: ["eval", "--model", "tiny:chatml", "--benchmarks", "math500", "--out", str(x)],
    "pipeline": lambda x, t: ["pipeline", "model=tiny:chatml", f"output_dir={x}", "stages=[eval]",
                              "eval_models=[base]"],
    "export": lambda x, t: ["export", "--merge", "--adapter", str(t / "no-adapter"), "--out", str(x)],
    "traces convert": lambda x, t: ["traces", "convert", "--from", "openai", str(_traces(t)), str(x / "out.jsonl")],
    "traces filter": lambda x, t: ["traces", "filter", str(_traces(t)), str(x / "kept.jsonl")],
}
"""Every stage that writes an output, as a command line writing into the folder X."""


class _Recorded(MolrlError):
    """Raised by the recording lock: the stage asked for its lock and stops there."""


def _lock_of(stage: str, out: Path, tmp_path: Path, monkeypatch) -> Path:
    """The lock file ``stage`` takes for its output in ``out``."""
    taken: list[Path] = []

    def record(lock, output, fix):
        taken.append(Path(lock))
        raise _Recorded(f"{stage} locks {lock}")

    with monkeypatch.context() as patch:
        patch.setattr(writes, "_hold", record)
        assert main(STAGES[stage](out, tmp_path)) == 1
    assert len(taken) == 1, f"{stage} took {len(taken)} locks"
    return taken[0]


@pytest.fixture(autouse=True)
def _logs_and_tasks(monkeypatch, tmp_path, shared_data):
    monkeypatch.setattr("molrl.cli.setup_logging", lambda verbose=False: None)
    (tmp_path / "mbpp.jsonl").symlink_to(shared_data / "mbpp" / "mbpp.jsonl")  # collect's task file


def test_every_stage_locks_its_output_folder(tmp_path, monkeypatch):
    out = tmp_path / "X"
    locks = {stage: _lock_of(stage, out, tmp_path, monkeypatch) for stage in STAGES}
    assert locks == {stage: out / ".lock" for stage in STAGES}  # before: collect locked X/traces.jsonl.lock


@pytest.mark.parametrize("holder,second", list(itertools.product(STAGES, STAGES)))
def test_a_stage_holding_a_folder_refuses_every_other(holder, second, tmp_path, monkeypatch, caplog):
    out = tmp_path / "X"
    lock = _lock_of(holder, out, tmp_path, monkeypatch)
    caplog.clear()
    caplog.set_level(logging.ERROR)
    with writes._hold(lock, out, "use another output"):
        assert main(STAGES[second](out, tmp_path)) == 1
        assert not (out / "config.yaml").exists()  # before: mol wrote its config.yaml into collect's folder
    (error,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert f"is being written by another run (pid {os.getpid()}); wait for it to end, or " in error
    assert error.startswith(str(out)) and "\n" not in error


def test_a_lock_is_removed_when_its_run_ends_and_a_killed_holders_file_is_taken_over(tmp_path):
    out = tmp_path / "X"
    with writes.folder_lock(out, "use another output"):
        assert (out / ".lock").read_text() == f"{os.getpid()}\n"
    assert not (out / ".lock").exists()
    (out / ".lock").write_text("12345\n")  # what a killed holder leaves: the file, no lock on it
    with writes.folder_lock(out, "use another output"):
        assert (out / ".lock").read_text() == f"{os.getpid()}\n"


def test_a_lock_file_removed_by_its_last_holder_is_not_shared(tmp_path, monkeypatch):
    """A run that opened the lock file just before its holder ended (and removed it) must not go on holding the
    removed file: a third run would lock a new file at the same path, and both would run."""
    out = tmp_path / "X"
    out.mkdir()
    real_open, opened = os.open, []

    def open_then_holder_ends(path, flags, mode=0o777):
        fd = real_open(path, flags, mode)
        if Path(path).name == ".lock" and not opened:
            opened.append(fd)
            Path(path).unlink()  # the holder ended between this run's open and its lock
        return fd

    monkeypatch.setattr(os, "open", open_then_holder_ends)
    with writes.folder_lock(out, "use another output"):
        monkeypatch.setattr(os, "open", real_open)
        assert (out / ".lock").exists()  # it locked the file that is there, not the removed one
        with pytest.raises(MolrlError, match=rf"pid {os.getpid()}"):
            with writes.folder_lock(out, "use another output"):
                pass


def test_a_stream_output_takes_no_lock(tmp_path):
    fifo = tmp_path / "streams" / "fifo"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    with writes.file_lock(fifo, "give another OUT"):
        assert sorted(p.name for p in fifo.parent.iterdir()) == ["fifo"]  # not even in the FIFO's folder (/dev)
