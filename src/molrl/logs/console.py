"""The console a user watches: log lines, and one rich progress bar per stage with its live figures.

Every stage draws on one shared ``rich`` console, so log lines scroll above the bar instead of
tearing it. A stage's bar shows its step count, elapsed and remaining time, and a few figures
(loss terms, reward); the full figures go to the stage's files (``metrics.jsonl``,
tensorboard), never to the console. Third-party noise (the Trainer's raw log dicts and tqdm
bars, deprecation warnings raised inside transformers, peft's note about a missing config file)
is held back unless ``-v`` asks for detail: then the bars stay and every raw log dict is also
printed as a debug line.
A Trainer's bar is ``molrl.logs.progress``'s (it needs transformers; this module does not).

When the output is not a terminal (a log file, a pipe, a batch job; ``live_terminal``, whatever ``FORCE_COLOR``
says), a bar would show only its last frame, and rich would cut lines at 80 columns. There, log lines are plain and
timestamped, and every bar becomes a timestamped progress line at its start, every ``MOLRL_PROGRESS_EVERY`` seconds
(default 30) while it runs, and at its end, at full width (``PlainProgress``). A unit of work that takes
longer (a training step of minutes) is never silent for longer either: a heartbeat thread writes the bar's
line again, its elapsed time moved on, whenever none was written for that long.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import threading
import time
import warnings
from typing import Any, Callable, Iterator, Mapping, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from molrl import cpu

CONSOLE = Console(stderr=True)
"""The one console that log lines and progress bars share."""

log = logging.getLogger(__name__)

NOISE = (
    # raised by transformers' own Trainer code on every run; nothing a user of molrl can change
    (FutureWarning, r".*`is_gradient_checkpointing` is deprecated"),
    # peft looks for a hub config to check the vocabulary; in-process and local models have none
    (UserWarning, r"Could not find a config file in"),
    (UserWarning, r".*does not have many workers which may be a bottleneck"),
)
"""(category, message regex) of third-party warnings hidden unless ``-v``."""

PROGRESS_EVERY_S = 30.0
"""Seconds between two progress lines of a bar when the output is not a terminal (``MOLRL_PROGRESS_EVERY``)."""

_state = {"verbose": False}


class CurrentStderrHandler(logging.StreamHandler):
    """A log handler that writes to ``sys.stderr`` as it is when each line is logged: a stderr replaced after
    logging was set up (captured by a test, redirected by a caller) gets the lines, not the stream it replaced."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # StreamHandler sets it; the live sys.stderr is used instead
        pass


def setup_logging(verbose: bool = False) -> None:
    """Log lines through the shared console; hide third-party noise unless ``verbose``."""
    from rich.logging import RichHandler

    _state["verbose"] = verbose
    if live_terminal():
        handler: logging.Handler = RichHandler(console=CONSOLE, rich_tracebacks=False, show_path=False)
    else:  # a file or a pipe: whole lines, each with its date and time
        handler = CurrentStderrHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S"))
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(message)s",
        datefmt="[%X]",
        handlers=[handler],
        force=True,
    )
    if verbose:
        return
    for category, message in NOISE:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name in ("transformers", "peft", "accelerate", "datasets", "trl", "urllib3", "filelock", "matplotlib"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if "transformers" in sys.modules or "huggingface_hub" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_warning()
        hf_logging.disable_progress_bar()
    else:  # the CLI's start-up: transformers reads these when a stage imports it (importing it here costs ~1 s)
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "warning")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def live_terminal() -> bool:
    """Whether the console writes to a terminal that a live bar redraws in place: rich's judgement and the stream's own
    ``isatty``. ``FORCE_COLOR`` or ``TTY_COMPATIBLE=1`` make rich take a pipe or a file for a terminal (they ask for
    colour); a bar drawn there leaves only its frames, with no line for as long as a step runs."""
    isatty = getattr(CONSOLE.file, "isatty", None)
    try:
        return CONSOLE.is_terminal and bool(isatty and isatty())
    except ValueError:  # a closed stream (the end of a test run)
        return False


def verbose() -> bool:
    """Whether ``-v`` asked for detail."""
    return _state["verbose"]


def format_figure(value: Any) -> str:
    """A figure as a bar shows it: 4 significant digits, ``-`` when missing."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-" if value is None else str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "-"
    return f"{value:.4g}"


def figures_text(figures: Mapping[str, str], values: Mapping[str, Any]) -> str:
    """``label value`` pairs for the keys of ``figures`` (log key -> label) present in ``values``."""
    return "  ".join(f"{label} {format_figure(values[key])}" for key, label in figures.items() if key in values)


def new_progress() -> "Progress | PlainProgress":
    """A progress display on the shared console: name, bar, n/N, live figures, elapsed < remaining; plain
    timestamped lines instead when the console is not a terminal."""
    if not live_terminal():
        return PlainProgress(CONSOLE.file)
    return _TickingProgress(
        TextColumn("[bold]{task.description}"), BarColumn(bar_width=16), MofNCompleteColumn(),
        TextColumn("{task.fields[figures]}"), TimeElapsedColumn(), TextColumn("<"), TimeRemainingColumn(),
        console=CONSOLE,
    )


class _TickingProgress(Progress):
    """rich's ``Progress`` that lets the thread governor re-measure the machine as work advances."""

    def update(self, *args: Any, **kwargs: Any) -> None:
        cpu.tick()
        super().update(*args, **kwargs)

    def advance(self, *args: Any, **kwargs: Any) -> None:
        cpu.tick()
        super().advance(*args, **kwargs)


def progress_every_s() -> float:
    """Seconds between progress lines: ``MOLRL_PROGRESS_EVERY`` when set to a positive number, else 30."""
    try:
        every = float(os.environ.get("MOLRL_PROGRESS_EVERY", PROGRESS_EVERY_S))
    except ValueError:
        return PROGRESS_EVERY_S
    return every if every > 0 else PROGRESS_EVERY_S


class PlainProgress:
    """Progress as timestamped lines, for output that is not a terminal: the part of rich's ``Progress`` the
    stages use (``add_task``, ``update``, ``advance``, a context manager).

    Each task writes a line when added, then at most one every ``every_s`` seconds as it moves, and one when it
    completes or the display closes; lines are never cut. ``clock`` gives seconds since the epoch.

    Used as a context manager, a heartbeat thread also writes an unfinished task's line whenever none was written
    for ``every_s`` seconds (of real time), so a unit of work longer than that (a training step) is not silent;
    it stops when the display closes, before the last lines, and never writes after.
    """

    def __init__(self, stream: TextIO, every_s: float | None = None, clock: Callable[[], float] = time.time):
        self.stream, self.clock = stream, clock
        self.every_s = progress_every_s() if every_s is None else every_s
        self.tasks: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()  # the heartbeat thread writes too: one line at a time, from one state
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def __enter__(self) -> "PlainProgress":
        self._heartbeat = threading.Thread(target=self._beat, name="molrl-progress-heartbeat", daemon=True)
        self._heartbeat.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
        with self._lock:
            for task_id, task in self.tasks.items():
                if task["shown"] != task["completed"]:
                    self._write(task_id)

    def _beat(self) -> None:
        """Write the line of each unfinished task that has been silent for ``every_s`` seconds, until stopped."""
        while not self._stop.wait(self._until_due()):
            with self._lock:
                if self._stop.is_set():
                    return
                for task_id, task in self.tasks.items():
                    if not _done(task) and time.monotonic() - task["beat"] >= self.every_s:
                        self._write(task_id)

    def _until_due(self) -> float:
        """Seconds until the next unfinished task has been silent for ``every_s``."""
        with self._lock:
            due = [task["beat"] + self.every_s for task in self.tasks.values() if not _done(task)]
        return max(0.01, min(due, default=time.monotonic() + self.every_s) - time.monotonic())

    def add_task(self, description: str, total: float | None = None, completed: float = 0, **fields: Any) -> int:
        """A new task (its first line is written now); returns its id."""
        with self._lock:
            task_id = len(self.tasks)
            now = self.clock()
            self.tasks[task_id] = {"description": description, "total": total, "completed": completed,
                                   "start": completed, "started": now, "fields": fields, "shown": None, "at": now}
            self._write(task_id)
        return task_id

    def update(self, task_id: int, *, completed: float | None = None, advance: float | None = None,
               total: float | None = None, **fields: Any) -> None:
        """Move a task and replace its fields; writes a line when ``every_s`` has passed or the task completed."""
        cpu.tick()
        with self._lock:
            self._move(self.tasks[task_id], completed, advance, total, fields)
            task = self.tasks[task_id]
            if (_done(task) and task["shown"] != task["completed"]) or self.clock() - task["at"] >= self.every_s:
                self._write(task_id)

    def _move(self, task: dict[str, Any], completed: float | None, advance: float | None, total: float | None,
              fields: dict[str, Any]) -> None:
        if total is not None:
            task["total"] = total
        if completed is not None:
            task["completed"] = completed
        if advance:
            task["completed"] += advance
        task["fields"].update({k: v for k, v in fields.items() if k not in ("description", "visible", "refresh")})

    def advance(self, task_id: int, advance: float = 1) -> None:
        """Move a task by ``advance``."""
        self.update(task_id, advance=advance)

    def _write(self, task_id: int) -> None:
        task, now = self.tasks[task_id], self.clock()
        self.stream.write(progress_line(task["description"], task["completed"], task["total"], task["start"],
                                        now - task["started"], task["fields"].get("figures", ""), now) + "\n")
        self.stream.flush()
        task["shown"], task["at"], task["beat"] = task["completed"], now, time.monotonic()


def _done(task: dict[str, Any]) -> bool:
    """Whether a ``PlainProgress`` task has reached its total."""
    return task["total"] is not None and task["completed"] >= task["total"]


def progress_line(description: str, completed: float, total: float | None, start: float, elapsed_s: float,
                  figures: str, now: float) -> str:
    """One progress line: date and time, the task, n/N (percent), its figures, elapsed and estimated remaining time.

    >>> progress_line("mol", 30, 120, 0, 60.0, "loss 1.2", now=0.0)[20:]  # after the 20 characters of the date
    'mol 30/120 (25%)  loss 1.2  elapsed 0:01:00, left 0:03:00'
    """
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    count = f"{completed:g}/{total:g} ({100 * completed / total:.0f}%)" if total else f"{completed:g}"
    left = ""
    if total and completed > start:
        left = f", left {_clock_time(elapsed_s / (completed - start) * (total - completed))}"
    return f"{stamp} {description} {count}" + (f"  {figures}" if figures else "") + \
        f"  elapsed {_clock_time(elapsed_s)}{left}"


def _clock_time(seconds: float) -> str:
    seconds = int(round(max(0.0, seconds)))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


@contextlib.contextmanager
def stage_bar(description: str, total: int, completed: int = 0) -> Iterator["StageBar"]:
    """One bar for a stage of ``total`` units; yields a ``StageBar`` to advance and annotate."""
    with new_progress() as progress:
        yield StageBar(progress, progress.add_task(description, total=total, completed=completed, figures=""))


class StageBar:
    """A handle on one task of a ``Progress`` (or a ``PlainProgress``)."""

    def __init__(self, progress: "Progress | PlainProgress", task_id: Any):
        self.progress, self.task_id = progress, task_id

    def update(self, completed: int | None = None, advance: int = 0, figures: str | None = None) -> None:
        """Move the bar (to ``completed``, or by ``advance``) and replace its figures."""
        fields = {} if figures is None else {"figures": figures}
        if completed is not None:
            self.progress.update(self.task_id, completed=completed, **fields)
        else:
            self.progress.update(self.task_id, advance=advance, **fields)
