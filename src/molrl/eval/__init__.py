"""Evaluation: single-turn, feedback-independent benchmark scores (and interactive ones to compare).

``run_eval(EvalConfig)`` is ``molrl eval``; ``evaluate_single`` scores an in-memory model on a
list of tasks (the GRPO eval hook and the demo use it). Grading goes through ``molrl.graders``,
the same graders that make the RL rewards.
"""

from __future__ import annotations

import importlib
from typing import Any

from molrl.eval.config import EvalConfig
from molrl.eval.metrics import aggregate, majority_vote, pass_at_k

# The stage and the sampler import torch: they load on first use, so that reading an EvalConfig (the CLI
# checking a config) stays fast.
_ON_USE = {"run_eval": "molrl.eval.run", "evaluate_single": "molrl.eval.single", "summarise": "molrl.eval.single"}


def __getattr__(name: str) -> Any:
    if name in _ON_USE:
        return getattr(importlib.import_module(_ON_USE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["EvalConfig", "run_eval", "evaluate_single", "summarise", "pass_at_k", "majority_vote", "aggregate"]
