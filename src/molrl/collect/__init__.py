"""Trace collection: run a model as an agent on tasks and record multi-turn feedback traces.

``run_collect`` runs the episode loop (``molrl.episode.run_episodes``) over a task file for ``molrl collect``, with
persistence, resumption and a progress bar.
"""

from __future__ import annotations

import importlib
from typing import Any

from molrl.collect.config import CollectConfig

# The stage imports torch: it loads on first use, so that reading a CollectConfig (the CLI checking a config) stays
# fast.
_ON_USE = {"run_collect": "molrl.collect.run"}


def __getattr__(name: str) -> Any:
    if name in _ON_USE:
        return getattr(importlib.import_module(_ON_USE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CollectConfig", "run_collect"]
