"""A task's content key: what makes it the problem it is, so that the same id in two worlds is two problems."""

from __future__ import annotations

from dataclasses import fields, replace

from molrl.task_types import POSED, Task, TestCase

NAMING = ("id", "reference", "meta", "split")
"""The fields that only name or describe a task."""

TASK = Task(id="lib/heldout/0", prompt="Write solve(item).", kind="code", answer=None, entry_point="solve",
            tests=[TestCase(kind="call", args=["bolt"], expected=3)], setup_code="", preamble="PRICE = 1",
            reference="def solve(item): ...", probe="print(1)", meta={"family": "price"}, split="test")
CHANGED = {"prompt": "Write solve(x).", "kind": "math", "answer": "7", "entry_point": "other",
           "tests": [TestCase(kind="call", args=["bolt"], expected=3.0)], "setup_code": "X = 1",
           "preamble": "PRICE = 2", "probe": "print(2)", "id": "lib/heldout/1", "reference": "",
           "meta": {"family": "stock"}, "split": "train"}


def test_every_field_is_either_posed_or_naming():
    assert sorted(POSED + NAMING) == sorted(f.name for f in fields(Task))


def test_each_posed_field_changes_the_key_and_each_naming_field_does_not():
    key = TASK.content_key()
    assert len(key) == 16 and key == replace(TASK).content_key()
    for name, value in CHANGED.items():
        changed = replace(TASK, **{name: value}).content_key()
        assert (changed != key) == (name in POSED), name  # 3 and 3.0 are two expected values


def test_evaluation_records_the_key_of_the_problem_it_graded():
    from molrl.eval.grading import grade_samples

    task = Task(id="m/1", prompt="1 + 1?", kind="math", answer="2")
    (record,) = grade_samples([task], [["\\boxed{2}"]])[0]
    assert record.task_key == task.content_key() and record.correct
