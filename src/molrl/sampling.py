"""``SamplingConfig``: how completions are sampled, the settings every generator (``molrl.generation``) reads.

It lives apart from the generators so that a stage's config (collection, evaluation, multi-turn RL)
can be read and checked without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from molrl.config_ranges import Count, SamplingTemperature, Seed, Size, TopP


@dataclass
class SamplingConfig:
    """How completions are sampled: the ``sampling`` block of every stage that generates (collect, rl, eval), each
    with its own defaults."""

    n: Count = 1
    """Completions per prompt: eval's samples per problem (pass@1 is their mean; pass@k and maj@n need n >= k), rl's
    group size G; collect's must be 1 (its ``samples`` per task are separate episodes)."""
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
