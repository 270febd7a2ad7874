"""Graders shared by evaluation and RL rewards: one judgement per task kind.

``Grade`` is the result type; ``molrl.graders.code`` scores code through the sandbox and
``molrl.graders.math`` scores final answers with math-verify.
"""

from molrl.graders.grade import Grade

__all__ = ["Grade"]
