"""Where a pipeline's run directory keeps each stage's runs (``molrl pipeline``, ``molrl demo``).

RL runs live under ``rl/``; a run directory made before that name kept them under ``grpo/``, and it goes on
resuming there: ``rl_runs`` answers the folder a run directory has, so that old runs are found, not trained again.
"""

from __future__ import annotations

from pathlib import Path

RL_DIR = "rl"
"""The folder of the RL runs in a pipeline's output."""
OLD_RL_DIR = "grpo"
"""Its name in run directories made before the stage was called rl."""


def rl_runs(run_dir: str | Path) -> Path:
    """The folder of ``run_dir``'s RL runs: ``grpo/`` where an older run made it (and no ``rl/`` exists), else
    ``rl/``."""
    old, new = Path(run_dir) / OLD_RL_DIR, Path(run_dir) / RL_DIR
    return old if old.is_dir() and not new.exists() else new
