"""``SamplingConfig``: how completions are sampled, the settings every generator (``molrl.engines.generation``) reads.

It lives apart from the generators so that a stage's config (collection, evaluation, multi-turn RL)
can be read and checked without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from molrl.config.ranges import (MAX_COUNT, Count, Range, RolloutTemperature, SamplingTemperature, Seed, Size,
                                 TopP)


@dataclass
class SamplingConfig:
    """How completions are sampled: the ``sampling`` block of every stage that generates (collect, rl, eval), each
    with its own defaults."""

    n: Count = 1
    """Completions per prompt: eval's samples per problem (pass@1 is their mean; pass@k and maj@n need n >= k), rl's
    group size G; collect's episodes per task (each turn of an episode samples one completion)."""
    temperature: SamplingTemperature = 0.0
    """Sampling temperature; 0 means greedy decoding (then n must be 1; rl's rollouts are never greedy)."""
    top_p: TopP = 1.0
    """Nucleus sampling mass."""
    top_k: Size = 0
    """Top-k cut-off; 0 disables it."""
    max_new_tokens: Count = 512
    """Most tokens generated per completion: a collect or interactive-eval turn; a whole rl completion (every turn
    of a multi-turn one; also Dr.GRPO's constant normaliser)."""
    seed: Seed = 0
    """Base random seed: eval's chunk of problems samples with seed + its first problem's index, collect's round r
    of turns with seed + r; rl's sampling is seeded by train.seed (this one must stay 0)."""
    stop: list[str] = field(default_factory=list)
    """Strings that end a completion early (kept in the output); collect's and multi-turn turns always also stop
    at </execute> and </solution>."""


@dataclass
class RolloutSampling(SamplingConfig):
    """The rl stage's ``sampling``: a group of G >= 2 completions per prompt, never greedy, seeded by train.seed."""

    n: Annotated[int, Range(2, MAX_COUNT)] = 8
    """Group size G: completions per prompt, at least 2 (a group's rewards are compared with each other)."""
    temperature: RolloutTemperature = 0.9
    """Sampling temperature, 0.01 or more: rollouts are never greedy (the loss's log-probs are taken at it)."""
    max_new_tokens: Count = 1024
    """Most tokens per completion, every turn and feedback of a multi-turn one included (also Dr.GRPO's constant
    normaliser)."""
    seed: Annotated[int, Range(0, 0)] = 0
    """Unused by rl, whose sampling is seeded by train.seed: 0 only."""
    stop: list[str] = field(default_factory=list)
    """Strings that end a turn of a multi-turn rollout early (episode.max_turns > 1 only; </execute> and </solution>
    always do); a single-turn completion ends at its end of sequence or max_new_tokens."""


@dataclass
class HookSampling(SamplingConfig):
    """rl's ``eval.sampling``: the evaluation hook answers each held-out task once, greedily."""

    n: Annotated[int, Range(1, 1)] = 1
    """One answer a task: the hook scores single-step accuracy."""
    temperature: Annotated[float, Range(0, 0)] = 0.0
    """Greedy decoding (0 only), so the hook's figures move only with the policy."""
    top_p: Annotated[float, Range(1, 1)] = 1.0
    """Unused by greedy decoding: 1 only."""
    top_k: Annotated[int, Range(0, 0)] = 0
    """Unused by greedy decoding: 0 only."""
    seed: Annotated[int, Range(0, 0)] = 0
    """Unused by greedy decoding: 0 only."""
