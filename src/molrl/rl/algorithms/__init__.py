"""The RL algorithms by name: each a module with an ``Algorithm`` subclass (``molrl.rl.algorithms.base``).

Adding one is a module, an entry here and its config section (``molrl.rl.config``); the trainer
does not change.
"""

from __future__ import annotations

from molrl.rl.algorithms.base import Algorithm
from molrl.rl.algorithms.grpo import DrGrpo, DrGrpoStd, Grpo
from molrl.rl.algorithms.opd import Opd
from molrl.rl.algorithms.ppo import Ppo

ALGORITHMS: dict[str, type[Algorithm]] = {
    "grpo": Grpo,
    "dr_grpo": DrGrpo,
    "dr_grpo_std": DrGrpoStd,
    "opd": Opd,
    "ppo": Ppo,
}
"""Algorithm name (``RlConfig.algorithm``) -> its class."""

__all__ = ["ALGORITHMS", "Algorithm"]
