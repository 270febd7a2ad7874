"""Trace collection: run a model as an agent on tasks and record multi-turn feedback traces.

``run_episodes`` is the loop itself (no files; evaluation's interactive mode uses it);
``run_collect`` adds persistence, resumption and a progress bar for ``molrl collect``.
"""

from molrl.collect.actions import SYSTEM_PROMPT, Action, parse_action
from molrl.collect.config import CollectConfig, CritiqueConfig, EpisodeConfig
from molrl.collect.feedback import FeedbackProvider, Observation, rederive_feedback, render_feedback
from molrl.collect.providers import build_providers
from molrl.collect.loop import Episode, run_episodes, start_episode
from molrl.collect.run import run_collect

__all__ = [
    "SYSTEM_PROMPT", "Action", "CollectConfig", "CritiqueConfig", "Episode", "EpisodeConfig", "FeedbackProvider",
    "Observation", "build_providers", "parse_action", "rederive_feedback", "render_feedback", "run_collect", "run_episodes", "start_episode",
]
