"""Code extraction (``molrl.graders.extract``) from a table of answers, and the one extraction behind every verdict.

Each row is a completion shape models write: fences of other languages before and after the code, ``` inside the
solution's strings, the function's name in a class, a nested def or a comparison, several definitions, no fence,
an unclosed fence. The expected code is the one a reader would grade.
"""

from __future__ import annotations

import random

import pytest

from molrl.graders.code import extract_code, grade_code
from molrl.task_types import Task, TestCase

from graders_helpers import pool  # noqa: F401 - pool is a fixture

F = "def f(x):\n    return x + 1"
DEF = f"```python\n{F}\n```"
G = "def f(x):\n    return x + 2"

TABLE = {
    # fences of other languages: sample output, shell lines, transcripts; never code
    "text_example_before": (f"Example:\n```text\nf(3) -> 4\n```\nSolution:\n{DEF}", "f", F),
    "text_block_before": (f"```text\nSolution:\n```\n{DEF}", "f", F),
    "output_before": (f"```output\n4\n```\n{DEF}", "f", F),
    "console_before": (f"```console\n$ python sol.py\n4\n```\n{DEF}", "f", F),
    "bash_after": (f"{DEF}\nRun it:\n```bash\npython sol.py\n```", "f", F),
    "sh_and_output_after": (f"{DEF}\n```sh\n$ python -c 'print(f(3))'\n```\n```output\n4\n```", "f", F),
    "only_a_text_block": ("```text\nf(3) -> 4\n```", "f", None),
    "bash_without_entry_point": (f"{DEF}\n```bash\npython sol.py\n```", None, F),
    "tags_by_case_and_word": ("```Python3 title=sol.py\nx = 1\n```\n```PY\ny = 2\n```", None, "y = 2"),
    "untagged_counts": (f"```\n{F}\n```", "f", F),
    "tilde_fence": (f"~~~python\n{F}\n~~~", "f", F),
    # the name without a top-level definition: a method, a nested def, a comparison, a use
    "name_in_a_class_after": (f"{DEF}\n```python\nclass T:\n    def f(self):\n        return 0\n```", "f", F),
    "name_in_a_nested_def_after": (f"{DEF}\n```python\ndef g():\n    def f():\n        return 0\n    return f\n```",
                                   "f", F),
    "name_in_a_comparison_after": (f"{DEF}\n```python\nprint(f == f)\nf == f\n```", "f", F),
    "name_in_an_index_target_after": (f"{DEF}\n```python\nd = {{}}\nd[f] = 1\n```", "f", F),
    "usage_after": (f"{DEF}\n```python\nassert f(3) == 4\n```", "f", F),
    "several_definitions": (f"{DEF}\nBetter:\n```python\n{G}\n```\n```python\nprint(f(1))\n```", "f", G),
    "assignment_defines": ("```python\nf = lambda x: x + 1\n```\n```python\nprint(f(1))\n```", "f",
                           "f = lambda x: x + 1"),
    "annotated_assignment_defines": ("```python\nf: object = len\n```", "f", "f: object = len"),
    "tuple_assignment_defines": ("```python\ng, f = len, abs\n```\n```python\nprint(f(1))\n```", "f",
                                 "g, f = len, abs"),
    "async_def_defines": ("```python\nasync def f(x):\n    return x\n```\n```python\nprint(f)\n```", "f",
                          "async def f(x):\n    return x"),
    "prefix_of_another_name": (f"```python\ndef f_2(x):\n    return 1\n```\n```python\nprint(f(1))\n```", "f",
                               "print(f(1))"),
    # ``` inside the solution's strings
    "fence_in_a_string_on_a_code_line": ('```python\ndef f(s):\n    return s.split("```")[1]\n```', "f",
                                         'def f(s):\n    return s.split("```")[1]'),
    "fence_line_indented_in_a_string": ("```python\ndef f():\n    return '''\n    ```\n    '''\n```", "f",
                                        "def f():\n    return '''\n    ```\n    '''"),
    "fence_line_at_column_0_in_a_string": ("```python\nT = '''\n```\n'''\ndef f():\n    return T\n```\nDone.", "f",
                                           "T = '''\n```\n'''\ndef f():\n    return T"),
    "fenced_block_in_a_string": ("```python\ndef f():\n    return '''\n```python\nx\n```\n'''\n```\nDone.", "f",
                                 "def f():\n    return '''\n```python\nx\n```\n'''"),
    "longer_fence_around_a_fence": ("````python\ndef f():\n    return '''\n```\n'''\n````", "f",
                                    "def f():\n    return '''\n```\n'''"),
    # no fence, unclosed fences, broken definitions, tags, containers
    "no_fence": ("def f(x):\n    return x + 1", "f", None),
    "unclosed_fence": ("```python\ndef f(x):\n    return x", "f", None),
    "unclosed_fence_after_an_answer": (f"{DEF}\nOr:\n```python\ndef f(x):\n    return", "f", F),
    "definition_that_does_not_compile": ("```python\ndef f(x)\n    return x\n```\n```python\nprint(f(1))\n```", "f",
                                         "def f(x)\n    return x"),
    "indented_def_that_does_not_compile": (f"{DEF}\n```python\nif True:\n    def f(x)\n```", "f", F),
    "name_in_a_string_of_a_block_that_does_not_compile_after": (
        f"{DEF}\n```python\nUSAGE = '''\nf = the function above\n'''\nprint USAGE\n```", "f", F),
    "solution_tag": ("<solution>\ndef f(x):\n    return x\n</solution>", "f", "def f(x):\n    return x"),
    "solution_tag_around_fences": (f"<solution>\n```text\nf(3) -> 4\n```\n{DEF}\n</solution>", "f", F),
    "fence_in_a_list_item": ("1. The code:\n   ```python\n   def f(x):\n       return x\n   ```\n", "f",
                             "def f(x):\n    return x"),
    "windows_line_ends": ("```python\r\ndef f(x):\r\n    return x\r\n```\r\n", "f", "def f(x):\n    return x"),
}


@pytest.mark.parametrize("shape", sorted(TABLE))
def test_the_code_a_reader_would_grade_is_extracted(shape):
    text, entry_point, code = TABLE[shape]
    assert extract_code(text, entry_point) == code


# the shapes that graded a right answer wrong, through the grader: each all_pass now
RIGHT = ["text_example_before", "output_before", "bash_after", "name_in_a_class_after", "name_in_a_nested_def_after",
         "name_in_a_comparison_after", "fence_in_a_string_on_a_code_line", "fence_line_at_column_0_in_a_string"]


def test_right_answers_of_every_shape_pass(pool):
    # before, in order: compile_error ('Solution:' graded), no_code, runtime_error (no f in the bash line), the
    # class, the nested def and the comparison graded (f undefined or f(x) not its answer), and two cut strings
    tasks = [Task(id=s, prompt="", kind="code", entry_point="f",
                  tests=[TestCase("call", args=[n], expected=n + 1) for n in (1, 2, 7)]) for s in RIGHT[:6]]
    texts = [TABLE[s][0] for s in RIGHT[:6]]
    tasks.append(Task(id="split", prompt="", kind="code", entry_point="f",
                      tests=[TestCase("call", args=["a```b"], expected="b"), TestCase("call", args=["```c"], expected="c")]))
    texts.append(TABLE["fence_in_a_string_on_a_code_line"][0])
    tasks.append(Task(id="template", prompt="", kind="code", entry_point="f",
                      tests=[TestCase("call", args=[], expected="\n```\n")]))
    texts.append(TABLE["fence_line_at_column_0_in_a_string"][0])
    assert [g.stage for g in grade_code(texts, tasks, pool)] == ["all_pass"] * len(texts)


def test_random_documents_give_the_block_their_construction_says():
    # documents built from prose, fences of several languages and tag blocks, whose answer is known by construction:
    # the last Python block that defines f at its top level, else the last Python block
    codes = [("def f(x):\n    return 1", True), ("f = len", True), ("print(f(2))", False), ("class A:\n    def f(self):"
             "\n        pass", False), ("def g():\n    def f():\n        pass", False), ("x = f == f", False)]
    prose = ["Here is the code:", "It prints 4.", "", "Note: `f` is fast.", "# Heading", "- a point"]
    rng = random.Random(0)
    for _ in range(2_000):
        parts, python = [], []
        for _ in range(rng.randint(0, 6)):
            kind = rng.choice(["prose", "python", "other", "tag"])
            if kind == "prose":
                parts.append(rng.choice(prose))
                continue
            code, defines = rng.choice(codes)
            if kind == "other":
                parts.append(f"```{rng.choice(['text', 'bash', 'output', 'console', 'sh', 'pycon'])}\n{code}\n```")
            elif kind == "tag":
                tag = rng.choice(["solution", "execute"])
                parts.append(f"<{tag}>\n{code}\n</{tag}>")
                python.append((code, defines))
            else:
                parts.append(f"```{rng.choice(['python', 'py', 'Python3', ''])}\n{code}\n```")
                python.append((code, defines))
            parts.append(rng.choice(prose))
        text = "\n".join(parts)
        defining = [c for c, d in python if d]
        expected = defining[-1] if defining else python[-1][0] if python else None
        assert extract_code(text, "f") == expected, repr(text)
        assert extract_code(text) == (python[-1][0] if python else None), repr(text)


ANSWER = TABLE["text_example_before"][0]
"""A right answer after a sample-output block: before, every consumer graded 'Solution:' (compile_error)."""


def test_eval_rl_collect_and_the_trl_reward_read_the_answer_by_the_one_extraction(pool):
    from molrl.episode.actions import Action
    from molrl.episode.environment import observe
    from molrl.eval.grading import grade_samples
    from molrl.rewards import CodeReward
    from molrl.rl.score import score

    task = Task(id="inc", prompt="", kind="code", entry_point="f",
                tests=[TestCase("call", args=[n], expected=n + 1) for n in (1, 2, 7)])
    record, = grade_samples([task], [[ANSWER]], pool)[0]
    assert (record.correct, record.extracted) == (True, F)  # eval's pass@1
    assert score([task], [ANSWER], pool).rewards == [1.0]  # molrl rl's reward
    assert CodeReward(pool)(["p"], [ANSWER], task_json=[task.to_json()]) == [1.0]  # the TRL reward
    solution = f"<solution>\n{ANSWER}\n</solution>"
    observation, = observe(pool, [(task, Action("solution", ANSWER, solution, len(solution)))])
    assert observation.verdict is True  # collect's verdict, and so its success label


@pytest.mark.parametrize("code, graded", [
    (F, True), ("f = abs", True), ("class T:\n    def f(self):\n        return 0", False),
    ("def g():\n    def f():\n        return 0", False), ("print(f == f)", False), ("def f(x)\n    return x", True),
])
def test_an_executed_block_is_graded_on_the_tests_when_its_top_level_defines_the_function(code, graded):
    from molrl.episode.environment import defines

    assert defines(code, "f") is graded and not defines(code, None)
