"""The stop rule for a sandbox that keeps failing: past ``sandbox.max_error_rate`` of graded rows, a run stops.

A row whose execution was a ``sandbox_error`` is never a verdict: RL leaves it out of the loss, evaluation out of
its accuracy, collection out of its traces. A few such rows cost a run little; a sandbox that fails often (a remote
server down, workers dying) would leave a run training on, or reporting, a biased remainder. Every stage counts its
rows as it grades them (``ErrorCount``) and stops in one line once the share passes the limit, checked from
``MIN_ROWS`` rows on so that the first failures of a run do not stop it by chance.
"""

from __future__ import annotations

from dataclasses import dataclass

from molrl.errors import MolrlError

MIN_ROWS = 32
"""Graded rows a run counts before the error rate is checked."""


def check_error_rate(errors: int, total: int, limit: float, where: str) -> None:
    """Raise ``MolrlError`` when ``errors`` of ``total`` graded rows were sandbox errors, a share past ``limit``,
    once ``total`` reaches ``MIN_ROWS``; ``where`` names the run in the line (``rl``, ``eval``, ``collect``)."""
    if total < MIN_ROWS or errors / total <= limit:
        return
    raise MolrlError(f"{where}: {errors} of {total} graded rows ({errors / total:.1%}) were sandbox errors, past "
                     f"sandbox.max_error_rate={limit:g}; check the sandbox (the servers' `molrl sandbox serve` logs, "
                     "or the workers' lines above) or raise sandbox.max_error_rate")


@dataclass
class ErrorCount:
    """A run's running count of sandbox errors among the rows it graded, checked against the limit as it grows."""

    limit: float
    """``sandbox.max_error_rate``."""
    where: str
    """The run, as the stop line names it."""
    errors: int = 0
    """Rows so far whose execution was a sandbox error."""
    total: int = 0
    """Rows graded so far."""

    def add(self, errors: int, total: int) -> None:
        """Count a batch's ``errors`` of ``total`` rows and stop the run if the share so far is past the limit."""
        self.errors += errors
        self.total += total
        check_error_rate(self.errors, self.total, self.limit, self.where)
