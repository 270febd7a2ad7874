"""Code grading: extraction, stages, and the real benchmarks' reference solutions through the reward API."""

from __future__ import annotations

import pytest

from molrl.graders.code import CodeRewardConfig, extract_code, grade_code
from molrl.rewards import CodeReward, completion_text
from molrl.sandbox import SandboxConfig, SandboxPool
from molrl.tasks import Task, TestCase, load_tasks


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(workers=2, timeout_s=10.0)) as p:
        yield p


def fenced(code: str) -> str:
    return f"Here you go:\n```python\n{code}\n```\n"


def test_last_code_block_wins():
    text = "```python\nx = 1\n```\nbetter:\n```py\nx = 2\n```\n<execute>\nx = 3\n</execute>"
    assert extract_code(text) == "x = 3"
    assert extract_code("<solution>```python\ny = 1\n```</solution>") == "y = 1"
    assert extract_code("```\nz = 0\n```") == "z = 0"


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


def test_a_failing_batch_scores_as_sandbox_errors():
    class BrokenPool:
        def run_tests_many(self, pairs):
            raise RuntimeError("worker exploded")

    scores = CodeReward(BrokenPool())(["p"], [fenced("def sq(x):\n    return x * x")], task_json=[square_task().to_json()])
    assert scores == [0.0]


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
