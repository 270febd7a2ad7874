"""GRPO / Dr.GRPO post-training with sandbox-execution rewards, on TRL's ``GRPOTrainer``.

``run_grpo(GrpoConfig) -> Path`` is the stage; see ``molrl.grpo.run`` for what it writes and
``molrl.grpo.algorithms`` for the objectives.
"""

from molrl.grpo.config import GrpoConfig
from molrl.grpo.run import run_grpo

__all__ = ["GrpoConfig", "run_grpo"]
