"""The rollout policies by name: each a module with a ``Synchronous`` subclass (``molrl.rl.rollouts.sync``).

Adding one is a module, an entry here and its config fields (``molrl.rl.config.RolloutSettings``);
the trainer does not change.
"""

from __future__ import annotations

from molrl.rl.rollouts.overlap import OneStepOff
from molrl.rl.rollouts.partial import Partial
from molrl.rl.rollouts.props import Props
from molrl.rl.rollouts.sync import Synchronous
from molrl.rl.rollouts.turns import Turns

ROLLOUTS: dict[str, type[Synchronous]] = {
    "sync": Synchronous,
    "partial": Partial,
    "props": Props,
    "turns": Turns,
    "overlap": OneStepOff,
}
"""Rollout policy name (``RolloutSettings.policy()``) -> its class."""

__all__ = ["ROLLOUTS", "Synchronous"]
