"""RL post-training with sandbox-execution rewards (``molrl grpo``): GRPO, Dr.GRPO and dr_grpo_std.

``run_rl(RlConfig) -> Path`` is the stage (``molrl.rl.run``: what it reads and writes); one step
of it, rollout -> score -> advantages -> loss, reads top to bottom in ``molrl.rl.step``.
"""

from molrl.rl.config import RlConfig
from molrl.rl.run import run_rl

__all__ = ["RlConfig", "run_rl"]
