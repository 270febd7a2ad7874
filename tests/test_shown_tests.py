"""No reward from a test the episode's feedback showed: shown tests feed the episode, held-back tests the reward."""

from __future__ import annotations

import re
from collections import defaultdict
from types import SimpleNamespace

import pytest

from molrl.collect import EpisodeConfig
from molrl.graders.code import CodeRewardConfig
from molrl.content import encode_content
from molrl.rl.config import RlConfig, TrainSettings
from molrl.rl.data import build_prompt_rows
from molrl.rl.rollouts.turns import Turns
from molrl.rl.score import score
from molrl.sandbox import SandboxConfig, SandboxPool
from molrl.tasks import Task, load_tasks
from molrl.tasks.held_out import shows_tests, split_tests
from molrl.tasks.types import TestCase
from molrl.tiny import build_tiny_tokenizer

FAILED = re.compile(r"^- (\w+)\((.*)\) returned None, expected (.*)$", re.M)


def test_tests_split_first_half_shown_rest_held_back():
    tests = [TestCase("call", [i], i * i) for i in range(5)]
    task = Task(id="sq", prompt="?", kind="code", entry_point="sq", tests=tests)
    shown, held = split_tests(task)
    assert [t.args for t in shown.tests] == [[0], [1]]  # 5 // 2 = 2 shown
    assert [t.args for t in held.tests] == [[2], [3], [4]]  # the other 3 decide the reward
    with pytest.raises(ValueError, match="task one: code task has 1 test"):
        split_tests(Task(id="one", prompt="?", kind="code", entry_point="f", tests=tests[:1]))
    math = Task(id="m", prompt="?", kind="math", answer="4")
    assert split_tests(math) == (math, math)  # feedback on a wrong answer never states the right one


def test_only_episodes_that_grade_before_their_last_answer_show_tests():
    assert not shows_tests(1, EpisodeConfig(max_solutions=2, tests_on_execute=True))  # single turn: no feedback
    assert not shows_tests(3, EpisodeConfig(max_solutions=1))
    assert shows_tests(3, EpisodeConfig(max_solutions=2))
    assert shows_tests(3, EpisodeConfig(max_solutions=1, tests_on_execute=True))


def test_tasks_that_cannot_hold_a_test_back_are_left_out_with_their_reason():
    tok = build_tiny_tokenizer("chatml")
    one = Task(id="one", prompt="p", kind="code", entry_point="f", tests=[TestCase("call", [1], 1)])
    two = Task(id="two", prompt="p", kind="code", entry_point="f", tests=[TestCase("call", [1], 1)] * 2)
    rows, summary = build_prompt_rows([one, two], tok, enable_thinking=False, max_prompt_length=4096,
                                      hold_back_tests=True)
    assert [Task.from_json(r["task_json"]).id for r in rows] == ["two"] and summary.unscorable == ["one"]
    rows, _ = build_prompt_rows([one, two], tok, enable_thinking=False, max_prompt_length=4096)
    assert len(rows) == 2


class LookupTablePolicy(Turns):
    """The attack: submit ``return None``, then a lookup table of the expected values the feedback listed."""

    def generate(self, sequences, budgets):
        tok = self.trainer.processing_class
        turns = []
        for ids in sequences:
            text = tok.decode(ids)
            shown = FAILED.findall(text[text.rfind("<tool_response>"):]) if "<tool_response>" in text else []
            name = re.search(r"function `(\w+)`", text).group(1)
            if not shown:
                code = f"def {name}(*args):\n    return None"
            else:
                lines = [f"    if args == ({args},):\n        return {expected}" for _, args, expected in shown]
                code = f"def {name}(*args):\n" + "\n".join(lines) + "\n    return None"
            turns.append(encode_content(tok, f"<solution>\n```python\n{code}\n```\n</solution>")[0] +
                         [tok.eos_token_id])
        return turns, [False] * len(sequences)

    def to_batch(self, inputs, prompt_lists, completion_lists, completions, sampler_lists, behaviour=None,
                 roles=None):
        return [Task.from_json(x["task_json"]) for x in inputs], completions  # what the reward grades


def hack_rewards(tasks, hold_back: bool):
    tok = build_tiny_tokenizer("chatml")
    cfg = RlConfig(num_generations=2, train=TrainSettings(micro_batch_size=2))
    cfg.rollout.turns, cfg.rollout.episode.max_solutions = 3, 2
    with SandboxPool(SandboxConfig(workers=2, timeout_s=10)) as pool:
        metrics = defaultdict(list)
        trainer = SimpleNamespace(processing_class=tok, eos_token_ids=[tok.eos_token_id], max_completion_length=6000,
                                  num_generations=2, scorer=SimpleNamespace(pool=pool), metrics=lambda: metrics,
                                  state=SimpleNamespace(num_input_tokens_seen=0))
        policy = LookupTablePolicy(trainer, cfg)
        assert policy.hold_back  # max_solutions=2 shows test outcomes
        policy.hold_back = hold_back
        graded, answers = policy.rollout([{"task_json": t.to_json()} for t in tasks])
        return score(graded, answers, pool, CodeRewardConfig(mode="binary")).rewards, metrics  # 1: all tests pass


def test_a_lookup_table_of_shown_tests_earns_no_reward(shared_data):
    tasks = load_tasks(shared_data / "mbpp/mbpp.jsonl", "mbpp", limit=20)
    # the attack is real: graded on the tests the feedback showed (as before), every task scores 1.0 unsolved
    shown_rewards, _ = hack_rewards(tasks, hold_back=False)
    assert shown_rewards == [1.0] * 20
    # graded on the held-back tests, the table earns nothing, though the episodes "solved" their shown tests
    held_rewards, metrics = hack_rewards(tasks, hold_back=True)
    assert held_rewards == [0.0] * 20
    assert metrics["turns/stop_solved"] == [1.0]
