"""Active partial rollouts (APRIL, arXiv 2509.18521): no step waits for the longest completion.

A step starts ``ceil(over_provision * k)`` groups of G completions, where k groups are what the
step trains on, and stops generating as soon as k whole groups have finished. The unfinished
groups stay in a buffer with their tokens so far and the behaviour log-probs of every generated
token; the next step resumes them first (prompt + partial completion, with the remaining token
budget) before it starts new prompts. No completion is thrown away: every completion started is
trained on exactly once, or is still in the buffer (which checkpoints save, so a killed run
resumes with it).

A resumed completion holds tokens sampled by an older policy. Two treatments, as the peers have:
``importance``: weight each such token's loss by min(pi_old / pi_behaviour, cap), pi_old being the
policy at the start of the step (truncated importance sampling, like TRL's vLLM correction);
``mask``: leave such tokens out of the loss (slime's ``--mask-offpolicy-in-partial-rollout``).

This module holds the buffer's types, its checkpoint form and the pure functions of the rule; the
generation itself is the partial rollout policy (``molrl.rl.rollouts.partial``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import torch
from transformers import StoppingCriteria

from molrl.rl.loss import truncated_importance_weights


@dataclass
class PartialCompletion:
    """One completion of a group, finished or not."""

    id: str
    """``<group>/<row>``: unique over a run (groups are numbered in the order they start)."""
    tokens: list[int] = field(default_factory=list)
    """Completion tokens generated so far."""
    behaviour_logps: list[float] = field(default_factory=list)
    """Log-prob of each token under the policy that sampled it (recorded right after its step)."""
    steps: list[int] = field(default_factory=list)
    """The optimiser step whose policy sampled each token."""
    finished: bool = False
    """Ended by EOS or by the token budget."""


@dataclass
class PartialGroup:
    """G completions of one prompt; trained together once all have finished."""

    group: int
    """The group's number: the order in which groups started."""
    row: dict[str, Any]
    """Its dataset row (``prompt``, ``task_json``)."""
    prompt_ids: list[int]
    """The prompt's token ids."""
    completions: list[PartialCompletion]
    """Its G completions."""
    started_step: int
    """The step that started it."""

    @property
    def done(self) -> bool:
        return all(c.finished for c in self.completions)


@dataclass
class RolloutState:
    """What partial rollouts carry from one step to the next (saved in every checkpoint)."""

    buffer: list[PartialGroup] = field(default_factory=list)
    """Started groups not trained yet, oldest first."""
    pending: list[dict[str, Any]] = field(default_factory=list)
    """Dataset rows handed to a step but not started yet, oldest first."""
    started_groups: int = 0
    """Groups started so far (the next group's number)."""
    extra_draws: int = 0
    """Prompts drawn beyond the data loader's to over-provision (the next draw's index)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "RolloutState":
        groups = [PartialGroup(**{**g, "completions": [PartialCompletion(**c) for c in g["completions"]]})
                  for g in data.get("buffer", [])]
        return cls(buffer=groups, pending=list(data.get("pending", [])), started_groups=int(data.get("started_groups", 0)),
                   extra_draws=int(data.get("extra_draws", 0)))


def groups_to_start(buffered: int, needed: int, over_provision: float) -> int:
    """New groups a step starts: enough that ``ceil(over_provision * needed)`` groups are in flight
    (never fewer than ``needed``), counting the ``buffered`` ones it resumes."""
    in_flight = max(needed, math.ceil(over_provision * needed - 1e-9))
    return max(0, in_flight - buffered)


def choose_trained(finish_order: Sequence[int], needed: int) -> list[int]:
    """The groups (indices into the step's in-flight list) a step trains on: the first ``needed`` to finish.

    ``finish_order`` lists finished groups in the order they finished; groups that finished at the
    same decoding step appear in in-flight order (resumed, thus older, groups first).
    """
    if len(finish_order) < needed:
        raise ValueError(f"only {len(finish_order)} groups finished; the step needs {needed}")
    return list(finish_order[:needed])


def off_policy_mask(token_steps: torch.Tensor, step: int, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: loss tokens sampled by the policy of an earlier step than ``step``."""
    return (token_steps < step) & mask.bool()


def importance_weights(policy_logps: torch.Tensor, behaviour_logps: torch.Tensor, off_policy: torch.Tensor,
                       cap: float) -> torch.Tensor:
    """[B, T] loss weights: ``min(pi_policy / pi_behaviour, cap)`` on off-policy tokens, 1 elsewhere.

    ``policy_logps`` are the step's starting policy's log-probs of the tokens, ``behaviour_logps`` those
    recorded when the tokens were sampled.
    """
    ratio = truncated_importance_weights(policy_logps, behaviour_logps, cap)  # [B, T]
    return torch.where(off_policy, ratio, torch.ones_like(ratio))


def accounting(started_groups: int, group_size: int, trained_ids: Sequence[str], buffered_ids: Sequence[str]) -> dict[str, Any]:
    """Check that every started completion is trained exactly once or is still buffered.

    Returns counts and the ids that break the rule: ``duplicates`` (trained twice, or trained and
    buffered), ``lost`` (started, neither trained nor buffered) and ``unknown`` (never started).
    """
    started = {f"{g}/{r}" for g in range(started_groups) for r in range(group_size)}
    seen: dict[str, int] = {}
    for i in [*trained_ids, *buffered_ids]:
        seen[i] = seen.get(i, 0) + 1
    return {"started": len(started), "trained": len(trained_ids), "buffered": len(buffered_ids),
            "duplicates": sorted(i for i, n in seen.items() if n > 1),
            "lost": sorted(started - set(seen)), "unknown": sorted(set(seen) - started)}


class GroupTracker:
    """Which groups of a partial-rollout step have finished, in order, as their rows finish.

    ``groups[i]`` is row i's group; ``sizes[g]`` group g's size; ``finished_before[g]`` its completions that
    finished in an earlier step (not among the rows); ``already_done`` the groups done before generation.
    """

    def __init__(self, groups: Sequence[int], sizes: Sequence[int], finished_before: Sequence[int], needed: int,
                 already_done: Sequence[int] = ()):
        self.groups, self.needed = list(groups), needed
        self.remaining = [size - before for size, before in zip(sizes, finished_before)]
        self.finish_order = list(already_done)
        self.done = [False] * len(groups)

    def finish(self, rows: Sequence[int]) -> None:
        """Rows that finished at the same moment (their groups join ``finish_order`` in group order)."""
        newly = []
        for i in rows:
            if self.done[i]:
                continue
            self.done[i] = True
            g = self.groups[i]
            self.remaining[g] -= 1
            if self.remaining[g] == 0:
                newly.append(g)
        self.finish_order.extend(sorted(newly))

    @property
    def enough(self) -> bool:
        return len(self.finish_order) >= self.needed


class StopWhenGroupsDone(StoppingCriteria):
    """A transformers ``StoppingCriteria``: a row stops at EOS or at its own token budget; the whole
    batch stops once ``needed`` groups have all their completions finished (``GroupTracker``).

    After generation, ``lengths[i]`` is the number of tokens row i generated, ``done[i]`` whether it
    finished, and ``finish_order`` lists the groups in the order they finished.
    """

    def __init__(self, groups: Sequence[int], budgets: Sequence[int], eos_ids: Sequence[int], prompt_length: int,
                 sizes: Sequence[int], finished_before: Sequence[int], needed: int, already_done: Sequence[int] = ()):
        self.tracker = GroupTracker(groups, sizes, finished_before, needed, already_done)
        self.budgets, self.eos, self.prompt_length = list(budgets), set(eos_ids), prompt_length
        self.lengths = [0] * len(self.budgets)

    @property
    def done(self) -> list[bool]:
        return self.tracker.done

    @property
    def finish_order(self) -> list[int]:
        return self.tracker.finish_order

    def __call__(self, input_ids: torch.LongTensor, scores: Any = None, **kwargs: Any) -> torch.BoolTensor:
        generated = input_ids.size(1) - self.prompt_length
        last = input_ids[:, -1].tolist()
        ending = []
        for i, token in enumerate(last):
            if self.tracker.done[i]:
                continue
            self.lengths[i] = generated
            if token in self.eos or generated >= self.budgets[i]:
                ending.append(i)
        self.tracker.finish(ending)
        if self.tracker.enough:
            return torch.ones(len(last), dtype=torch.bool, device=input_ids.device)
        return torch.tensor(self.tracker.done, dtype=torch.bool, device=input_ids.device)
