"""Progress on output that is not a terminal (a log file, a pipe): timestamped whole lines at a steady interval."""

from __future__ import annotations

import io
import logging
import re
import sys
import time

from molrl.logs import console
from molrl.logs.console import PlainProgress

STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) ")


class FakeClock:
    """Seconds since the epoch, moved by hand."""

    def __init__(self, start: float = 1_700_000_000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now


def test_a_loop_writes_a_timestamped_full_line_every_interval():
    stream, clock = io.StringIO(), FakeClock()
    figures = "reward 0.4375  kl 0.01234  len 37.5  " + "x" * 60  # the line passes 80 columns
    with PlainProgress(stream, every_s=30, clock=clock) as progress:
        task = progress.add_task("grpo mol+grpo", total=100, figures="")
        for _ in range(100):  # one step every 1.5 s: 150 s in all
            clock.now += 1.5
            progress.update(task, advance=1, figures=figures)
    lines = stream.getvalue().splitlines()
    # the start, then one line every 30 s (steps 20, 40, 60, 80) and the last step's
    assert [int(re.search(r" (\d+)/100 ", line).group(1)) for line in lines] == [0, 20, 40, 60, 80, 100]
    stamps = [time.mktime(time.strptime(STAMP.match(line).group(1), "%Y-%m-%d %H:%M:%S")) for line in lines]
    assert [b - a for a, b in zip(stamps, stamps[1:])] == [30.0, 30.0, 30.0, 30.0, 30.0]
    assert all(line.endswith(("left 0:01:30", "left 0:01:00", "left 0:00:30", "left 0:00:00")) for line in lines[2:])
    assert lines[1].endswith(figures + "  elapsed 0:00:30, left 0:02:00") and len(lines[1]) > 120  # 20 steps in 30 s


def test_the_interval_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("MOLRL_PROGRESS_EVERY", "5")
    assert PlainProgress(io.StringIO()).every_s == 5.0
    monkeypatch.setenv("MOLRL_PROGRESS_EVERY", "often")
    assert PlainProgress(io.StringIO()).every_s == console.PROGRESS_EVERY_S == 30.0


def test_log_lines_to_a_file_are_whole_and_timestamped(tmp_path, monkeypatch):
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    path = tmp_path / "run.log"
    with path.open("w") as fh:
        monkeypatch.setattr(sys, "stderr", fh)
        console.setup_logging(verbose=False)
        logging.getLogger("molrl.test").info("a line of %d characters: %s", 200, "y" * 170)
        for handler in root.handlers:
            handler.flush()
    root.handlers[:], root.level = saved
    (line,) = path.read_text().splitlines()
    assert STAMP.match(line) and line.endswith("y" * 170) and " INFO a line of 200 characters: " in line
