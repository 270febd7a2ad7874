"""Graders shared by evaluation and RL rewards: one judgement per task kind.

``Grade`` is the result type; ``molrl.graders.code`` scores code through the sandbox and
``molrl.graders.math`` scores final answers with math-verify. Their main functions are also
reachable from here (imported on first use, so ``import molrl.graders`` stays light).
"""

from molrl.graders.grade import Grade

_CODE = ("CodeRewardConfig", "extract_code", "grade_code", "program_for")
_MATH = ("extract_answer", "grade_math", "grade_math_batch")

__all__ = ["Grade", *_CODE, *_MATH]


def __getattr__(name: str):
    if name in _CODE:
        from molrl.graders import code

        return getattr(code, name)
    if name in _MATH:
        from molrl.graders import math

        return getattr(math, name)
    raise AttributeError(f"module 'molrl.graders' has no attribute {name!r}")
