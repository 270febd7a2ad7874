"""The console a user watches: log lines, and one rich progress bar per stage with its live figures.

Every stage draws on one shared ``rich`` console, so log lines scroll above the bar instead of
tearing it. A stage's bar shows its step count, elapsed and remaining time, and a few figures
(loss terms, reward); the full figures go to the stage's files (``metrics.jsonl``,
tensorboard), never to the console. Third-party noise (the Trainer's raw log dicts and tqdm
bars, deprecation warnings raised inside transformers, peft's note about a missing config file)
is held back unless ``-v`` asks for detail: then the bars stay and every raw log dict is also
printed as a debug line.
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from typing import Any, Iterator, Mapping

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from transformers import TrainerCallback

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

_state = {"verbose": False}


def setup_logging(verbose: bool = False) -> None:
    """Log lines through the shared console; hide third-party noise unless ``verbose``."""
    from rich.logging import RichHandler

    _state["verbose"] = verbose
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(message)s",
        datefmt="[%X]",
        handlers=[RichHandler(console=CONSOLE, rich_tracebacks=False, show_path=False)],
        force=True,
    )
    if verbose:
        return
    for category, message in NOISE:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name in ("transformers", "peft", "accelerate", "datasets", "trl", "urllib3", "filelock", "matplotlib"):
        logging.getLogger(name).setLevel(logging.WARNING)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_warning()
    hf_logging.disable_progress_bar()


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


def new_progress() -> Progress:
    """A progress display on the shared console: name, bar, n/N, live figures, elapsed < remaining."""
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(bar_width=16), MofNCompleteColumn(),
        TextColumn("{task.fields[figures]}"), TimeElapsedColumn(), TextColumn("<"), TimeRemainingColumn(),
        console=CONSOLE,
    )


@contextlib.contextmanager
def stage_bar(description: str, total: int, completed: int = 0) -> Iterator["StageBar"]:
    """One bar for a stage of ``total`` units; yields a ``StageBar`` to advance and annotate."""
    with new_progress() as progress:
        yield StageBar(progress, progress.add_task(description, total=total, completed=completed, figures=""))


class StageBar:
    """A handle on one task of a ``Progress``."""

    def __init__(self, progress: Progress, task_id: Any):
        self.progress, self.task_id = progress, task_id

    def update(self, completed: int | None = None, advance: int = 0, figures: str | None = None) -> None:
        """Move the bar (to ``completed``, or by ``advance``) and replace its figures."""
        fields = {} if figures is None else {"figures": figures}
        if completed is not None:
            self.progress.update(self.task_id, completed=completed, **fields)
        else:
            self.progress.update(self.task_id, advance=advance, **fields)


class TrainerProgress(TrainerCallback):
    """A Trainer's progress as one bar with live figures (replaces its tqdm bar and printed dicts)."""

    def __init__(self, description: str, figures: Mapping[str, str]):
        self.description, self.figures = description, dict(figures)
        self._bar: contextlib.ExitStack | None = None
        self._handle: StageBar | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        self._bar = contextlib.ExitStack()
        self._handle = self._bar.enter_context(stage_bar(self.description, state.max_steps, state.global_step))

    def on_step_end(self, args, state, control, **kwargs):
        cpu.tick()
        if self._handle is not None:
            self._handle.update(completed=state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        if verbose():
            log.debug("%s step %d: %s", self.description, state.global_step, logs)
        if self._handle is not None and any(key in logs for key in self.figures):
            self._handle.update(completed=state.global_step, figures=figures_text(self.figures, logs))

    def on_train_end(self, args, state, control, **kwargs):
        if self._bar is not None:
            self._bar.close()
            self._bar = self._handle = None


def use_trainer_progress(trainer: Any, description: str, figures: Mapping[str, str]) -> None:
    """Give ``trainer`` one bar with ``figures`` (log key -> label) instead of tqdm and printed dicts."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for callback in (ProgressCallback, PrinterCallback):
        trainer.remove_callback(callback)
    with contextlib.suppress(ImportError):
        from transformers.utils.notebook import NotebookProgressCallback

        trainer.remove_callback(NotebookProgressCallback)
    trainer.add_callback(TrainerProgress(description, figures))
