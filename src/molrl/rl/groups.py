"""A group's statistics over its verdict rows: what every group-relative advantage and reward metric is formed from.

Rows ``g*G .. g*G+G-1`` share prompt g. A row whose reward is no verdict on its completion (its grading failed:
``molrl.rl.score.Scores.verdicts``) is left out of its group's mean and standard deviation and gets advantage 0; a
group left with fewer than two verdict rows carries no signal, so every advantage of it is 0. With every row a
verdict these are the plain group mean, the sample standard deviation and GRPO's advantages.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class GroupStats:
    """Each row's group, over the group's verdict rows."""

    mean: torch.Tensor
    """[N] mean reward (0 where the group has no verdict row)."""
    std: torch.Tensor
    """[N] sample standard deviation of the rewards (0 where the group has fewer than two verdict rows)."""
    count: torch.Tensor
    """[N] verdict rows in the group."""

    def signal(self) -> torch.Tensor:
        """[N] bool: the group has two verdict rows or more, so a reward relative to it means something."""
        return self.count >= 2


def group_stats(rewards: torch.Tensor, verdicts: torch.Tensor, group_size: int) -> GroupStats:
    """Per row, its group's mean, sample std and count over the verdict rows; ``rewards`` [N] float, ``verdicts``
    [N] bool (a failed row's reward is never read)."""
    kept = verdicts.view(-1, group_size).to(rewards.dtype)  # [N / G, G]
    grouped = torch.where(kept.bool(), rewards.view(-1, group_size), torch.zeros_like(kept))  # [N / G, G]
    count = kept.sum(dim=1)  # [N / G]
    mean = grouped.sum(dim=1) / count.clamp(min=1.0)
    squares = ((grouped - mean[:, None]) ** 2 * kept).sum(dim=1)
    std = torch.where(count >= 2, (squares / (count - 1).clamp(min=1.0)).sqrt(), torch.zeros_like(mean))
    return GroupStats(*(x.repeat_interleave(group_size) for x in (mean, std, count)))


def group_advantages(rewards: torch.Tensor, verdicts: torch.Tensor, group_size: int, scale: bool) -> torch.Tensor:
    """[N] each row's reward relative to its group's verdict rows: ``R_i - mean``, divided by ``std + 1e-4`` when
    ``scale``; 0 for a failed row and for every row of a group with fewer than two verdict rows."""
    stats = group_stats(rewards, verdicts, group_size)
    centred = rewards - stats.mean
    if scale:
        centred = centred / (stats.std + 1e-4)
    return torch.where(verdicts & stats.signal(), centred, torch.zeros_like(centred))


def zero_std_fraction(rewards: torch.Tensor, verdicts: torch.Tensor, group_size: int) -> float:
    """Fraction of groups that carry no learning signal: their verdict rows' rewards are all equal, or they have fewer
    than two verdict rows."""
    stats = group_stats(rewards, verdicts, group_size)
    flat = ~stats.signal() | torch.isclose(stats.std, torch.zeros_like(stats.std))  # [N], alike within a group
    return flat.view(-1, group_size)[:, 0].float().mean().item()
