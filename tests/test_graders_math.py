"""Math grading: final-answer extraction and equivalence through math-verify."""

from __future__ import annotations

import threading
import time

import pytest

from molrl.eval.grading import same_answer
from molrl.graders.math import extract_answer, grade_math
from molrl.rewards import MathReward
from molrl.tasks import Task, load_tasks


@pytest.mark.parametrize("text, answer", [
    ("so \\boxed{1} then \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
    ("The answer is 42.", "42"),
    ("thinking...\nFinal answer: $x^2$\n", "x^2"),
    ("<solution>7</solution>", "7"),
    ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("no final answer here", None),
])
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


@pytest.mark.parametrize("completion, gold, correct", [
    ("\\boxed{0.5}", "\\frac{1}{2}", True),
    ("\\boxed{\\frac{2}{4}}", "\\frac12", True),
    ("The answer is 25.", "25", True),
    ("\\boxed{3}", "4", False),
    ("\\boxed{(3, \\frac{\\pi}{2})}", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
])
def test_grade_math_equivalence(completion, gold, correct):
    grade = grade_math(completion, gold)
    assert grade.correct is correct and grade.score == float(correct)


def test_grading_works_off_the_main_thread():
    out = []
    worker = threading.Thread(target=lambda: out.append(grade_math("\\boxed{\\sqrt{4}}", "2")))
    worker.start()
    worker.join(60)
    assert out and out[0].correct


def test_math500_gold_solutions_score_full(shared_data):
    tasks = load_tasks(shared_data / "math500" / "test.jsonl", "math500", limit=60)
    scores = MathReward()(None, [t.reference for t in tasks], task_json=[t.to_json() for t in tasks])
    assert scores == [1.0] * len(tasks)


def test_aime_answers_and_a_wrong_one(shared_data):
    tasks = load_tasks(shared_data / "aime25" / "test.jsonl", "aime", limit=3)
    reward = MathReward()
    completions = [f"The answer is \\boxed{{{t.answer}}}" for t in tasks[:2]] + ["\\boxed{1000}"]
    assert reward(None, completions, task_json=[t.to_json() for t in tasks]) == [1.0, 1.0, 0.0]
    assert reward.stage_breakdown() == {"math_reward/correct": 2 / 3, "math_reward/wrong": 1 / 3, "math_reward/mean": 2 / 3}


# --- where the final answer is -------------------------------------------------------------

@pytest.mark.parametrize("text, answer", [
    # lm-eval / Minerva: the answer after the last anchor, not "The final answer is $100"
    ("Final Answer: The final answer is $100$. I hope it is correct.", "100"),
    ("Final Answer: The final answer is 1.5. I hope it is correct.", "1.5"),
    ("Final Answer: The final answer is $\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}$. I hope it is correct.",
     "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
    # a sentence after the anchor: the value it states
    ("Final Answer: The largest $n$ is 34.", "34"),
    ("Final Answer: There are 12 ways.", "12"),
    # expressions stay whole, letters beside a number included
    ("The answer is 2xy.", "2xy"),
    ("The answer is \\begin{pmatrix} -7 \\\\ 16 \\end{pmatrix}.", "\\begin{pmatrix} -7 \\\\ 16 \\end{pmatrix}"),
])
def test_extract_answer_after_an_anchor(text, answer):
    assert extract_answer(text) == answer


@pytest.mark.parametrize("completion, gold", [
    ("Final Answer: The final answer is $100$. I hope it is correct.", "100"),
    ("Final Answer: The largest $n$ is 34.", "34"),
    ("Final Answer: The final answer is $\\frac{1}{2}$. I hope it is correct.", "\\frac12"),
])
def test_minerva_and_sentence_answers_grade_correct(completion, gold):
    assert grade_math(completion, gold).correct


def test_an_answer_line_with_a_long_run_of_spaces_is_read_in_linear_time():
    # a clause scan that retries a trailing-space check at every position is quadratic in the run:
    # about 5 minutes for these 200,000 spaces, against milliseconds for a linear one
    text = "The answer is 7" + " " * 200_000 + "and more\n"
    start = time.monotonic()
    assert extract_answer(text) == "7" + " " * 200_000 + "and more"
    assert time.monotonic() - start < 30


# --- several boxes: the last box, or the last list of boxes ---------------------------------

@pytest.mark.parametrize("completion, gold, correct", [
    ("\\boxed{2}, \\boxed{3}", "2, 3", True),                       # a list of boxes is one answer
    ("$x = \\boxed{2}$ or $x = \\boxed{-3}$", "-3, 2", True),       # graded as a set: order is free
    ("\\boxed{2}, \\boxed{3}", "3", False),                         # a hedge is not an answer
    ("\\boxed{4}, \\boxed{4}", "4", True),                          # repeating one value is one value
    ("\\boxed{15\\frac{39}{40}}, or \\boxed{\\frac{639}{40}}", "\\frac{639}{40}", True),  # one value, restated
    ("so \\boxed{2}. Wait, that is wrong: \\boxed{4}", "4", True),  # prose between: draft, then answer
    ("so \\boxed{2}. Wait, that is wrong: \\boxed{4}", "2", False),
])
def test_several_boxes(completion, gold, correct):
    assert grade_math(completion, gold).correct is correct


# --- number formats ------------------------------------------------------------------------

@pytest.mark.parametrize("written, gold", [
    ("1 000", "1000"),
    ("1\\,000", "1000"),
    ("1\u2009000", "1000"),       # thin space
    ("1\u202f000 000", "1000000"),  # narrow no-break space
    ("12 345.5", "12345.5"),
    ("1,22", "1.22"),             # decimal comma: one or two digits after it
    ("-3,5", "-\\frac{7}{2}"),
    ("1,220", "1220"),            # three digits after a comma: thousands
    ("1,5", "1, 5"),              # against a list gold, a comma separates values
])
def test_number_formats_are_read(written, gold):
    grade = grade_math(f"\\boxed{{{written}}}", gold)
    assert grade.correct, grade.details


@pytest.mark.parametrize("written, gold", [
    ("1,220", "1.22"),   # never a decimal comma with three digits
    ("1,2", "12"),       # a decimal comma, so 1.2, not twelve
    ("1 2", "12"),       # spaces join only groups of three digits
])
def test_ambiguous_number_formats_keep_their_reading(written, gold):
    assert not grade_math(f"\\boxed{{{written}}}", gold).correct


# --- the real reference answers in every supported format -----------------------------------

ANSWER_FORMATS = {
    "boxed": "So the result is $\\boxed{{{a}}}$.",
    "solution tag": "<solution>{a}</solution>",
    "the answer is": "The answer is {a}.",
    "minerva": "Final Answer: The final answer is ${a}$. I hope it is correct.",
    "final answer colon": "Work.\nFinal answer: ${a}$",
}


def test_every_math500_answer_grades_correct_in_every_format(shared_data):
    tasks = load_tasks(shared_data / "math500" / "test.jsonl", "math500")
    failed = [(name, t.id, t.answer) for t in tasks for name, template in ANSWER_FORMATS.items()
              if not grade_math(template.format(a=t.answer), t.answer).correct]
    assert len(tasks) == 500 and failed == []


# --- hostile answers fail alone --------------------------------------------------------------

NESTED_ANSWERS = {
    "parentheses": "(" * 400 + "1" + ")" * 400,
    "braces": "{" * 490 + "1" + "}" * 490,
    "fractions": "\\frac{" * 60 + "1" + "}{2}" * 60,
    "over the length bound": "(" * 3000 + "1" + ")" * 3000,
}


@pytest.mark.parametrize("name", sorted(NESTED_ANSWERS))
def test_a_deeply_nested_answer_is_wrong_without_parsing(name):
    grade = grade_math(f"\\boxed{{{NESTED_ANSWERS[name]}}}", "1")
    assert grade.stage == "wrong" and grade.details["reason"].startswith("answer ")


def test_nesting_within_the_bound_is_parsed():
    grade = grade_math("\\boxed{" + "(" * 6 + "1" + ")" * 6 + "}", "1")
    assert grade.correct


def test_a_nested_sentence_answer_is_not_parsed_as_a_sentence():
    grade = grade_math("Final Answer: The value of $n$ is " + "(" * 400 + "1" + ")" * 400 + ".", "1")
    assert not grade.correct and grade.stage == "wrong"


def test_a_grader_exception_fails_only_its_row(monkeypatch):
    import molrl.graders.math as math_grader

    real = math_grader._parse

    def parse(text):
        if "BOOM" in text:
            raise RecursionError("maximum recursion depth exceeded")
        return real(text)

    monkeypatch.setattr(math_grader, "_parse", parse)
    # the worker's side of grading, in this process, where the patch applies
    grades = [math_grader.grade_here(text, "4") for text in ("\\boxed{4}", "\\boxed{BOOM}", "\\boxed{4}")]
    assert [g.score for g in grades] == [1.0, 0.0, 1.0]
    assert grades[1].stage == "grader_error" and "RecursionError" in grades[1].details["error"]


def test_a_nested_gold_answer_is_not_parsed():
    # majority voting grades one sample's extracted answer as the gold answer of another
    grade = grade_math("\\boxed{1}", "(" * 400 + "1" + ")" * 400)
    assert grade.stage == "grader_error" and grade.details["error"].startswith("gold answer: answer nests brackets")
    assert same_answer("1", "(" * 400 + "1" + ")" * 400) is False


@pytest.mark.parametrize("text", ["<solution>x " * 20_000, "The answer is " * 20_000, "\\boxed{" * 20_000])
def test_unclosed_markers_are_read_in_linear_time(text):
    # a lazy <solution>(.*?)</solution> search rescans the rest of the text from every open tag:
    # about a minute for these 20,000 tags, against milliseconds for one scan
    start = time.monotonic()
    grade_math(text, "1")
    assert time.monotonic() - start < 30
