"""Completions written to stall or bend the graders: adversarial text for extraction, answers too
large to compute, answers that state several values, slow answers on any thread."""

from __future__ import annotations

import threading
import time

import pytest

from molrl.graders import math_worker
from molrl.graders.code import extract_code
from molrl.graders.math import extract_answer, grade_math, grade_math_batch

MB = 1 << 20
HONEST = "Let me think.\n```python\ndef f(x):\n    return x + 1\n```\nThe answer is $\\boxed{3}$.\n"
ADVERSARIAL = {
    "fence_then_spaces": lambda n: "```" + " " * n,
    "fence_then_tabs": lambda n: "```" + "\t" * n,
    "fence_language_then_spaces": lambda n: "```python" + " " * n,
    "many_fence_openers": lambda n: "```x" * (n // 4),
    "unclosed_execute": lambda n: "<execute>" * (n // 9),
    "unclosed_solution": lambda n: "<solution>" * (n // 10),
    "unclosed_boxes": lambda n: "\\boxed{" * (n // 7),
    "nested_boxes": lambda n: "\\boxed{" * (n // 14) + "}" * (n // 14),
    "one_list_of_boxes": lambda n: "\\boxed{1}, " * (n // 11),
    "empty_answer_anchors": lambda n: "The answer is. " * (n // 15),
    "answer_anchor_then_spaces": lambda n: "The answer is" + " " * n,
    "def_then_spaces_in_a_block": lambda n: "```python\n" + " " * (n // 2) + "def" + " " * (n // 2) + "\n```",
    "many_async_defs": lambda n: "```python\n" + "async  def f_\n" * (n // 14) + "```",
    # many fences cost the parser a token each (about 4 s for 1 MB of them): a quarter of the size keeps the test short
    "many_short_fences_naming_f": lambda n: "```\nf(\n" * (n // 28),  # each block fails to parse and is joined
    "fence_lines_in_a_string": lambda n: "```python\nf = '''\n" + "```\n" * (n // 16) + "'''\n```",
    "deep_brackets_in_a_block": lambda n: "```python\nf = " + "(" * n + "\n```",
    "nested_quotes": lambda n: ">" * n,
    "nested_list_markers": lambda n: "- " * (n // 2),
    "quoted_fence_lines": lambda n: "> " * 50 + "```python\n" + ("> " * 50 + "f(\n") * (n // 105),
}


def _seconds(fn, text: str) -> float:
    start = time.perf_counter()
    fn(text)
    return time.perf_counter() - start


@pytest.mark.parametrize("shape", sorted(ADVERSARIAL))
def test_adversarial_completion_is_extracted_in_linear_time(shape):
    # the regex extraction took 23 s for a fence and 64 KB of spaces (quadratic: about 1.6 hours
    # at 1 MB); linear extraction takes about 0.2 s at 1 MB for the slowest shape, about as long
    # as honest text of the same size, measured here so that a loaded machine moves both
    attack = ADVERSARIAL[shape](MB)
    honest = (HONEST * (MB // len(HONEST) + 1))[:MB]
    def extract(text):  # with and without the function under test: its definition is searched for in each block
        return extract_code(text), extract_code(text, "f"), extract_answer(text)
    took, baseline = _seconds(extract, attack), _seconds(extract, honest)
    assert took < max(1.0, 20 * baseline), (took, baseline)


ASTRONOMICAL = ["2^{2^{2^{2^{2^{2}}}}}", "9^{9^{9^{9}}}", "100000000!", "\\binom{10^{12}}{10^{6}}",
                "10^{10^{10}}", "(10^{9})!", "9**9**9", "99999999!!"]


def test_astronomical_math_answers_are_refused_unparsed_in_a_batch():
    # each cost math-verify's whole 5 s alarm before (64 of them: about 5 minutes)
    grade_math("\\boxed{1}", "1")  # the worker is started
    answers = [ASTRONOMICAL[i % len(ASTRONOMICAL)] for i in range(64)]
    start = time.perf_counter()
    grades = grade_math_batch([f"So \\boxed{{{a}}}." for a in answers], ["3"] * 64)
    took = time.perf_counter() - start
    assert [g.stage for g in grades] == ["wrong"] * 64
    assert all(g.details["reason"].startswith("answer ") for g in grades)
    assert took < 5.0  # measured 0.01 s


@pytest.mark.parametrize("answer", ["2^{2^{n}}", "2^{10}", "(n+1)!", "9999!", "\\binom{10}{3}", "e^{i\\pi}", "2^{1000000}"])
def test_small_or_symbolic_powers_and_factorials_are_still_graded(answer):
    grade = grade_math(f"\\boxed{{{answer}}}", answer)
    assert grade.correct, grade.details


SLOW = "(9999!)^{9999}"
"""Small literals, so not refused, but math-verify's comparison runs until its alarm."""


def test_an_answer_past_the_row_limit_is_wrong_and_the_next_is_graded(monkeypatch):
    monkeypatch.setattr(math_worker, "ROW_LIMIT_S", 0.5)
    start = time.perf_counter()
    grades = grade_math_batch([f"\\boxed{{{SLOW}}}", "\\boxed{4}"], ["3", "4"])
    assert grades[0].stage == "wrong" and grades[0].details["reason"] == "grading took longer than 0.5 s"
    assert grades[1].correct  # on a worker started again after the kill
    assert time.perf_counter() - start < 60


def test_a_batch_past_its_budget_leaves_the_rest_ungraded(monkeypatch):
    grade_math("\\boxed{1}", "1")  # the worker is started
    monkeypatch.setattr(math_worker, "BATCH_MIN_S", 1.0)
    monkeypatch.setattr(math_worker, "BATCH_ROW_S", 0.0)
    start = time.perf_counter()
    grades = grade_math_batch([f"\\boxed{{{SLOW}}}"] * 6 + ["\\boxed{4}"], ["3"] * 6 + ["4"])
    took = time.perf_counter() - start
    assert [g.stage for g in grades] == ["grader_error"] * 7
    assert all(g.details["error"] == "not graded: the batch's time budget of 1.0 s was spent" for g in grades)
    assert took < 30  # 1 s of budget; six answers at their 2 s alarm would take 12 s


def test_a_slow_answer_graded_off_the_main_thread_cannot_hang_it():
    # math-verify's alarm does not work off the main thread; the worker's does, and its row limit too
    found = []
    thread = threading.Thread(target=lambda: found.append(grade_math(f"\\boxed{{{SLOW}}}", "3")), daemon=True)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive() and found[0].stage == "wrong"


@pytest.mark.parametrize("answer, gold", [
    ("2\\ 3", "5"), ("2 \\quad 3", "5"), ("2 \\, 3", "5"), ("2\\ 3", "2"),
    ("3 = 2", "2"), ("2 \\approx 3", "2"),
    ("2 \\lor 3", "3"), ("2 \\mid 3", "3"), ("\\begin{cases} 2 \\\\ 3 \\end{cases}", "3"),
])
def test_an_answer_that_states_several_values_is_wrong(answer, gold):
    # math-verify alone reads these as 5, 2 and 3: one number picked out of several
    grade = grade_math(f"\\boxed{{{answer}}}", gold)
    assert grade.stage == "wrong" and grade.details["read_as"] in ("2, 3", "3, 2")


@pytest.mark.parametrize("answer, gold", [
    ("x = 2", "2"), ("\\frac{1}{2} = 0.5", "\\frac{1}{2}"), ("1\\,000", "1000"), ("12 345", "12345"),
    ("y = 2x + 3", "y = 2x + 3"), ("2\\sqrt{3}", "2\\sqrt{3}"), ("2 \\quad 2", "2"),
])
def test_one_value_stated_once_or_restated_is_still_right(answer, gold):
    assert grade_math(f"\\boxed{{{answer}}}", gold).correct
