"""The collection format the demo's scripted episodes follow: the collect section's episode settings with the
sampling its turns take and its thinking, so that the base's tool-use demonstrations are exactly what collection
will produce."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Sequence

from molrl.episode.config import EpisodeConfig, EpisodeLimits
from molrl.engines.sampling import SamplingConfig


@dataclass
class CollectionFormat(EpisodeConfig):
    """An ``EpisodeConfig`` with the collect stage's sampling and thinking: everything the episode loop runs an
    episode by."""

    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """The collect stage's ``sampling`` (a scripted policy ignores it; it is part of the format's key)."""
    thinking: bool = False
    """The collect stage's ``thinking``: the conversations are rendered with the template's thinking on or off."""

    @classmethod
    def of(cls, collect: Any) -> "CollectionFormat":
        """The format of a resolved ``CollectConfig``."""
        return cls(**_episode_fields(collect.episode), sampling=collect.sampling, thinking=collect.thinking)

    def episode(self, **changes: Any) -> EpisodeLimits:
        """The plain episode settings (eval's ``episode`` section), with ``changes``."""
        limits = {f.name for f in dataclasses.fields(EpisodeLimits)}
        return EpisodeLimits(**{**{k: v for k, v in _episode_fields(self).items() if k in limits}, **changes})

    def key(self) -> dict[str, Any]:
        """The format as plain data, under the names a demo base's ``DONE`` marker has kept it by since the
        sampling, seed and thinking moved out of the episode settings and the task templates were named
        ``code_task`` / ``math_task`` (a base made before is still reused)."""
        plain = dataclasses.asdict(self)
        plain["enable_thinking"] = plain.pop("thinking")
        plain["code_task"], plain["math_task"] = plain.pop("code_prompt"), plain.pop("math_prompt")
        return {**plain, "seed": self.sampling.seed}


def _episode_fields(episode: EpisodeConfig) -> dict[str, Any]:
    """The ``EpisodeConfig`` fields of ``episode``, by name (values as they are, not copied)."""
    return {f.name: getattr(episode, f.name) for f in dataclasses.fields(EpisodeConfig)}


def run_format(generator: Any, tokenizer: Any, tasks: Sequence[Any], pool: Any, fmt: CollectionFormat) -> list[Any]:
    """``fmt``'s episodes of ``generator`` on ``tasks`` through the real episode loop (``run_episodes``)."""
    from molrl.episode.loop import run_episodes

    return run_episodes(generator, tokenizer, tasks, pool, fmt, fmt.sampling, thinking=fmt.thinking)
