"""The agent-environment episode: a model acts on a task in turns, and feedback answers each turn.

``run_episodes`` is the loop itself (no files): collect records its episodes as traces, eval's interactive mode
grades them, rl's multi-turn rollouts take its turns one at a time (``start_episode``, ``take_turn``), and the demo
drives it with scripted policies. ``EpisodeConfig`` says how an episode runs; the feedback providers say what
follows each turn.
"""

from __future__ import annotations

import importlib
from typing import Any

from molrl.episode.actions import SYSTEM_PROMPT, Action, parse_action
from molrl.episode.config import CritiqueConfig, EpisodeConfig
from molrl.episode.feedback import FeedbackProvider, Observation, rederive_feedback, render_feedback
from molrl.episode.providers import build_providers

# The loop imports torch: it loads on first use, so that reading an EpisodeConfig (the CLI checking a config, the
# collect, RL and eval configs that hold one) stays fast.
_ON_USE = {"Episode": "molrl.episode.loop", "run_episodes": "molrl.episode.loop", "start_episode": "molrl.episode.loop"}


def __getattr__(name: str) -> Any:
    if name in _ON_USE:
        return getattr(importlib.import_module(_ON_USE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SYSTEM_PROMPT", "Action", "CritiqueConfig", "Episode", "EpisodeConfig", "FeedbackProvider", "Observation",
    "build_providers", "parse_action", "rederive_feedback", "render_feedback", "run_episodes", "start_episode",
]
