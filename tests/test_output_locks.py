"""One lock per output folder, whatever the stage (``molrl.records.locks.folder_lock`` / ``file_lock``): for every pair of
stages (the same stage twice included), one holding its lock on a folder X refuses the other on X, in one line
naming the holder's pid. A lock a killed run left is taken over by the next run of every stage, naming the dead pid;
an output folder that cannot be written is refused by every stage in one line. And a folder holds one stage's run:
for every ordered pair of stages with a folder output, B is refused on A's folder, naming A, and A resumes there.

Each stage is run through the CLI on X (a file output: a file in X). First, with the lock primitive replaced by a
recorder, each stage's lock file is recorded; then, for each pair (A, B), this process holds A's lock file and B is
refused. Holding it in this process is enough: a lock is held by an open file, and B opens its own. The other tests
stop each stage once it holds its folder (and, where it has a folder of its own, has claimed it), before anything
loads.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from molrl.records import locks

from molrl.records import writes
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
        patch.setattr(locks, "_hold", record)
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
    with locks._hold(lock, out, "use another output"):
        assert main(STAGES[second](out, tmp_path)) == 1
        assert not (out / "config.yaml").exists()  # before: mol wrote its config.yaml into collect's folder
    (error,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert f"is being written by another run (pid {os.getpid()}); wait for it to end, or " in error
    assert error.startswith(str(out)) and "\n" not in error


def test_a_lock_is_removed_when_its_run_ends_and_a_killed_holders_file_is_taken_over(tmp_path):
    out = tmp_path / "X"
    with locks.folder_lock(out, "use another output"):
        assert (out / ".lock").read_text() == f"{os.getpid()}\n{socket.gethostname()}\n"
    assert not (out / ".lock").exists()
    (out / ".lock").write_text("12345\n")  # what a killed holder leaves: the file, no lock on it
    with locks.folder_lock(out, "use another output"):
        assert (out / ".lock").read_text() == f"{os.getpid()}\n{socket.gethostname()}\n"


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
    with locks.folder_lock(out, "use another output"):
        monkeypatch.setattr(os, "open", real_open)
        assert (out / ".lock").exists()  # it locked the file that is there, not the removed one
        with pytest.raises(MolrlError, match=rf"pid {os.getpid()}"):
            with locks.folder_lock(out, "use another output"):
                pass


def test_a_stream_output_takes_no_lock(tmp_path):
    fifo = tmp_path / "streams" / "fifo"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    with locks.file_lock(fifo, "give another OUT"):
        assert sorted(p.name for p in fifo.parent.iterdir()) == ["fifo"]  # not even in the FIFO's folder (/dev)


# --- a lock a killed run left -----------------------------------------------------------------------------------------

class _Taken(MolrlError):
    """Raised once a stage has taken its lock: it stops there, before anything loads."""


def _dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


FORKS_THEN_DIES = """
import os, signal, sys, time
from molrl.records.locks import folder_lock
with folder_lock(sys.argv[1], "use another output"):
    child = os.fork()
    if child == 0:  # a worker the run forked (an engine's process, say), which outlives it
        for fd in (1, 2):
            os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
        time.sleep(60)
        os._exit(0)
    print(child, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


LEFT = ["a lock file", "a child it forked", "a lock its processes hold", "another machine's lock"]
"""What a killed run can leave behind on its output's lock."""


@pytest.mark.parametrize("left", LEFT)
@pytest.mark.parametrize("stage", STAGES)
def test_a_lock_a_killed_run_left_is_taken_over_naming_its_pid(stage, left, tmp_path, monkeypatch, caplog):
    out = tmp_path / "X"
    lock = _lock_of(stage, out, tmp_path, monkeypatch)
    lock.parent.mkdir(parents=True, exist_ok=True)
    held, child = None, None
    if left == "a child it forked":
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        proc = subprocess.run([sys.executable, "-c", FORKS_THEN_DIES, str(lock.parent)], env=env, capture_output=True,
                              text=True, timeout=60)
        child, dead = int(proc.stdout.split()[0]), int(lock.read_text().split()[0])
        assert proc.returncode == -9 and not writes.alive(str(dead))
    else:
        dead = _dead_pid()
        host = "elsewhere" if left == "another machine's lock" else socket.gethostname()
        lock.write_text(f"{dead}\n{host}\n")
        if left != "a lock file":  # still locked: by a process the killed run left (or one on the other machine)
            held = open(lock, "rb+")
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    real_take = locks._take

    def take_then_stop(*args):
        os.close(real_take(*args))
        raise _Taken("taken")

    monkeypatch.setattr(locks, "_take", take_then_stop)
    monkeypatch.setattr(locks, "LOOK_AGAIN_S", 0.05)
    caplog.clear()
    caplog.set_level(logging.WARNING)
    try:
        assert main(STAGES[stage](out, tmp_path)) == 1
    finally:
        if held is not None:
            held.close()
        if child is not None:
            os.kill(child, 9)
    (error,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    if left == "another machine's lock":  # its pid says nothing here: refused, naming the machine
        assert f"is being written by another run (pid {dead} on elsewhere)" in error and "\n" not in error
        return
    assert error == "taken"  # before, where a process the killed run forked lived on: refused, naming the dead pid
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert f"(pid {dead})" in warning and "taking over" in warning and "\n" not in warning  # before: taken silently
    if left == "a child it forked":  # the child never held the lock: the killed run's file was simply left
        assert "ended without releasing it" in warning


# --- a folder that cannot be written --------------------------------------------------------------------------------

FOLDER_STAGES = ["collect", "mol", "rl", "eval", "pipeline", "export"]
"""Every stage whose output is a folder of its own run."""

UNWRITABLE = ["a read-only folder", "a new folder in a read-only one"]


@pytest.fixture(scope="module")
def unwritable(tmp_path_factory, shared_data) -> dict[tuple[str, str], subprocess.CompletedProcess]:
    """Every stage of ``STAGES`` run (as its own process) on each case of ``UNWRITABLE``; root runs them without its
    power to write anywhere (CAP_DAC_OVERRIDE), as any other user would."""
    root = tmp_path_factory.mktemp("unwritable")
    (root / "mbpp.jsonl").symlink_to(shared_data / "mbpp" / "mbpp.jsonl")
    ro = root / "ro"
    (ro / "X").mkdir(parents=True)
    _traces(root)
    prefix = []
    if os.geteuid() == 0:
        if not Path("/usr/bin/setpriv").exists():
            pytest.skip("root without setpriv: a read-only folder cannot be made for it")
        caps = "-dac_override,-dac_read_search"
        prefix = ["/usr/bin/setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}"]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    os.chmod(ro / "X", 0o555)
    done = {}
    try:
        for case in UNWRITABLE:
            os.chmod(ro, 0o555 if case == "a new folder in a read-only one" else 0o755)
            out = ro / ("X" if case == "a read-only folder" else "new")
            for stage in STAGES:
                done[stage, case] = subprocess.run([*prefix, sys.executable, "-m", "molrl.cli",
                                                    *STAGES[stage](out, root)], env=env, capture_output=True,
                                                   text=True, timeout=300)
    finally:
        os.chmod(ro, 0o755)
        os.chmod(ro / "X", 0o755)
    return done


@pytest.mark.parametrize("case", UNWRITABLE)
@pytest.mark.parametrize("stage", STAGES)
def test_an_unwritable_output_folder_is_refused_in_one_line_naming_it(stage, case, unwritable):
    result = unwritable[stage, case]
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr[-3000:]  # before: a PermissionError traceback
    folder = "ro/X" if case == "a read-only folder" else "ro"
    (line,) = lines
    assert f"{folder} is not writable by this user" in line and "make it writable" in line and " ERROR " in line


# --- a folder holds one stage's run ---------------------------------------------------------------------------------

class _Claimed(MolrlError):
    """Raised once a stage has claimed its output folder: it stops there, before anything loads."""


def _claims(monkeypatch) -> None:
    """Make every stage stop once it has claimed its output folder (``molrl.records.locks.claim_folder``)."""
    real = locks.claim_folder

    def claim_then_stop(folder, stage, output, fix):
        real(folder, stage, output, fix)
        raise _Claimed(f"{stage} claimed {folder}")

    monkeypatch.setattr(locks, "claim_folder", claim_then_stop)


def _error(stage: str, out: Path, tmp_path: Path, caplog) -> str:
    """The one error line ``stage`` run through the CLI on ``out`` ends with."""
    caplog.clear()
    caplog.set_level(logging.ERROR)
    assert main(STAGES[stage](out, tmp_path)) == 1
    (error,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    return error


LEFT_BEFORE = {"collect": {"config.yaml": "episode: {}\n", "traces.jsonl": "{}\n"},
               "mol": {"config.yaml": "loss: {}\n", "data_stats.json": "{}"},
               "rl": {"config.yaml": "algorithm: grpo\n", "data_summary.json": "{}"},
               "eval": {"config.yaml": "benchmarks: [math500]\n", "math500/samples.jsonl": "{}\n"},
               "pipeline": {"config.yaml": "stages: [eval]\n", "environment.json": "{}"},
               "export": {writes.WHOLE: "", "config.json": "{}"}}
"""What a run of each stage left in its folder before stage files were written: its saved config (an export: the
folder written whole) and a file only it leaves, named last."""


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != ".lock"}


def test_every_stage_with_a_folder_output_claims_it_under_its_own_name(tmp_path, monkeypatch, caplog):
    _claims(monkeypatch)
    for stage in FOLDER_STAGES:
        out = tmp_path / stage
        assert _error(stage, out, tmp_path, caplog) == f"{stage} claimed {out}"
        assert (out / writes.STAGE).read_text() == f"{stage}\n"


@pytest.mark.parametrize("made", ["its stage file", "the files it left before stage files"])
@pytest.mark.parametrize("owner,second", [(a, b) for a in FOLDER_STAGES for b in FOLDER_STAGES if a != b])
def test_a_folder_holding_one_stages_run_refuses_every_other_and_stays_resumable(owner, second, made, tmp_path,
                                                                                 monkeypatch, caplog):
    out = tmp_path / "X"
    _claims(monkeypatch)
    if made == "its stage file":
        assert _error(owner, out, tmp_path, caplog) == f"{owner} claimed {out}"
        (out / "made.bin").write_bytes(b"what the run made")
        evidence = writes.STAGE
    else:
        for name, text in LEFT_BEFORE[owner].items():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_text(text)
        evidence = list(LEFT_BEFORE[owner])[-1]
    before = _files(out)
    error = _error(second, out, tmp_path, caplog)
    # before: molrl mol on collect's folder trained there and replaced its config.yaml; collect could not resume
    assert error.startswith(f"{out}: holds a {owner} run ({evidence}); molrl {second} does not write into another "
                            f"stage's run, so molrl {owner} can still resume it; ") and "\n" not in error
    assert _files(out) == before
    assert _error(owner, out, tmp_path, caplog) == f"{owner} claimed {out}"  # its own stage takes it up again
    assert (out / writes.STAGE).read_text() == f"{owner}\n"


def test_a_folder_of_inputs_is_no_stages_run(tmp_path, monkeypatch, caplog):
    """A folder holding a user's config and traces (``molrl mol --config config.yaml output_dir=.``) is not taken for
    a collect run: a run's saved config says which stage saved it."""
    out = tmp_path / "X"
    out.mkdir()
    (out / "config.yaml").write_text("loss: {mode: mol}\n")
    (out / "traces.jsonl").write_text("{}\n")
    _claims(monkeypatch)
    assert _error("mol", out, tmp_path, caplog) == f"mol claimed {out}"


def test_a_folder_whose_run_made_nothing_is_any_stages(tmp_path, monkeypatch, caplog):
    """A stage file in a folder that holds nothing else (its run ended before making anything) claims nothing: the
    next stage takes the folder."""
    out = tmp_path / "X"
    out.mkdir()
    (out / writes.STAGE).write_text("mol\n")
    _claims(monkeypatch)
    assert _error("collect", out, tmp_path, caplog) == f"collect claimed {out}"
    assert (out / writes.STAGE).read_text() == "collect\n"
