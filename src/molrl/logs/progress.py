"""A Trainer's progress as one bar of the shared console (``molrl.logs.console``), with live figures.

It lives apart from ``molrl.logs.console`` because it subclasses transformers' ``TrainerCallback``: the
console is loaded by the CLI before it checks a config, which must not wait for transformers and torch.

The bar's figures end with the tokens trained on so far where the trainer counts them (``num_input_tokens_seen``,
else the token counts a MoL step logs), so a heartbeat line written while a long step runs says how far the run
has come. The bar closes when ``train`` returns or raises: a failed run's heartbeat never outlives it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from typing import Any, Mapping

from transformers import TrainerCallback

from molrl import cpu
from molrl.logs.console import StageBar, figures_text, stage_bar, verbose

log = logging.getLogger(__name__)


class TrainerProgress(TrainerCallback):
    """A Trainer's progress as one bar with live figures (replaces its tqdm bar and printed dicts)."""

    def __init__(self, description: str, figures: Mapping[str, str]):
        self.description, self.figures = description, dict(figures)
        self._bar: contextlib.ExitStack | None = None
        self._handle: StageBar | None = None
        self._logged_tokens = 0  # the token counts logged so far (MoL logs them per logging period)

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        self._bar = contextlib.ExitStack()
        self._handle = self._bar.enter_context(stage_bar(self.description, state.max_steps, state.global_step))

    def on_step_end(self, args, state, control, **kwargs):
        cpu.tick()
        # a step that logs moves the bar in on_log, with its own figures: moved here, a progress line written now
        # would show the previous step's figures (and the last step's never)
        if self._handle is not None and not control.should_log:
            self._handle.update(completed=state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        if verbose():
            log.debug("%s step %d: %s", self.description, state.global_step, logs)
        counts = [logs.get(key) for key in LOGGED_TOKENS]
        self._logged_tokens += sum(int(c) for c in counts if isinstance(c, (int, float)) and math.isfinite(c))
        if self._handle is not None:
            shown = None
            if any(key in logs for key in self.figures):
                tokens = state.num_input_tokens_seen or self._logged_tokens
                shown = figures_text(self.figures, logs) + (f"  tokens {tokens:,}" if tokens else "")
            self._handle.update(completed=state.global_step, figures=shown)

    def on_train_end(self, args, state, control, **kwargs):
        if self._handle is not None:
            self._handle.update(completed=state.global_step)
        self.close()

    def close(self) -> None:
        """Close the bar (and its heartbeat) if it is open."""
        if self._bar is not None:
            self._bar.close()
            self._bar = self._handle = None


LOGGED_TOKENS = ("tokens_feedback", "tokens_decision", "tokens_general")
"""Log keys that count tokens trained on (``molrl.mol.trainer``), summed for the bar when the trainer counts none."""


def use_trainer_progress(trainer: Any, description: str, figures: Mapping[str, str]) -> None:
    """Give ``trainer`` one bar with ``figures`` (log key -> label) instead of tqdm and printed dicts."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for callback in (ProgressCallback, PrinterCallback):
        trainer.remove_callback(callback)
    with contextlib.suppress(ImportError):
        from transformers.utils.notebook import NotebookProgressCallback

        trainer.remove_callback(NotebookProgressCallback)
    progress = TrainerProgress(description, figures)
    trainer.add_callback(progress)
    train = trainer.train

    @functools.wraps(train)
    def train_then_close(*args: Any, **kwargs: Any) -> Any:
        try:
            return train(*args, **kwargs)
        finally:  # callbacks hear no exception: a step that raised would leave the bar's heartbeat running
            progress.close()

    trainer.train = train_then_close
