"""``SamplingConfig``: how completions are sampled, the settings every generator (``molrl.generation``) reads.

It lives apart from the generators so that a stage's config (collection, evaluation, multi-turn RL)
can be read and checked without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from molrl.config_ranges import Count, SamplingTemperature, Seed, Size, TopP


@dataclass
class SamplingConfig:
    """How completions are sampled."""

    n: Count = 1
    """Completions per prompt."""
    temperature: SamplingTemperature = 0.0
    """Sampling temperature; 0 means greedy decoding."""
    top_p: TopP = 1.0
    """Nucleus sampling mass."""
    top_k: Size = 0
    """Top-k cut-off; 0 disables it."""
    max_new_tokens: Count = 512
    """Most tokens generated per completion."""
    seed: Seed = 0
    """Random seed set before each generate call, for reproducible samples."""
    stop: list[str] = field(default_factory=list)
    """Strings that end a completion early (kept in the output)."""
