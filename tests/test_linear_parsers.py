"""Every parser of task and trace text costs linear time: four times the input takes at most about four times as long.

The parsers are enumerated here, each with the input shape that made one of them quadratic or that stresses what it
scans: problem text (``problem_parts``, the task index), task files (HumanEval's check function, a task's tests), the
importers (MINT, OpenAI-style, ToRA), the action reader and code extraction used on trace turns, the lint, the
tokeniser that labels a trace's tokens, and ``traces stats``. Each input is timed at size n and 4n in this process,
interleaved, the least of a few repeats of each, in processor time with the garbage collector paused, so a loaded
machine slows both alike; a linear parser's ratio is about 4, a quadratic one's about 16, and the bar is their
geometric middle, 8. (At 2n the two are 2 and 4, too close: beside three CPU-bound processes a linear parser once
measured 3.02 against a bar of 3.) Inputs stay small (about 200 KB at most), each parsed several times in a row when
one parse is quick, so that both sizes sit in the processor's caches beside another process's work: a larger input
spilling out of them looks superlinear on a busy machine. On the parsers before this test, eight of these inputs took
3.4 to 7.6 times as long at 2n (one timing each, on this machine).
"""

from __future__ import annotations

import gc
import json
import math
import time
from functools import cache
from pathlib import Path
from typing import Any, Callable

import pytest

from molrl.episode.actions import parse_action
from molrl.graders.extract import extract_code
from molrl.task_types import Task, TestCase
from molrl.tasks.asserts import check_function_to_calls
from molrl.tasks.held_out import held_back_indices, split_reason
from molrl.tasks.index import BenchmarkIndex, problem_parts
from molrl.traces.importers import import_file, mint_record_to_trace, openai_record_to_trace, strip_mint_example
from molrl.traces.lint import model_feedback
from molrl.traces.schema import Trace, write_traces
from molrl.traces.tora import split_tool_text

SCALE = 4
"""The larger input is SCALE times the smaller."""
MAX_RATIO = 8.0
"""Most time at SCALE * n over time at n that passes: linear gives about 4, quadratic about 16."""
MIN_TIMING = 0.01
"""Seconds a timing at size n lasts at least: a small input is parsed as many times in a row as that takes."""
ROUNDS = (3, 12)
"""Fewest and most timings of each size: past the fewest, timing stops once the least times pass."""


@cache
def _tokenizer() -> Any:
    from molrl.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer("chatml")


def _mint_row(history: list[dict[str, str]]) -> dict[str, Any]:
    return {"task": {"task_id": 1}, "state": {"history": history, "success": False}}


def _mint_turns(n: int) -> dict[str, Any]:
    turns = [[{"role": "assistant", "content": "Assistant:\nx"}, {"role": "user", "content": "Observation:\ny"}]] * n
    return _mint_row([{"role": "user", "content": "Task:\nq"}, *(m for pair in turns for m in pair)])


def _dialogue(n: int, turn: str = "x") -> list[dict[str, str]]:
    return [{"role": "user", "content": "task"}, *[{"role": r, "content": c} for _ in range(n)
                                                   for r, c in (("assistant", turn), ("tool", "y"))]]


def _code_task(n: int) -> Task:
    return Task(id="t", prompt="p", kind="code", entry_point="f", tests=[TestCase("call", args=[i], expected=i)
                                                                       for i in range(n)])


def _trace_file(n: int, folder: Path) -> Path:
    path = folder / f"traces_{n}.jsonl"
    write_traces(path, [Trace(_dialogue(2), {"success": True}) for _ in range(n)])
    return path


def _mint_file(n: int, folder: Path) -> Path:
    path = folder / f"mint_{n}.jsonl"
    rows = [_mint_row([{"role": "user", "content": f"Task:\nWrite f.\nassert f({i}) == {i}"},
                       {"role": "assistant", "content": "Assistant:\n<solution>x</solution>"}]) for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _tokenize(messages: list[dict[str, str]]) -> Any:
    from molrl.traces.tokenize import TokenizeConfig, tokenize_trace

    return tokenize_trace(Trace(messages), _tokenizer(), TokenizeConfig(max_length=None, require_feedback=False))


def _stats(path: Path) -> Any:
    from molrl.traces.stats import file_stats
    from molrl.traces.tokenize import TokenizeConfig

    return file_stats(path, _tokenizer(), TokenizeConfig(max_length=None))


_INDEX = BenchmarkIndex({"mbpp": [Task(id="11", prompt="Write a function to find the shared elements of two lists "
                                       "given as tuples.\nassert similar((1, 2), (2, 3)) == (2,)", kind="code",
                                       split="test")]})

# name -> (parser, input of size n (given n and a scratch folder), n)
PARSERS: dict[str, tuple[Callable[[Any], Any], Callable[[int, Path], Any], int]] = {
    "problem_parts: assert lines": (
        problem_parts, lambda n, _: "Write f.\n" + "".join(f"assert f({i}) == {i}\n" for i in range(n)), 2_000),
    "problem_parts: MINT task separators": (problem_parts, lambda n, _: "\n---\nTask:\nq" * n, 10_000),
    "problem_parts: function definitions": (
        problem_parts, lambda n, _: "".join(f"def f{i}(x):\n    return x\n" for i in range(n)), 300),
    "task index: match by containment": (_INDEX.match, lambda n, _: "Some words of a problem. " * n, 2_000),
    "HumanEval check function": (check_function_to_calls, lambda n, _: "def check(candidate):\n" + "".join(
        f"    assert candidate({i}) == {i}\n" for i in range(n)), 500),
    "held-back tests of a task": (held_back_indices, lambda n, _: _code_task(n), 500),
    "distinct tests of a task": (split_reason, lambda n, _: _code_task(n), 500),
    "MINT importer: turns": (mint_record_to_trace, lambda n, _: _mint_turns(n), 1_000),
    "MINT importer: stacked labels": (mint_record_to_trace, lambda n, _: _mint_row(
        [{"role": "user", "content": "t"}, {"role": "assistant", "content": "Assistant:\n" * n + "x"}]), 10_000),
    "MINT importer: a file of rows": (lambda path: import_file(path, "mint"), _mint_file, 100),
    "MINT in-context example": (strip_mint_example, lambda n, _: "i\n\n---\n\nTask:\n" + "Assistant: x\n" * n
                                + "\n\n---\n\nTask:\nq", 10_000),
    "OpenAI-style importer: turns": (lambda msgs: openai_record_to_trace({"messages": msgs}),
                                     lambda n, _: _dialogue(n), 1_000),
    "ToRA: output blocks never closed": (split_tool_text, lambda n, _: "```python\nx\n```\n" + "```output\n" * n,
                                         10_000),
    "ToRA: rounds": (split_tool_text, lambda n, _: "```python\nx\n```\n```output\n1\n```\n" * n, 2_000),
    "action reader: nested boxes never closed": (lambda t: parse_action(t, "math"), lambda n, _: "\\boxed{" * n,
                                                 10_000),
    "action reader: python fences": (lambda t: parse_action(t, "code"), lambda n, _: "```python\n" * n, 10_000),
    "code extraction: fences": (lambda t: extract_code(t, "f"), lambda n, _: "```\nf(\n" * n, 1_000),
    "lint: model-written feedback": (model_feedback, lambda n, _: "<execute>x</execute>\n" + "words\n" * n
                                     + "Observation:\n1", 20_000),
    "lint: a long line of spaces": (model_feedback, lambda n, _: "<execute>x</execute>\n" + " " * n + "x", 100_000),
    "tokeniser: messages": (_tokenize, lambda n, _: _dialogue(n), 300),
    "tokeniser: a think block among spaces": (_tokenize, lambda n, _: [
        {"role": "user", "content": "t"},
        {"role": "assistant", "content": "<think>a" + " " * n + "b</think>c" + " " * n + "d"}], 20_000),
    "traces stats: a file of traces": (_stats, _trace_file, 50),
}


def _seconds(parse: Callable[[Any], Any], item: Any, calls: int) -> float:
    """Processor seconds ``calls`` parses of ``item`` take (time spent waiting for a core the machine's other work
    holds is not counted), the garbage collector paused (a collection would fall on one timing or another: not the
    parser's cost)."""
    gc.disable()
    try:
        start = time.process_time()
        for _ in range(calls):
            parse(item)
        return time.process_time() - start
    finally:
        gc.enable()


@pytest.mark.parametrize("name", list(PARSERS))
def test_four_times_the_input_takes_at_most_about_four_times_as_long(name, tmp_path):
    parse, make, n = PARSERS[name]
    small, large = make(n, tmp_path), make(SCALE * n, tmp_path)
    _seconds(parse, small, 1)  # first use: imports and caches are not the parser's cost
    calls = max(1, math.ceil(MIN_TIMING / max(min(_seconds(parse, small, 1) for _ in range(3)), 1e-6)))
    at_n, at_large = [], []
    for round_no in range(1, ROUNDS[1] + 1):
        at_n.append(_seconds(parse, small, calls))
        at_large.append(_seconds(parse, large, calls))
        if round_no >= ROUNDS[0] and min(at_large) < MAX_RATIO * min(at_n):
            break
    assert min(at_large) < MAX_RATIO * min(at_n), (f"{name}: {min(at_n):.4f} s at n={n}, {min(at_large):.4f} s at "
                                                 f"{SCALE}n (ratio {min(at_large) / min(at_n):.2f})")
