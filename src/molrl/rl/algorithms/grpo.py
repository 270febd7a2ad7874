"""Group-relative advantages: GRPO, Dr.GRPO and the MoL-RL authors' dr_grpo_std.

=============  ==========================================  =========================================
algorithm      advantage of completion i in its group      aggregation of token losses
=============  ==========================================  =========================================
grpo           (R_i - mean_j R_j) / (std_j R_j + 1e-4)     per completion mean, then mean over B
dr_grpo        R_i - mean_j R_j                            sum over tokens and B / (B * T_max)
dr_grpo_std    (R_i - mean_j R_j) / (std_j R_j + 1e-4)     sum over tokens and B / (B * T_max)
=============  ==========================================  =========================================

``std`` is the sample standard deviation over the G completions of a prompt and ``T_max`` is
``max_completion_length`` (Dr.GRPO paper, arXiv 2503.20783; MoL-RL's public training code). Mean and std are over
the group's verdict rows: a row whose grading failed has advantage 0 (``molrl.rl.groups``).
"""

from __future__ import annotations

from typing import Callable, ClassVar

import torch

from molrl.rl.algorithms.base import Algorithm
from molrl.rl.batch import AdvantageInputs
from molrl.rl.groups import group_advantages


def grpo_advantages(rewards: torch.Tensor, verdicts: torch.Tensor, mask: torch.Tensor, group_size: int) -> torch.Tensor:
    """GRPO: ``(R_i - mean) / (std + 1e-4)`` over the group's verdict rows, on every token of completion i: [N, T]
    (``molrl.rl.groups.group_advantages``: 0 for a failed row and a group of fewer than two verdict rows)."""
    return group_advantages(rewards, verdicts, group_size, scale=True).unsqueeze(1) * mask


def dr_grpo_advantages(rewards: torch.Tensor, verdicts: torch.Tensor, mask: torch.Tensor, group_size: int) -> torch.Tensor:
    """Dr.GRPO: ``R_i - mean`` over the group's verdict rows (no std division), on every token of completion i: [N, T]."""
    return group_advantages(rewards, verdicts, group_size, scale=False).unsqueeze(1) * mask


def local_rows(advantages: torch.Tensor, inputs: AdvantageInputs) -> torch.Tensor:
    """[B, T] the local rows of gathered [N, T'] advantages, cut to the local completion width."""
    return advantages[inputs.rows, : inputs.batch.completion_ids.size(1)]


class GroupRelative(Algorithm):
    """A completion's outcome advantage, relative to its group, on each of its tokens."""

    advantage_fn: ClassVar[Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]]
    """rewards [N], verdicts [N] bool, mask [N, T], group size G -> advantages [N, T]."""

    def token_advantages(self, inputs, ma_ids):
        advantages = type(self).advantage_fn(inputs.rewards, inputs.verdicts, inputs.masks, inputs.group)
        return local_rows(advantages, inputs), {}

    def completion_advantages(self, inputs, tokens):
        # the row's advantage, also for a row whose tokens are all masked out of the loss (truncated)
        whole = torch.ones_like(inputs.rewards)[:, None]
        return type(self).advantage_fn(inputs.rewards, inputs.verdicts, whole, inputs.group)[:, 0]


class Grpo(GroupRelative):
    """GRPO: std-scaled advantages, per-sequence mean."""

    aggregation = "sequence_mean"
    advantage_fn = staticmethod(grpo_advantages)


class DrGrpo(GroupRelative):
    """Dr.GRPO: no std division, token sum over a constant."""

    aggregation = "constant"
    advantage_fn = staticmethod(dr_grpo_advantages)


class DrGrpoStd(GroupRelative):
    """The MoL-RL authors' code: std-scaled advantages with Dr.GRPO's aggregation."""

    aggregation = "constant"
    advantage_fn = staticmethod(grpo_advantages)
