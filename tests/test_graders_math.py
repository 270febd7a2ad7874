"""Math grading: final-answer extraction and equivalence through math-verify."""

from __future__ import annotations

import threading

import pytest

from molrl.graders.math import extract_answer, grade_math
from molrl.rewards import MathReward
from molrl.tasks import load_tasks


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
