"""Tasks: code problems with tests and math problems with answers.

One record type serves trace collection, GRPO prompts and evaluation. Code tests come in three
forms, all graded outside the sandbox that ran the code (see ``molrl.graders``):
``call`` (call ``entry_point(*args)``; the return value comes back and is compared here),
``stdio`` (feed stdin, compare the whole normalised stdout) and ``assert`` (a test program that a
separate judge process runs when a test cannot be put into one of the other two forms).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass
class TestCase:
    """One test of a code task."""

    kind: Literal["call", "stdio", "assert"]
    """How the test is run and judged."""
    args: list[Any] = field(default_factory=list)
    """call: positional arguments passed to the entry point."""
    expected: Any = None
    """call: the expected return value (compared outside the sandbox)."""
    stdin: str = ""
    """stdio: text fed on standard input."""
    stdout: str = ""
    """stdio: the expected standard output."""
    source: str = ""
    """assert: the test program (an assert statement or a check function call)."""

    __test__ = False  # not a pytest test class


@dataclass
class Task:
    """A problem posed to the model: code with tests, or math with a final answer."""

    id: str
    """The benchmark's own id (task_id for HumanEval/MBPP, unique_id for MATH-500, id for AIME)."""
    prompt: str
    """The problem statement as the user message shows it."""
    kind: Literal["code", "math"]
    """Which grader scores it."""
    answer: str | None = None
    """math: the gold final answer."""
    entry_point: str | None = None
    """code: the name of the function under test."""
    tests: list[TestCase] = field(default_factory=list)
    """code: the tests a solution must pass."""
    setup_code: str = ""
    """code: code run before the tests (MBPP's test_setup_code)."""
    reference: str | None = None
    """A known-correct solution (canonical solution, gold answer text), when the source has one."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Everything else from the source record (subject, level, ...), kept for breakdowns."""
