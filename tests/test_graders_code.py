"""Code grading: extraction, stages, and the real benchmarks' reference solutions through the reward API."""

from __future__ import annotations

import pytest

from molrl.graders.code import CodeRewardConfig, extract_code, grade_code
from molrl.rewards import CodeReward, completion_text
from molrl.tasks import Task, TestCase, load_tasks

from graders_helpers import fenced, pool  # noqa: F401 - pool is a fixture




def test_last_code_block_wins():
    text = "```python\nx = 1\n```\nbetter:\n```py\nx = 2\n```\n<execute>\nx = 3\n</execute>"
    assert extract_code(text) == "x = 3"
    assert extract_code("<solution>```python\ny = 1\n```</solution>") == "y = 1"
    assert extract_code("```\nz = 0\n```") == "z = 0"


DEF = "```python\ndef f(x):\n    return x + 1\n```"
USE = "```python\nassert f(3) == 4\nprint(f(1))\n```"
FIX = "```python\ndef f(x):\n    return x + 2\n```"


@pytest.mark.parametrize("text, entry_point, chosen", [
    (f"{DEF}\nTry it:\n{USE}", "f", DEF),  # a later block that only uses the function is not its answer
    (f"{DEF}\nTry it:\n{USE}", None, USE),  # no function named: the last block, as before
    (f"{DEF}\n{USE}\nFixed:\n{FIX}\n{USE}", "f", FIX),  # the last definition: drafts are corrected
    (f"{USE}\n{DEF}", "f", DEF),
    (f"{DEF}\n{USE}", "g", USE),  # no block defines g: the last block
    ("```python\ndef f_2(x):\n    return 1\n```\n" + USE, "f", USE),  # f_2 is not f
    ("```python\nimport math\n\nasync def f(x):\n    return x\n```\n" + USE, "f",
     "```python\nimport math\n\nasync def f(x):\n    return x\n```"),
    ("```python\nf = lambda x: x + 1\n```\n" + USE, "f", "```python\nf = lambda x: x + 1\n```"),
    ("<solution>\ndef f(x):\n    return x\n</solution>\n" + USE, "f",
     "<solution>\ndef f(x):\n    return x\n</solution>"),
    ("<execute>\nprint(f(2))\n</execute>", "f", "<execute>\nprint(f(2))\n</execute>"),
])
def test_the_block_that_defines_the_function_under_test_is_graded(text, entry_point, chosen):
    assert extract_code(text, entry_point) == extract_code(chosen)


def test_a_correct_function_followed_by_a_usage_block_passes(pool):
    task = Task(id="inc", prompt="", kind="code", entry_point="f",
                tests=[TestCase("call", args=[n], expected=n + 1) for n in (1, 2, 5)])
    grade, = grade_code([f"{DEF}\nYou can test it:\n```python\nassert f(3) == 4\nassert g(1) == 2\n```"], [task], pool)
    assert (grade.stage, grade.correct, grade.extracted) == ("all_pass", True, "def f(x):\n    return x + 1")


def test_no_code_block_is_none():
    assert extract_code("I would write a loop.") is None and extract_code("```python\n\n```") is None


def square_task() -> Task:
    tests = [TestCase("call", args=[n], expected=n * n) for n in (1, 2, 3, 4)]
    return Task(id="sq", prompt="", kind="code", entry_point="sq", tests=tests)


@pytest.mark.parametrize("completion, stage, score", [
    ("no code here", "no_code", 0.0),
    (fenced("def sq(x) return x"), "compile_error", 0.1),
    (fenced("raise RuntimeError('no')"), "runtime_error", 0.2),
    (fenced("def sq(x):\n    return x + 1 if x > 2 else x * x"), "partial", 0.3 + 0.6 * 0.5),  # 1, 2 pass: half
    (fenced("def sq(x):\n    return -1"), "partial", 0.3),  # runs cleanly, nothing right
    (fenced("def sq(x):\n    return x * x"), "all_pass", 1.0),
])
def test_staged_reward_values(pool, completion, stage, score):
    grade = grade_code([completion], [square_task()], pool)[0]
    assert grade.stage == stage and grade.score == pytest.approx(score)


def test_binary_reward_is_all_or_nothing(pool):
    cfg = CodeRewardConfig(mode="binary")
    half = fenced("def sq(x):\n    return x + 1 if x > 2 else x * x")
    full = fenced("def sq(x):\n    return x * x")
    assert [g.score for g in grade_code([half, full], [square_task()] * 2, pool, cfg)] == [0.0, 1.0]


def test_reward_accepts_chat_messages_and_logs_stages(pool):
    reward = CodeReward(pool)
    messages = [{"role": "assistant", "content": fenced("def sq(x):\n    return x * x")}]
    logged = {}
    scores = reward(["p", "p"], [messages, "nothing"], task_json=[square_task().to_json()] * 2,
                    log_metric=lambda name, value: logged.__setitem__(name, value))
    assert scores == [1.0, 0.0]
    assert logged == {"code_reward/all_pass": 0.5, "code_reward/no_code": 0.5, "code_reward/mean": 0.5}
    assert completion_text([{"role": "assistant", "content": [{"type": "text", "text": "a"}]}]) == "a"


def test_a_pool_that_always_raises_fails_each_row_with_the_error():
    class BrokenPool:
        def run_tests_many(self, pairs):
            raise RuntimeError("worker exploded")

    reward = CodeReward(BrokenPool())
    scores = reward(["p"] * 2, [fenced("def sq(x):\n    return x * x")] * 2, task_json=[square_task().to_json()] * 2)
    assert scores == [0.0, 0.0]
    assert [(g.stage, g.details["error"]) for g in reward.last_grades] == [("grader_error", "RuntimeError: worker exploded")] * 2


class RaisingJudgePool:
    """Real results for every program, except that judging one whose code says JUDGE_RAISES raises."""

    def __init__(self, inner):
        self.inner = inner
        self.batches = 0

    def run_tests_many(self, pairs):
        self.batches += 1
        if any("JUDGE_RAISES" in code for code, _ in pairs):
            raise OverflowError("int too large to convert to float")
        return self.inner.run_tests_many(pairs)


def test_a_raising_judgement_fails_only_its_own_row(pool):
    good, bad = fenced("def sq(x):\n    return x * x"), fenced("def sq(x):\n    return x * x  # JUDGE_RAISES")
    completions = [good, good, bad, good, "no code"]
    grades = grade_code(completions, [square_task()] * 5, RaisingJudgePool(pool))
    assert [g.stage for g in grades] == ["all_pass", "all_pass", "grader_error", "all_pass", "no_code"]


def test_a_raising_judgement_is_logged_with_the_task_and_error(pool, caplog):
    bad = fenced("def sq(x):\n    return x * x  # JUDGE_RAISES")
    with caplog.at_level("ERROR", logger="molrl.graders.code"):
        grade = grade_code([bad], [square_task()], RaisingJudgePool(pool))[0]
    assert grade.details["error"] == "OverflowError: int too large to convert to float"
    assert "task sq" in caplog.text and "OverflowError" in caplog.text


def test_one_bad_row_costs_about_log2_n_extra_batches(pool):
    wrapped = RaisingJudgePool(pool)
    completions = [fenced(f"def sq(x):\n    return x * x  # {i}") for i in range(15)]
    completions.append(fenced("def sq(x):\n    return x * x  # JUDGE_RAISES"))
    grade_code(completions, [square_task()] * 16, wrapped)
    # 16 rows -> 16, 8+8, 4+4, 2+2, 1+1: the bad row's halves fail, each good half passes once
    assert wrapped.batches == 1 + 2 * 4


def triangle_task() -> Task:
    """HumanEval/45's tests: the expected values are floats."""
    tests = [TestCase("call", args=list(a), expected=e) for a, e in (((5, 3), 7.5), ((2, 2), 2.0), ((10, 8), 40.0))]
    return Task(id="HumanEval/45", prompt="", kind="code", entry_point="triangle_area", tests=tests)


def test_a_huge_int_where_a_float_is_expected_fails_only_its_row(pool):
    right = fenced("def triangle_area(a, h):\n    return a * h / 2.0")
    huge = fenced("def triangle_area(a, h):\n    return 10**400")
    grades = grade_code([right, huge, right], [triangle_task()] * 3, pool)
    assert [g.correct for g in grades] == [True, False, True] and grades[0].score == grades[2].score == 1.0


def test_a_huge_int_row_leaves_the_rest_of_a_reward_batch_scored(pool):
    right = fenced("def triangle_area(a, h):\n    return a * h / 2.0")
    huge = fenced("def triangle_area(a, h):\n    return 10**400")
    scores = CodeReward(pool, CodeRewardConfig(mode="binary"))(
        ["p"] * 3, [right, huge, right], task_json=[triangle_task().to_json()] * 3)
    assert scores == [1.0, 0.0, 1.0]


COMPILE_BOMBS = {
    "nested parentheses": "(" * 3000 + ")" * 3000,
    "nested unary minus": "x = " + "-" * 3000 + "1",
    "long unary chain": "-" * 100000 + "1",
    "nested lists": "x = " + "[" * 3000 + "]" * 3000,
}


@pytest.mark.parametrize("name", sorted(COMPILE_BOMBS))
def test_a_compile_bomb_is_a_compile_error(pool, name):
    grades = grade_code([fenced(COMPILE_BOMBS[name]), fenced("def sq(x):\n    return x * x")], [square_task()] * 2, pool)
    assert [g.stage for g in grades] == ["compile_error", "all_pass"]


@pytest.mark.parametrize("code", [
    "exec('def')",  # the program compiled; a SyntaxError raised while running is a runtime error
    "raise SyntaxError('made up')",
    "import sys\nsys.stderr.write('note\\n')\nraise SystemExit(3)",
])
def test_errors_raised_by_running_code_are_runtime_errors(pool, code):
    assert grade_code([fenced(code)], [square_task()], pool)[0].stage == "runtime_error"


def test_a_compile_error_names_the_compilers_complaint(pool):
    grade = grade_code([fenced("def sq(x) return x")], [square_task()], pool)[0]
    assert grade.details["error"] == "SyntaxError: expected ':' (solution.py, line 1)"


def test_a_syntax_error_on_a_line_longer_than_the_output_limit_is_a_compile_error(pool):
    # the error display repeats the 80 KB line, so stderr is cut before the "SyntaxError" line
    grade = grade_code([fenced("x = (" + "1," * 40000 + "]")], [square_task()], pool)[0]
    assert grade.stage == "compile_error"


def test_stdio_tasks_read_compile_errors_too(pool):
    task = Task(id="io", prompt="", kind="code", tests=[TestCase("stdio", stdin="2\n", stdout="4\n")])
    grades = grade_code([fenced("print(int(input()) ** 2"), fenced("print(int(input()) ** 2)")], [task] * 2, pool)
    assert [g.stage for g in grades] == ["compile_error", "all_pass"]


def humaneval_check(shared_data, pool):
    tasks = load_tasks(shared_data / "humaneval" / "HumanEval.jsonl.gz", "humaneval")
    reward = CodeReward(pool)
    good = reward(None, [fenced(t.reference) for t in tasks], task_json=[t.to_json() for t in tasks])
    bad = CodeReward(pool, CodeRewardConfig(mode="binary"))(
        None, [fenced(t.prompt + "    return None\n") for t in tasks], task_json=[t.to_json() for t in tasks])
    return tasks, good, bad


def test_humaneval_all_canonical_full_and_return_none_zero(shared_data, pool):
    tasks, good, bad = humaneval_check(shared_data, pool)
    assert len(tasks) == 164 and good == [1.0] * 164 and bad == [0.0] * 164


def test_float_near_an_integer_fails_integer_tests(shared_data, pool):
    # Binet's formula returns 55.000000000000014 for fib(10): HumanEval's own `== 55` fails it,
    # and so must the grader (it passed all 5 tests while the float tolerance applied to ints)
    tasks = {t.id: t for t in load_tasks(shared_data / "humaneval" / "HumanEval.jsonl.gz", "humaneval")}
    binet = "def fib(n: int):\n    s = 5 ** 0.5\n    return (((1 + s) / 2) ** n - ((1 - s) / 2) ** n) / s"
    rounded = binet.replace("return (", "return round((") + ")"
    grades = grade_code([fenced(binet), fenced(rounded)], [tasks["HumanEval/55"]] * 2, pool)
    assert grades[0].stage == "partial" and grades[0].details["passed"] < grades[0].details["total"]
    assert grades[1].stage == "all_pass"


def mbpp_failures(shared_data, pool) -> tuple[int, list[str]]:
    tasks = load_tasks(shared_data / "mbpp" / "mbpp.jsonl", "mbpp")
    grades = grade_code([fenced(t.reference) for t in tasks], tasks, pool)
    return len(tasks), [t.id for t, g in zip(tasks, grades) if not g.correct]


def test_mbpp_every_reference_solution_passes(shared_data, pool):
    n, failed = mbpp_failures(shared_data, pool)
    assert n == 974 and failed == []


def test_reward_docstring_examples_run():
    import doctest

    import molrl.rewards

    result = doctest.testmod(molrl.rewards)
    assert result.attempted >= 3 and result.failed == 0
