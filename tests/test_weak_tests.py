"""Tasks whose held-back tests a constant return passes: flagged by their tests, counted, left out of RL rewards."""

from __future__ import annotations

import logging
import re
from collections import Counter

import pytest

from molrl.rl.data import build_prompt_rows
from molrl.task_types import Task, TestCase
from molrl.tasks import load_tasks
from molrl.tasks.held_out import constant_answer


def _task(expected: list, kinds: str = "ccc", task_id: str = "t") -> Task:
    tests = [TestCase("call", args=[i], expected=v) if k == "c" else TestCase("assert", source=f"assert f({i}) == {v!r}")
             for i, (v, k) in enumerate(zip(expected, kinds))]
    return Task(id=task_id, prompt="", kind="code", entry_point="f", tests=tests, meta={"source": "mbpp"})


@pytest.mark.parametrize("expected, kinds, flagged", [
    ([5, 5, 5], "ccc", True),  # MBPP 667's shape: every test expects the shown value
    ([[1, 2], [1, 2], [1, 2]], "ccc", True),
    ([True, True, True, True], "cccc", True),  # shown 2, held back 2: all one value, shown
    ([5, 6, 5], "ccc", False),  # two values held back
    ([4, 5, 5], "ccc", False),  # one value held back, never shown: nothing to copy
    ([5, 5, 5], "cca", False),  # an assert test held back: its expected value is not read
    ([1, 1.0, 1.0], "ccc", False),  # 1 and 1.0 are other values (exact types)
    ([5], "c", False),  # holds nothing back: the other flag
])
def test_a_constant_return_of_the_shown_value_is_decided_by_the_tests(expected, kinds, flagged):
    assert constant_answer(_task(expected, kinds)) is flagged


def test_real_mbpp_tasks_that_pay_for_copying_the_shown_value_are_flagged(shared_data):
    tasks = load_tasks(shared_data / "mbpp/mbpp.jsonl", "mbpp")
    flagged = [t for t in tasks if constant_answer(t)]
    assert {"667", "674", "816", "899"} <= {t.id for t in flagged}
    assert Counter(t.split for t in flagged) == {"train": 4, "test": 2}  # 203 and 339 in the test split
    humaneval = load_tasks(shared_data / "humaneval/HumanEval.jsonl.gz", "humaneval")
    assert sorted(t.id for t in humaneval if constant_answer(t)) == ["HumanEval/127", "HumanEval/134"]


def test_rl_leaves_them_out_by_default_naming_the_count_and_keeps_them_when_asked(shared_data, qwen3_tokenizer, caplog):
    train = load_tasks(shared_data / "mbpp/mbpp.jsonl", "mbpp", split="train")
    tasks = train[:40] + [t for t in train if t.id in ("667", "674")]  # the first 40 hold none of the flagged
    with caplog.at_level(logging.WARNING, logger="molrl.rl.data"):
        rows, summary = build_prompt_rows(tasks, qwen3_tokenizer, enable_thinking=False, max_prompt_length=4096)
    assert summary.constant_answer == ["667", "674"] and summary.kept == len(tasks) - 2
    lines = [r.getMessage() for r in caplog.records if "constant return" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(f"2 of {len(tasks)} tasks left out") and "667, 674" in lines[0]
    rows, summary = build_prompt_rows(tasks, qwen3_tokenizer, enable_thinking=False, max_prompt_length=4096,
                                      keep_constant_answer=True)
    assert summary.constant_answer == [] and summary.kept == len(tasks)


EXPECTED = re.compile(r"returned None, expected (.*)$", re.M)


class CopyingPolicy:
    """The attack on a task that holds nothing back: submit ``return None``, then return what the feedback expected."""

    def generate(self, prompts, sampling):
        out = []
        for prompt in prompts:
            name = re.search(r"function `(\w+)`", prompt).group(1)
            seen = EXPECTED.findall(prompt)
            value = seen[-1].replace("<|im_end|>", "").strip() if seen else "None"
            out.append([f"<solution>\n```python\ndef {name}(*args):\n    return {value}\n```\n</solution>"])
        return out


def test_humaneval_34_a_verdict_on_tests_the_feedback_showed_is_scored_apart(shared_data):
    from molrl.episode import EpisodeConfig
    from molrl.episode.loop import run_episodes
    from molrl.eval.interactive import episode_record
    from molrl.eval.report import held_back_notes
    from molrl.eval.single import summarise
    from molrl.sandbox import SandboxConfig, SandboxPool
    from molrl.tiny import build_tiny_tokenizer

    tasks = {t.id: t for t in load_tasks(shared_data / "humaneval/HumanEval.jsonl.gz", "humaneval")}
    tasks = [tasks["HumanEval/34"], tasks["HumanEval/0"]]  # 34 holds its one test back from nothing; 0 holds 4 back
    with SandboxPool(SandboxConfig(workers=2, timeout_s=10)) as pool:
        episodes = run_episodes(CopyingPolicy(), build_tiny_tokenizer("chatml"), tasks, pool,
                                EpisodeConfig(max_turns=3, max_solutions=2), thinking=False)
    copied, other = sorted(episodes, key=lambda ep: ep.task.id != "HumanEval/34")
    assert copied.verdict is True and copied.stop_reason == "solved"  # the copy passes the test the feedback showed
    assert copied.unsplit and not copied.success  # ...and is no success: collect's label
    assert copied.to_trace({}).meta["success"] is False and copied.to_trace({}).meta["unsplit"] is True
    assert not other.unsplit and not other.success  # the copy fails the tests held back
    records = [[episode_record(copied)], [episode_record(other)]]
    assert records[0][0].correct is False and records[0][0].shown_pass is True
    m = summarise(tasks, records, [1])
    assert (m["problems"], m["pass@1"], m["unsplit"], m["unsplit_pass@1"]) == (1, 0.0, 1, 1.0)  # before: 2, 0.5
    assert "left out of pass@1, scored apart (unsplit_pass@1 1.000)" in held_back_notes({"humaneval": m})[0]
