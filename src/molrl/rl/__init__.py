"""RL post-training with sandbox-execution rewards (``molrl rl``).

Five algorithms (``molrl.rl.algorithms``: grpo, dr_grpo, dr_grpo_std, opd, ppo over macro actions) and
four rollout policies (``molrl.rl.rollouts``: synchronous, partial rollouts, PROPS, multi-turn episodes), each a
module behind a registry; rollouts generate with transformers or on the policy engine (``molrl.rl.engine``).
``run_rl(RlConfig) -> Path`` is the stage (``molrl.rl.run``: what it reads and writes); one step of it,
rollout -> score -> advantages -> loss, reads top to bottom in ``molrl.rl.trainer``.
"""

from molrl.rl.config import RlConfig
from molrl.rl.run import run_rl

__all__ = ["RlConfig", "run_rl"]
