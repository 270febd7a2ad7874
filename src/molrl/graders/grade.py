"""The result of grading one completion."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Grade:
    """A score with the reasons behind it."""

    score: float
    """The reward (staged or binary for code, 0/1 for math)."""
    correct: bool
    """True when the completion fully solves the task (all tests pass / answer equivalent)."""
    stage: str
    """Where grading stopped: no_code, compile_error, runtime_error, partial, all_pass, sandbox_error,
    grader_error (code); no_answer, wrong, correct, grader_error (math)."""
    extracted: str | None = None
    """The code or final answer taken from the completion."""
    details: dict[str, Any] = field(default_factory=dict)
    """What the judgement rests on: normalised forms, per-test outcomes, errors."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form for logs and eval records."""
        return asdict(self)
