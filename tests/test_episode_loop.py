"""The agent-environment loop driven by a scripted model: turn-taking, feedback, stopping, verdicts."""

import dataclasses

import pytest
from collect_scripted import ScriptedGenerator

from molrl.chat import render
from molrl.episode import EpisodeConfig, run_episodes, start_episode
from molrl.episode.actions import SYSTEM_PROMPT
from molrl.sandbox import SandboxConfig, SandboxPool
from molrl.tasks import Task, TestCase
from molrl.tiny import build_tiny_tokenizer

ADD = Task(
    id="add", prompt="TASK-ADD: return the sum of a and b.", kind="code", entry_point="add",
    tests=[TestCase("call", args=[1, 2], expected=3), TestCase("call", args=[3, 4], expected=7),
           TestCase("call", args=[0, 0], expected=0),  # the first 3 of 6 are shown, the rest held back
           TestCase("call", args=[5, 5], expected=10), TestCase("call", args=[2, -2], expected=0),
           TestCase("call", args=[10, 1], expected=11)],
)
MATH = Task(id="m1", prompt="TASK-MATH: what is 2 + 2?", kind="math", answer="4")

WRONG_RUN = "The sum should be easy.\n<execute>\ndef add(a, b):\n    return a - b\nprint(add(1, 2))\n</execute>"
FIXED_RUN = "That subtracted. Fix it:\n<execute>\ndef add(a, b):\n    return a + b\nprint(add(1, 2))\n</execute>"
RIGHT = "<solution>\ndef add(a, b):\n    return a + b\n</solution>"
WRONG = "<solution>\ndef add(a, b):\n    return a * b\n</solution>"


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(workers=2, timeout_s=5)) as p:
        yield p


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer("chatml")


def _run(tok, pool, scripts, tasks=(ADD,), **cfg):
    gen = ScriptedGenerator(scripts)
    return gen, run_episodes(gen, tok, list(tasks), pool, EpisodeConfig(**cfg), thinking=True)


def test_wrong_code_then_fixed_code_then_solution(tok, pool):
    _, (ep,) = _run(tok, pool, {"TASK-ADD": [WRONG_RUN, FIXED_RUN, RIGHT]})
    instructions = SYSTEM_PROMPT.replace("{max_turns}", "5").replace("{max_solutions}", "2")
    assert ep.messages == [
        {"role": "system", "content": instructions},
        {"role": "user", "content": "Write a Python function `add` that solves the following problem.\n\n" + ADD.prompt},
        {"role": "assistant", "content": WRONG_RUN},
        {"role": "tool", "content": "Output:\n-1\n\nYou have 4 turns and 2 solution submissions left."},
        {"role": "assistant", "content": FIXED_RUN},
        {"role": "tool", "content": "Output:\n3\n\nYou have 3 turns and 2 solution submissions left."},
        {"role": "assistant", "content": RIGHT},
        {"role": "tool", "content": "All 3 tests passed.\n\nYour solution is correct."},
    ]
    assert ep.authors == ["instructions", "task", "model", "environment", "model", "environment", "model", "environment"]
    assert (ep.stop_reason, ep.verdict, ep.turns, ep.solutions) == ("solved", True, 3, 1)


def test_wrong_solution_gets_test_results_then_another_try(tok, pool):
    _, (ep,) = _run(tok, pool, {"TASK-ADD": [WRONG, RIGHT]})
    assert ep.messages[3]["content"] == (
        "2 of 3 tests failed:\n- add(1, 2) returned 2, expected 3\n- add(3, 4) returned 12, expected 7\n\n"
        "Your solution is wrong.\n\nYou have 4 turns and 1 solution submission left."
    )
    assert (ep.stop_reason, ep.success, ep.solutions) == ("solved", True, 2)


def test_episode_ends_when_solutions_run_out(tok, pool):
    _, (ep,) = _run(tok, pool, {"TASK-ADD": [WRONG, WRONG, RIGHT]})
    assert (ep.stop_reason, ep.success, ep.turns) == ("out_of_solutions", False, 2)
    assert ep.messages[-1]["content"].endswith("Your solution is wrong.")  # final: no budget line


def test_episode_ends_at_the_turn_limit(tok, pool):
    _, (ep,) = _run(tok, pool, {"TASK-ADD": [WRONG_RUN, FIXED_RUN, RIGHT]}, max_turns=2)
    assert (ep.stop_reason, ep.success, ep.turns) == ("max_turns", False, 2)
    assert [m["role"] for m in ep.messages[2:]] == ["assistant", "tool", "assistant", "tool"]
    assert ep.messages[-1]["content"] == "Output:\n3"


def test_turn_without_action_gets_format_feedback(tok, pool):
    _, (ep,) = _run(tok, pool, {"TASK-ADD": ["I think add is a + b.", RIGHT]})
    assert ep.messages[3]["content"] == (
        "No action was taken: no <execute> or <solution> block. End your turn with code to run in "
        "<execute>...</execute>, or your final solution in <solution>...</solution>.\n\n"
        "You have 4 turns and 2 solution submissions left."
    )
    assert ep.stop_reason == "solved"


def test_text_after_the_action_is_cut_from_the_turn(tok, pool):
    _, (ep,) = _run(tok, pool, {"TASK-ADD": [RIGHT + "\nObservation: all good"]})
    assert ep.messages[2]["content"] == RIGHT
    assert ep.cut_chars == {2: len("\nObservation: all good")}


def test_token_limit_cuts_the_turn_and_ends_the_episode(tok, pool):
    gen = ScriptedGenerator({"TASK-ADD": ["x" * 500]})
    prompt = render(tok, start_episode(ADD, 0, EpisodeConfig()).messages, add_generation_prompt=True)
    limit = len(tok(prompt, add_special_tokens=False)["input_ids"]) + 40  # room for 40 generated tokens
    (ep,) = run_episodes(gen, tok, [ADD], pool, EpisodeConfig(max_total_tokens=limit), thinking=True)
    assert ep.stop_reason == "token_limit"
    assert ep.messages[-1] == {"role": "assistant", "content": "x" * 40}  # byte tokens: 40 tokens = 40 chars


def test_executed_code_can_be_tested_too(tok, pool):
    _, (ep,) = _run(tok, pool, {"TASK-ADD": [WRONG_RUN, RIGHT]}, tests_on_execute=True)
    # a - b passes only add(0, 0)
    assert ep.messages[3]["content"] == (
        "Output:\n-1\n\n2 of 3 tests failed:\n- add(1, 2) returned -1, expected 3\n"
        "- add(3, 4) returned -1, expected 7\n\nYou have 4 turns and 2 solution submissions left."
    )


def test_math_answers_are_graded_outside_the_sandbox(tok, pool):
    _, (ep,) = _run(tok, pool, {"TASK-MATH": ["<execute>\nprint(2 + 2)\n</execute>", "<solution>5</solution>", "So \\boxed{4}."]},
                    tasks=[MATH])
    assert [m["content"] for m in ep.messages if m["role"] == "tool"] == [
        "Output:\n4\n\nYou have 4 turns and 2 solution submissions left.",
        "Your answer is wrong.\n\nYou have 3 turns and 1 solution submission left.",
        "Your answer is correct.",
    ]
    assert ep.messages[-2]["content"] == "So \\boxed{4}"
    assert (ep.stop_reason, ep.verdict) == ("solved", True)


def test_episodes_advance_in_lockstep_batches(tok, pool):
    tasks = [dataclasses.replace(ADD, id=f"add{i}", prompt=f"TASK-{i}: add") for i in range(3)]
    scripts = {"TASK-0": [RIGHT], "TASK-1": [WRONG_RUN, RIGHT], "TASK-2": [WRONG_RUN, FIXED_RUN, RIGHT]}
    gen = ScriptedGenerator(scripts)
    episodes = run_episodes(gen, tok, tasks, pool, EpisodeConfig(batch_size=2), thinking=True, samples=2)
    # round 1: add0/s0, add0/s1 (both solve at once); round 2: add1/s0, add1/s1 (first turn);
    # round 3: add1 x2 solve; round 4..6: add2 x2 take three turns.
    assert [len(call) for call in gen.calls] == [2, 2, 2, 2, 2, 2]
    assert [(ep.task.id, ep.sample) for ep in episodes] == [
        ("add0", 0), ("add0", 1), ("add1", 0), ("add1", 1), ("add2", 0), ("add2", 1)]
    assert all(ep.success for ep in episodes)


def test_skip_leaves_out_finished_pairs(tok, pool):
    gen = ScriptedGenerator({"TASK-ADD": [RIGHT]})
    episodes = run_episodes(gen, tok, [ADD], pool, EpisodeConfig(), thinking=True, samples=3,
                            skip={("add", 0), ("add", 2)})
    assert [(ep.task.id, ep.sample) for ep in episodes] == [("add", 1)]


def test_trace_records_authors_results_and_settings(tok, pool):
    _, (ep,) = _run(tok, pool, {"TASK-ADD": [WRONG_RUN, RIGHT]})
    trace = ep.to_trace({"model": "scripted"})
    trace.validate()
    meta = trace.meta
    assert (meta["task_id"], meta["sample"], meta["success"], meta["turns"], meta["feedback_turns"]) == ("add", 0, True, 2, 2)
    assert meta["observations"]["3"]["observation"]["exec"]["stdout"] == "-1\n"
    assert meta["observations"]["5"]["observation"]["grade"]["stage"] == "all_pass"
    assert meta["generation"] == {"model": "scripted"}
