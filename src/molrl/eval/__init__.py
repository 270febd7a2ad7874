"""Evaluation: single-turn, feedback-independent benchmark scores (and interactive ones to compare).

``run_eval(EvalConfig)`` is ``molrl eval``; ``evaluate_single`` scores an in-memory model on a
list of tasks (the GRPO eval hook and the demo use it). Grading goes through ``molrl.graders``,
the same graders that make the RL rewards.
"""

from molrl.eval.config import EvalConfig
from molrl.eval.metrics import aggregate, majority_vote, pass_at_k
from molrl.eval.run import run_eval
from molrl.eval.single import evaluate_single, summarise

__all__ = ["EvalConfig", "run_eval", "evaluate_single", "summarise", "pass_at_k", "majority_vote", "aggregate"]
