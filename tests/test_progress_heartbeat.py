"""Progress on output that is not a terminal is never silent for longer than ``MOLRL_PROGRESS_EVERY`` seconds, even
while one unit of work (a training step of minutes) runs: a heartbeat line, and none once the run has ended."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from molrl.cli import main
from molrl.logs.console import PlainProgress, stage_bar

REPO = Path(__file__).resolve().parents[1]
HEARTBEAT = "molrl-progress-heartbeat"


def _beating() -> bool:
    return any(t.name == HEARTBEAT for t in threading.enumerate())


def test_a_silent_task_gets_a_line_every_interval_a_finished_one_none_and_none_after_the_display_closes():
    stream = io.StringIO()
    with PlainProgress(stream, every_s=0.2) as progress:
        done = progress.add_task("eval mbpp", total=2, figures="")
        progress.update(done, completed=2)
        progress.add_task("mol run", total=8, figures="")
        time.sleep(1.1)  # one step that takes five intervals, and moves nothing
    lines = stream.getvalue().splitlines()
    assert len([line for line in lines if " eval mbpp " in line]) == 2  # its start and its end
    assert 5 <= len([line for line in lines if " mol run 0/8 (0%)" in line]) <= 7
    assert not _beating()
    time.sleep(0.5)
    assert stream.getvalue().splitlines() == lines  # nothing written after the display closed


def test_every_stage_bar_beats(monkeypatch, capsys):
    """collect, eval and the demo draw a ``stage_bar`` (or ``new_progress``): the heartbeat is theirs too."""
    monkeypatch.setenv("MOLRL_PROGRESS_EVERY", "0.2")
    with stage_bar("collect", total=4):
        time.sleep(0.7)
    lines = capsys.readouterr().err.splitlines()
    assert len([line for line in lines if " collect 0/4 (0%)" in line]) >= 3


class _SlowFirstStep:
    """A Trainer callback whose first step takes ``seconds`` (and raises after it when ``fail``)."""

    def __init__(self, seconds: float, fail: bool = False):
        self.seconds, self.fail = seconds, fail

    def __getattr__(self, name):  # every other event: nothing
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            time.sleep(self.seconds)
            if self.fail:
                raise RuntimeError("the step failed")


def _slow_first_step(monkeypatch, seconds: float, fail: bool = False) -> None:
    import molrl.logs.progress as trainer_progress

    original = trainer_progress.use_trainer_progress

    def with_slow_step(trainer, description, figures):
        original(trainer, description, figures)
        trainer.add_callback(_SlowFirstStep(seconds, fail))

    monkeypatch.setattr(trainer_progress, "use_trainer_progress", with_slow_step)


STAGES = {
    "mol": ["mol", "--config", str(REPO / "configs" / "mol_tiny.yaml"), "train.max_steps=2", "train.report_to=[none]",
            f"data.traces=[{REPO / 'configs' / 'data' / 'mol_tiny_traces.jsonl'}]"],
    "rl": ["rl", "--config", str(REPO / "configs" / "rl_tiny.yaml"), "train.max_steps=2", "sampling.max_new_tokens=4"],
}


@pytest.mark.parametrize("stage", STAGES)
def test_a_training_step_longer_than_the_interval_is_not_silent(stage, tmp_path, monkeypatch, capsys, cli_logs):
    monkeypatch.setenv("MOLRL_PROGRESS_EVERY", "0.5")
    _slow_first_step(monkeypatch, 2.5)
    assert main([*STAGES[stage], f"output_dir={tmp_path / 'run'}"]) == 0
    lines = capsys.readouterr().err.splitlines()
    first = [line for line in lines if re.search(r" 0/2 \(0%\)", line)]
    assert len(first) >= 4  # before: the start line only, then nothing until the step ended
    assert any(re.search(r" 2/2 \(100%\)", line) for line in lines)
    assert not _beating()
    time.sleep(1.0)
    assert capsys.readouterr().err == ""  # nothing after the run ended


def test_mol_lines_say_how_many_tokens_were_trained_on(tmp_path, monkeypatch, capsys, cli_logs):
    monkeypatch.setenv("MOLRL_PROGRESS_EVERY", "0.01")
    assert main([*STAGES["mol"], "train.logging_steps=1", f"output_dir={tmp_path / 'run'}"]) == 0
    tokens = [int(m.group(1).replace(",", "")) for m in re.finditer(r"tokens ([\d,]+)", capsys.readouterr().err)]
    assert tokens and tokens == sorted(tokens) and tokens[-1] > 0


def test_a_failed_training_run_stops_its_heartbeat(tmp_path, monkeypatch, capsys, cli_logs):
    monkeypatch.setenv("MOLRL_PROGRESS_EVERY", "0.2")
    _slow_first_step(monkeypatch, 0.6, fail=True)
    with pytest.raises(RuntimeError, match="the step failed"):
        main([*STAGES["mol"], f"output_dir={tmp_path / 'run'}"])
    assert len(re.findall(r" 0/2 \(0%\)", capsys.readouterr().err)) >= 2  # the failing step was not silent
    assert not _beating()  # and the bar's heartbeat ended with the run
    time.sleep(0.6)
    assert capsys.readouterr().err == ""


PIPED = """
import logging, time
from molrl.logs.console import setup_logging, stage_bar
setup_logging()
logging.getLogger("molrl.piped").info("started")
with stage_bar("collect", total=4):
    time.sleep(2.0)  # one unit of work that outlasts several intervals
"""

STAMPED = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")


@pytest.mark.parametrize("env", [{}, {"FORCE_COLOR": "1"}, {"TTY_COMPATIBLE": "1"}],
                         ids=["plain", "FORCE_COLOR", "TTY_COMPATIBLE"])
def test_into_a_pipe_a_timestamped_progress_line_comes_every_interval(env):
    """stdout and stderr both a pipe, read as the lines arrive: whatever asks rich for colour, progress is a
    timestamped line every interval, written as it happens, not a bar's frames at the end."""
    run_env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "MOLRL_PROGRESS_EVERY": "0.4", **env}
    for name in {"FORCE_COLOR", "TTY_COMPATIBLE"} - set(env):
        run_env.pop(name, None)
    proc = subprocess.Popen([sys.executable, "-c", PIPED], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=run_env, text=True)
    arrived = [(time.monotonic(), line.rstrip("\n")) for line in proc.stdout]
    assert proc.wait() == 0
    lines = [line for _, line in arrived]
    assert not any("\x1b" in line for line in lines)  # before, under FORCE_COLOR: a bar's control codes, no line
    assert any(STAMPED.match(line) and line.endswith(" INFO started") for line in lines)
    beats = [at for at, line in arrived if STAMPED.match(line) and " collect 0/4 (0%)" in line]
    assert len(beats) >= 4 and beats[-1] - beats[0] >= 1.0  # they came as the work ran, not all at its end
