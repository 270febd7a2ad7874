"""Trace collection: run a model as an agent on tasks and record multi-turn feedback traces.

``run_episodes`` is the loop itself (no files; evaluation's interactive mode uses it);
``run_collect`` adds persistence, resumption and a progress bar for ``molrl collect``.
"""

from __future__ import annotations

import importlib
from typing import Any

from molrl.collect.actions import SYSTEM_PROMPT, Action, parse_action
from molrl.collect.config import CollectConfig, CritiqueConfig, EpisodeConfig
from molrl.collect.feedback import FeedbackProvider, Observation, rederive_feedback, render_feedback
from molrl.collect.providers import build_providers

# The loop and the stage import torch: they load on first use, so that reading a CollectConfig (the CLI
# checking a config, the RL and eval configs that hold an EpisodeConfig) stays fast.
_ON_USE = {"Episode": "molrl.collect.loop", "run_episodes": "molrl.collect.loop",
           "start_episode": "molrl.collect.loop", "run_collect": "molrl.collect.run"}


def __getattr__(name: str) -> Any:
    if name in _ON_USE:
        return getattr(importlib.import_module(_ON_USE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SYSTEM_PROMPT", "Action", "CollectConfig", "CritiqueConfig", "Episode", "EpisodeConfig", "FeedbackProvider",
    "Observation", "build_providers", "parse_action", "rederive_feedback", "render_feedback", "run_collect", "run_episodes", "start_episode",
]
