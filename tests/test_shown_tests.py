"""No reward from a test the policy saw: shown tests feed the prompt and the episode, held-back tests the reward."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from types import SimpleNamespace

import pytest

from molrl.episode import EpisodeConfig
from molrl.episode.loop import open_episode
from molrl.content import encode_content
from molrl.graders.code import CodeRewardConfig
from molrl.rl.config import RlConfig, rl_sampling, rl_train
from molrl.rl.data import build_prompt_rows
from molrl.rl.rollouts.turns import Turns
from molrl.rl.score import score
from molrl.sandbox import SandboxConfig, SandboxPool
from molrl.tasks import Task, load_tasks
from molrl.tasks.grade import grade
from molrl.tasks.held_out import (episode_tasks, held_back_indices, shows_tests, split_outcome, split_reason,
                                  split_tests)
from molrl.tasks.prompts import user_message
from molrl.task_types import TestCase
from molrl.tiny import build_tiny_tokenizer

FAILED = re.compile(r"^- (\w+)\((.*)\) returned None, expected (.*)$", re.M)
ASSERT = re.compile(r"^assert (\w+)\((.*)\) ?== ?(.*?)(?:<\|im_end\|>)?$", re.M)


def _task(values, source=None):
    tests = [TestCase("call", [v], v * v) for v in values]
    return Task(id="sq", prompt="?", kind="code", entry_point="sq", tests=tests,
                meta={"source": source} if source else {})


def test_tests_split_first_half_shown_rest_held_back():
    shown, held = split_tests(_task(range(5)))
    assert [t.args for t in shown.tests] == [[0], [1]]  # 5 // 2 = 2 shown
    assert [t.args for t in held.tests] == [[2], [3], [4]]  # the other 3 decide the reward
    with pytest.raises(ValueError, match="task sq: code task has 1 distinct test"):
        split_tests(_task([7]))
    math = Task(id="m", prompt="?", kind="math", answer="4")
    assert split_tests(math) == (math, math)  # feedback on a wrong answer never states the right one


@pytest.mark.parametrize("values,held", [
    ([1, 2, 3], [1, 2]), ([1, 1, 3], [2]), ([1, 3, 1], [1]), ([1, 1, 1], []), ([1], []), ([1, 2], [1]),
    ([1, 2, 1, 2], []), ([1, 2, 2, 3], [3]), ([], []),
])
def test_a_held_back_test_that_repeats_a_shown_one_is_not_held_back(values, held):
    task = _task(values)
    assert held_back_indices(task) == held
    assert (split_reason(task) is None) == bool(held)


def test_mbpp_holds_back_two_tests_but_task_37_none_and_four_tasks_one(shared_data):
    tasks = load_tasks(shared_data / "mbpp/mbpp.jsonl", "mbpp")
    held = {t.id: len(held_back_indices(t)) for t in tasks}
    assert [i for i, n in held.items() if n == 0] == ["37"]  # its three asserts are one assert, three times
    assert sorted(i for i, n in held.items() if n == 1) == ["337", "508", "713", "862"]
    assert sum(n == 2 for n in held.values()) == 974 - 5


def test_humaneval_holds_none_back_only_where_it_has_one_test(shared_data):
    tasks = load_tasks(shared_data / "humaneval/HumanEval.jsonl.gz", "humaneval")
    none = [t for t in tasks if not held_back_indices(t)]
    assert len(none) == 23 and all(len(t.tests) == 1 for t in none)


def test_only_episodes_that_grade_before_their_last_answer_show_tests():
    assert not shows_tests(1, EpisodeConfig(max_solutions=2, tests_on_execute=True))  # single turn: no feedback
    assert not shows_tests(3, EpisodeConfig(max_solutions=1))
    assert shows_tests(3, EpisodeConfig(max_solutions=2))
    assert shows_tests(3, EpisodeConfig(max_solutions=1, tests_on_execute=True))


def test_verdict_is_held_back_wherever_the_policy_sees_shown_tests():
    plain, listed = _task([1, 2, 3, 4]), _task([1, 2, 3, 4], source="mbpp")
    for task, feedback, held in [(plain, False, False), (plain, True, True), (listed, False, True), (listed, True, True)]:
        episode, graded, flag = episode_tasks(task, feedback)
        assert flag == held
        assert [t.args for t in graded.tests] == ([[3], [4]] if held else [[1], [2], [3], [4]])
        assert [t.args for t in episode.tests] == ([[1], [2]] if held else [[1], [2], [3], [4]])
    one = _task([5], source="mbpp")  # nothing to hold back: graded on all its tests, flagged
    assert episode_tasks(one, True) == (one, one, False)


def test_split_outcome_reads_the_shown_and_held_back_tests_apart():
    task = _task([1, 2, 2, 3])  # shown 1, 2; the repeat of 2 is shown too; held back: 3
    grade = SimpleNamespace(details={"tests": [{"index": 0, "passed": True}, {"index": 1, "passed": True},
                                               {"index": 2, "passed": False}]})  # no outcome for test 3: failed
    assert split_outcome(task, grade) == (True, False)
    assert split_outcome(_task([4]), grade) == (None, None)


def test_tasks_that_cannot_hold_a_test_back_are_left_out_with_their_reason():
    tok = build_tiny_tokenizer("chatml")
    one = Task(id="one", prompt="p", kind="code", entry_point="f", tests=[TestCase("call", [1], 1)])
    two = Task(id="two", prompt="p", kind="code", entry_point="f", tests=[TestCase("call", [1], 1), TestCase("call", [2], 2)])
    repeat = Task(id="repeat", prompt="p", kind="code", entry_point="f", tests=[TestCase("call", [1], 1)] * 3)
    rows, summary = build_prompt_rows([one, two, repeat], tok, enable_thinking=False, max_prompt_length=4096,
                                      hold_back_tests=True)
    assert [Task.from_json(r["task_json"]).id for r in rows] == ["two"] and summary.unscorable == ["one", "repeat"]
    assert [t.args for t in Task.from_json(rows[0]["task_json"]).tests] == [[2]]  # the reward's: held back
    assert [t.args for t in Task.from_json(rows[0]["episode_json"]).tests] == [[1]]  # the episode's: shown
    rows, _ = build_prompt_rows([one, two, repeat], tok, enable_thinking=False, max_prompt_length=4096)
    assert len(rows) == 3  # single turn, a prompt that lists no test: every test grades, none was shown


def _table(name, pairs):
    lines = [f"    if args == ({args},):\n        return {expected}" for args, expected in pairs]
    return f"def {name}(*args):\n" + "\n".join(lines) + "\n    return None"


def _mbpp_tables(shared_data, n=20):
    """The first ``n`` MBPP training tasks whose asserts are all ``f(args) == value``."""
    tasks = load_tasks(shared_data / "mbpp/mbpp.jsonl", "mbpp", split="train")
    return [t for t in tasks if len(ASSERT.findall(t.prompt)) == 1 and len(held_back_indices(t)) == 2][:n]


def test_finding1_no_prompt_shows_a_held_back_test(shared_data):
    path = shared_data / "mbpp/mbpp.jsonl"
    raw = {str(r["task_id"]): r["test_list"] for r in map(json.loads, path.read_text().splitlines())}
    tok = build_tiny_tokenizer("chatml")
    for task in load_tasks(path, "mbpp"):
        shown, *rest = raw[task.id]
        opening = "\n".join(m["content"] for m in open_episode(task, 0, EpisodeConfig()).messages)
        for text in (task.prompt, user_message(task), opening):  # the task, single-turn RL's prompt, an episode's
            assert shown in text and len(re.findall(r"^assert\b", text, re.M)) == 1, task.id
            assert not [t for t in rest if t != shown and t in text], task.id  # held back: never in a prompt
    rows, _ = build_prompt_rows(load_tasks(path, "mbpp", limit=3), tok, enable_thinking=False, max_prompt_length=8192)
    assert "== 12" not in rows[0]["prompt"] and "== 16" not in rows[0]["prompt"]  # task 1's tests 2 and 3


def test_finding1_single_turn_a_lookup_table_of_the_prompt_earns_no_reward(shared_data):
    tok = build_tiny_tokenizer("chatml")
    tasks = _mbpp_tables(shared_data)
    rows, _ = build_prompt_rows(tasks, tok, enable_thinking=False, max_prompt_length=8192)
    answers = [f"```python\n{_table(t.entry_point, [(a, e) for _, a, e in ASSERT.findall(r['prompt'])])}\n```"
               for t, r in zip(tasks, rows)]
    with SandboxPool(SandboxConfig(workers=2, timeout_s=10)) as pool:
        # the table passes the test the prompt showed...
        grades = grade(tasks, answers, pool)
        passed = [i for i, (t, g) in enumerate(zip(tasks, grades)) if split_outcome(t, g)[0]]
        assert len(passed) >= 15
        rewards = score([Task.from_json(rows[i]["task_json"]) for i in passed], [answers[i] for i in passed], pool,
                        CodeRewardConfig(mode="binary"))
    assert rewards.rewards == [0.0] * len(passed)  # ...and earns nothing: the reward grades the tests it never saw


class LookupTablePolicy(Turns):
    """The attack: submit a table of the prompt's asserts, then of the expected values the feedback listed."""

    def generate(self, sequences, budgets):
        tok = self.trainer.processing_class
        turns = []
        for ids in sequences:
            text = tok.decode(ids)
            name = re.search(r"function `(\w+)`", text).group(1)
            pairs = [(a, e) for _, a, e in ASSERT.findall(text)] + [(a, e) for _, a, e in FAILED.findall(text)]
            turns.append(encode_content(tok, f"<solution>\n```python\n{_table(name, pairs)}\n```\n</solution>")[0] +
                         [tok.eos_token_id])
        return turns, [False] * len(sequences), [None] * len(sequences)

    def to_batch(self, inputs, prompt_lists, completion_lists, completions, sampler_lists, behaviour=None,
                 roles=None):
        return _Graded(([Task.from_json(x["task_json"]) for x in inputs], completions))  # what the reward grades


class _Graded(tuple):
    """What the fake ``to_batch`` hands back: the tasks and answers the reward grades, with room for the rollout's
    ``records`` as a batch has."""


def test_finding1_multi_turn_a_lookup_table_of_prompt_and_feedback_earns_no_reward(shared_data):
    tok = build_tiny_tokenizer("chatml")
    cfg = RlConfig(sampling=rl_sampling(n=2, max_new_tokens=6000), train=rl_train(micro_batch_size=2))
    cfg.episode.max_turns, cfg.episode.max_solutions = 3, 2
    tasks = _mbpp_tables(shared_data)
    rows, _ = build_prompt_rows(tasks, tok, enable_thinking=False, max_prompt_length=8192,
                                hold_back_tests=shows_tests(cfg.episode.max_turns, cfg.episode))
    with SandboxPool(SandboxConfig(workers=2, timeout_s=10)) as pool:
        metrics = defaultdict(list)
        trainer = SimpleNamespace(processing_class=tok, eos_token_ids=[tok.eos_token_id],
                                  scorer=SimpleNamespace(pool=pool), metrics=lambda: metrics,
                                  state=SimpleNamespace(num_input_tokens_seen=0), engine=None)
        graded, answers = LookupTablePolicy(trainer, cfg).rollout(rows)
        rewards = score(graded, answers, pool, CodeRewardConfig(mode="binary")).rewards
    assert metrics["turns/stop_solved"][0] >= 0.75  # the episodes "solved" the tests they were shown...
    assert rewards == [0.0] * len(tasks)  # ...and the held-back tests give the table nothing


def test_a_test_repeats_another_only_with_the_same_types():
    ones = [TestCase("call", [1], True), TestCase("call", [True], 1), TestCase("call", [1.0], True)]
    task = Task(id="t", prompt="?", kind="code", entry_point="f", tests=[ones[0], *ones])
    assert held_back_indices(task) == [2, 3]  # 1 == True == 1.0 in Python, but f(True) is another test than f(1)
