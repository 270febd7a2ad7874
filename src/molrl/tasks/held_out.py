"""Which tests a task may show, and which decide whether an answer solved it.

A test whose expected value the policy saw, in its prompt or in feedback (``f(3) returned None, expected 9``),
is earned by a lookup table of the shown values: on MBPP, whose prompt listed every test, a table of the
prompt's asserts scored 1.0 on 20 of 20 tasks without solving any. So a code task's tests are split once, here:

- shown: the first ``n // 2`` tests in the source's order. MBPP (3 tests each): the first, which is the one
  its prompt lists as the example (the convention of EvalPlus's MBPP+ prompt). HumanEval (its ``check``
  asserts, 1 to 26 per task): e.g. 2 of 5; its prompt lists none (its docstring examples are the benchmark's).
- held back: the rest, less those that repeat a shown test (same inputs and expected value): a repeat was
  shown. MBPP task 37 repeats its shown test twice, so it holds none back; tasks 337, 508, 713 and 862 repeat
  it once and hold one back. HumanEval 111 and 144 repeat one each.
- a task that holds no test back (fewer than 2 distinct tests: MBPP 37, 23 of HumanEval's 164) is graded on all
  its tests and flagged (``held_back`` false); RL leaves it out wherever tests are shown, naming the reason, and
  where the policy saw every test that decides it (``unsplit``), interactive eval and collect score its verdict
  apart: never a success, outside the headline pass@1.
- a task whose held-back tests one constant return passes, the value a shown test expects (``constant_answer``:
  MBPP 203, 339, 667, 674, 816, 899; HumanEval 127, 134), pays for copying that value: RL leaves it out by default
  and eval counts it.

Where the policy sees shown tests (a prompt that lists them, or an episode whose feedback reports test outcomes),
the episode runs on the shown tests and its verdict grades the held-back ones (``episode_tasks``). Math answers
are not split: a wrong answer's feedback says it is wrong, never what is right.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from molrl.sandbox.runtime.codec import encode
from molrl.task_types import Task, TestCase

PROMPT_LISTS_TESTS = frozenset({"mbpp"})
"""Benchmarks (a loader's ``meta["source"]``) whose prompt lists the task's shown tests."""


def shown_count(n: int) -> int:
    """How many of a task's ``n`` tests, the first ones, may be shown."""
    return n // 2


def _exact(test: TestCase) -> str:
    """A test's identity: two tests are one test when their kind, inputs and expected value, with their exact types,
    give the same text (compared as text, so a task's tests are told apart in one pass)."""
    fields = dataclasses.asdict(test)
    fields.update(args=encode(list(test.args)), expected=encode(test.expected))
    return json.dumps(fields, sort_keys=True, default=repr)


def held_back_indices(task: Task) -> list[int]:
    """Positions in ``task.tests`` of its held-back tests: after the shown ones, repeating none of them (none when
    no test is shown: a task of one test)."""
    n_shown = shown_count(len(task.tests))
    if not n_shown:
        return []
    shown = {_exact(t) for t in task.tests[:n_shown]}
    return [i for i in range(n_shown, len(task.tests)) if _exact(task.tests[i]) not in shown]


def shows_tests(turns: int, episode: Any) -> bool:
    """Whether episodes of ``turns`` turns under ``episode`` (an ``EpisodeConfig``) can show test outcomes
    before their last answer."""
    return turns > 1 and (episode.max_solutions > 1 or episode.tests_on_execute)


def prompt_lists_tests(task: Task) -> bool:
    """Whether ``task``'s prompt lists its shown tests (its benchmark's convention)."""
    return task.kind == "code" and task.meta.get("source") in PROMPT_LISTS_TESTS


def split_reason(task: Task) -> str | None:
    """Why ``task`` holds no test back, or None when it holds one or more back (or is not code)."""
    if task.kind != "code" or held_back_indices(task):
        return None
    distinct = len({_exact(t) for t in task.tests})
    return (f"code task has {distinct} distinct test{'s' if distinct != 1 else ''}; with tests shown (in its prompt, "
            "or in feedback when max_solutions > 1 or tests_on_execute) a verdict needs one more, held back; add a "
            "distinct test to the task to train on it")


def constant_answer(task: Task) -> bool:
    """Whether one constant return passes every held-back test of ``task``, and a shown test expects that value: every
    held-back test is a call test expecting the value a shown one expects (MBPP 667, 674, 816, 899), so copying the
    shown test's expected value earns the held-back verdict."""
    held = held_back_indices(task)
    if not held or any(task.tests[i].kind != "call" for i in held):
        return False
    values = {_expected(task.tests[i]) for i in held}
    shown = {_expected(t) for t in task.tests[:shown_count(len(task.tests))] if t.kind == "call"}
    return len(values) == 1 and values <= shown


def _expected(test: TestCase) -> str:
    return json.dumps(encode(test.expected), sort_keys=True, default=repr)


def unsplit(task: Task, feedback_shows_tests: bool) -> bool:
    """Whether the policy saw every test that decides ``task``'s verdict: it is shown tests (its prompt lists them, or
    ``feedback_shows_tests``) and holds none back. Such a verdict is scored apart, never as a pass."""
    return task.kind == "code" and (feedback_shows_tests or prompt_lists_tests(task)) and split_reason(task) is not None


def split_tests(task: Task) -> tuple[Task, Task]:
    """(shown, held back): ``task`` with its shown tests and with its held-back tests; a math task is both.
    Raises ValueError for a code task that holds no test back (``split_reason``)."""
    reason = split_reason(task)
    if reason:
        raise ValueError(f"task {task.id}: {reason}")
    if task.kind != "code":
        return task, task
    held = held_back_indices(task)
    return (dataclasses.replace(task, tests=task.tests[:shown_count(len(task.tests))]),
            dataclasses.replace(task, tests=[task.tests[i] for i in held]))


def episode_tasks(task: Task, feedback_shows_tests: bool) -> tuple[Task, Task, bool]:
    """(the task an episode or prompt runs on, the task whose tests decide its verdict, whether that verdict is on
    held-back tests). Tests are held back where the policy sees shown ones: ``task``'s prompt lists them, or
    ``feedback_shows_tests``; a task that holds none back is graded on all of its tests (flagged: False)."""
    if task.kind != "code" or not (feedback_shows_tests or prompt_lists_tests(task)) or split_reason(task):
        return task, task, False
    shown, held = split_tests(task)
    return shown, held, True


def split_outcome(task: Task, grade: Any) -> tuple[bool | None, bool | None]:
    """(all shown tests passed, all held-back tests passed) of a ``Grade`` of ``task`` on all its tests, from its
    per-test outcomes (a test with no outcome failed); (None, None) where the task is not code or holds none back."""
    if task.kind != "code" or grade is None:
        return None, None
    passed = {t["index"] for t in (grade.details or {}).get("tests", []) if t.get("passed")}
    held = held_back_indices(task)
    if not held:
        return None, None
    return all(i in passed for i in range(shown_count(len(task.tests)))), all(i in passed for i in held)
