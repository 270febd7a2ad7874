"""The task record: code problems with tests, math problems with answers, and the toy task.

One record type serves trace collection, RL prompts and evaluation. Code tests come in three
forms, all graded outside the sandbox that ran the code (see ``molrl.graders``):
``call`` (call ``entry_point(*args)``; the return value comes back and is compared here),
``stdio`` (feed stdin, compare the whole normalised stdout) and ``assert`` (a test program that a
separate judge process runs when a test cannot be put into one of the other two forms).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

POSED = ("prompt", "kind", "answer", "entry_point", "tests", "setup_code", "preamble", "probe")
"""The fields of a ``Task`` that make it the problem it is: what the model is shown, what it is judged by, and what
its environment runs. Its id, reference solution, meta and split only name or describe it (``Task.content_key``)."""


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
    args_source: str = ""
    """call: a tuple expression for the arguments, evaluated in the solution's namespace after
    setup_code, for inputs built from the solution's own classes (MBPP 367, 927); args is then unused."""

    __test__ = False  # not a pytest test class


@dataclass
class Task:
    """A problem posed to the model: code with tests, or math with a final answer."""

    id: str
    """The benchmark's own id (task_id for HumanEval/MBPP, unique_id for MATH-500, id for AIME)."""
    prompt: str
    """The problem statement as the user message shows it."""
    kind: Literal["code", "math", "toy"]
    """Which grader scores it (``molrl.tasks.grade``); toy is the RL smoke task of ``molrl.tasks.toy``."""
    answer: str | None = None
    """math: the gold final answer."""
    entry_point: str | None = None
    """code: the name of the function under test."""
    tests: list[TestCase] = field(default_factory=list)
    """code: the tests a solution must pass."""
    setup_code: str = ""
    """code: code run after the solution, before the tests (MBPP's test_setup_code)."""
    preamble: str = ""
    """code: code put before the solution (HumanEval: the prompt's imports and helper functions)."""
    reference: str | None = None
    """A known-correct solution (canonical solution, gold answer text), when the source has one."""
    probe: str = ""
    """Code the environment runs (after the preamble, in the sandbox) to show what the task asks, e.g.
    ``print(f(478))``: its output is the feedback on an answer that runs no code (on-policy distillation's
    feedback teacher reads it). Never shown to the model being trained."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Everything else from the source record (subject, level, ...), kept for breakdowns."""
    split: str | None = None
    """The benchmark split it belongs to: train, validation, test or prompt (``molrl.tasks.splits``); None: its
    file has no split."""

    def to_json(self) -> str:
        """The task as one JSON string, test values tagged with their exact types (a dataset column)."""
        from molrl.sandbox.runtime.codec import encode

        data = asdict(self)
        data["tests"] = [
            dict(asdict(t), args=encode(list(t.args)), expected=encode(t.expected)) for t in self.tests
        ]
        return json.dumps(data, default=str)

    def content_key(self) -> str:
        """A 16-hex-digit key of the problem itself (its ``POSED`` fields), apart from its id: one id with other
        contents (the same task id in two seeds' worlds, with another library or rule) gives two keys."""
        data = json.loads(self.to_json())
        posed = json.dumps({k: data[k] for k in POSED}, sort_keys=True)
        return hashlib.sha256(posed.encode("utf-8")).hexdigest()[:16]

    @classmethod
    def from_json(cls, text: str) -> Task:
        """The task ``to_json`` wrote."""
        from molrl.sandbox.runtime.codec import decode

        data = json.loads(text)
        tests = [
            TestCase(**dict(t, args=list(decode(t["args"])), expected=decode(t["expected"])))
            for t in data.pop("tests", [])
        ]
        return cls(**data, tests=tests)


@dataclass
class JsonlSpec:
    """How to read tasks from a user's JSONL file (one task per line)."""

    kind: Literal["code", "math"] = "math"
    """Which grader scores the tasks."""
    id_field: str = "id"
    """Field holding the task id (the line number is used when absent)."""
    prompt_field: str = "prompt"
    """Field holding the problem statement."""
    answer_field: str = "answer"
    """math: field holding the gold final answer."""
    tests_field: str = "tests"
    """code: field holding the tests: assert strings, or objects with TestCase fields."""
    entry_point_field: str = "entry_point"
    """code: field holding the function name under test (needed for call/assert tests)."""
    setup_field: str = "setup_code"
    """code: optional field with code run after the solution, before the tests."""
    preamble_field: str = "preamble"
    """Optional field with code the sandbox runs before the model's code (never shown to the model)."""
    probe_field: str = "probe"
    """Optional field with the environment's probe code (see ``Task.probe``; never shown to the model)."""

