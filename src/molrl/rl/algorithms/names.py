"""The RL algorithms' names, each written once, here: the module and class that run it and what it does.

Torch-free, so the config (``RlConfig.algorithm``'s allowed values), ``--describe`` and the docs' check read the names
from here without loading an algorithm; ``molrl.rl.algorithms.ALGORITHMS`` resolves a name to its class when a run
asks for it. Adding an algorithm is its module (an ``Algorithm`` subclass), a line here and its config section.
"""

from __future__ import annotations

from typing import Literal, NamedTuple


class Entry(NamedTuple):
    """One algorithm: where its class is and what it does."""

    module: str
    """Its module under ``molrl.rl.algorithms``."""
    cls: str
    """Its ``Algorithm`` subclass."""
    does: str
    """What it does, in a phrase (``--describe``, docs)."""
    from_rewards: bool
    """Whether its advantages come from the rewards alone, not the policy (a group-relative outcome advantage), so a
    buffered batch's stay valid (``rollout.buffer_batches``)."""


ENTRIES: dict[str, Entry] = {
    "grpo": Entry("grpo", "Grpo", "std-scaled advantages, per-sequence mean", True),
    "dr_grpo": Entry("grpo", "DrGrpo", "no std, token sum / constant", True),
    "dr_grpo_std": Entry("grpo", "DrGrpoStd", "std-scaled advantages, token sum / constant", True),
    "opd": Entry("opd", "Opd", "on-policy distillation from a teacher (opd.*), token mean", False),
    "ppo": Entry("ppo", "Ppo", "a learned critic, GAE over macro actions (ppo.*, macro.*)", False),
}
"""Algorithm name (``RlConfig.algorithm``) -> its entry."""

AlgorithmName = Literal[tuple(ENTRIES)]  # type: ignore[valid-type]
"""The allowed values of ``RlConfig.algorithm``, from ``ENTRIES``."""


def from_rewards() -> tuple[str, ...]:
    """The algorithms whose advantages come from the rewards alone."""
    return tuple(name for name, entry in ENTRIES.items() if entry.from_rewards)

