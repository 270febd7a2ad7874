"""Bad input on the way to and inside the RL step's scoring: left out or no verdict, logged, survived."""

from __future__ import annotations

import json
import math

import pytest

from grpo_helpers import save_tiny_model, toy_config
from molrl.graders.grade import Grade
from molrl.rl.data import build_prompt_rows
from molrl.rl.score import score
from molrl.tasks import Task, TestCase
from molrl.tasks.toy import parse_checker_output

SQUARE = Task(id="sq", prompt="Return x squared.", kind="code", entry_point="sq",
              tests=[TestCase("call", args=[3], expected=9), TestCase("call", args=[-2], expected=4)])
SIX_BY_SEVEN = Task(id="m1", prompt="What is 6*7?", kind="math", answer="42")
GOOD_CODE = "```python\ndef sq(x):\n    return x * x\n```"


def test_rows_without_tests_or_answer_are_left_out_by_id(tiny_pair):
    _, tok = tiny_pair
    no_tests = Task(id="c-no-tests", prompt="p", kind="code", entry_point="f")
    no_answer = Task(id="m-no-answer", prompt="p", kind="math", answer="")
    rows, summary = build_prompt_rows([SQUARE, no_tests, SIX_BY_SEVEN, no_answer], tok, enable_thinking=False,
                                      max_prompt_length=10_000)
    assert [Task.from_json(r["task_json"]).id for r in rows] == ["sq", "m1"]
    assert summary.unscorable == ["c-no-tests", "m-no-answer"] and summary.kept == 2 and summary.tasks == 4


def test_prompts_over_the_limit_are_counted(tiny_pair):
    _, tok = tiny_pair
    long = Task(id="long", prompt="x" * 500, kind="math", answer="1")
    rows, summary = build_prompt_rows([SIX_BY_SEVEN, long], tok, enable_thinking=False, max_prompt_length=300)
    # byte-level tokenizer: the long prompt alone is 500+ tokens, the short one ~130 with the instruction
    assert summary.too_long == ["long"] and summary.kept == 1
    assert summary.longest_prompt_tokens == len(tok(rows[0]["prompt"])["input_ids"]) <= 300


def test_prompts_use_the_configured_instructions(tiny_pair):
    from molrl.traces.spans import render_prompts

    _, tok = tiny_pair
    templates = {"code_template": "Write `{entry_point}`: {prompt}", "math_template": "Q: {prompt}"}
    rows, _ = build_prompt_rows([SQUARE, SIX_BY_SEVEN], tok, enable_thinking=False, max_prompt_length=10_000, **templates)
    assert "Write `sq`: Return x squared." in rows[0]["prompt"] and "Q: What is 6*7?" in rows[1]["prompt"]
    # the same text evaluation renders with the same instructions, so training and evaluation agree
    assert [r["prompt"] for r in rows] == render_prompts(tok, [SQUARE, SIX_BY_SEVEN], enable_thinking=False, **templates)
    default, _ = build_prompt_rows([SIX_BY_SEVEN], tok, enable_thinking=False, max_prompt_length=10_000)
    assert "Please reason step by step" in default[0]["prompt"]


def test_a_raising_grader_fails_only_its_row(monkeypatch):
    def flaky(tasks, completions, pool=None, code=None):
        return [Grade(1 / 0 if "boom" in c else float(len(c)), True, "correct") for c in completions]

    monkeypatch.setattr("molrl.rl.score.grade", flaky)
    scores = score([SIX_BY_SEVEN] * 3, ["ab", "boom", "abc"])
    assert scores.rewards == [2.0, 0.0, 3.0]  # the batch failed, so rows were graded one by one
    assert scores.errors[0] is None and "ZeroDivisionError" in scores.errors[1]
    assert scores.stages == ["math/correct", "scoring_error", "math/correct"]
    assert scores.excluded == [None, "scoring_error", None] and scores.verdicts() == [True, False, True]


def test_a_task_of_unknown_kind_is_scored_as_failure_and_the_rest_normally():
    odd = Task(id="odd", prompt="?", kind="chess")  # type: ignore[arg-type]
    scores = score([SIX_BY_SEVEN, odd], ["\\boxed{42}", "e4"])
    assert scores.rewards == [1.0, 0.0] and scores.verdicts() == [True, False]
    assert scores.stages == ["math/correct", "scoring_error"] and "kind 'chess'" in scores.errors[1]


def test_non_finite_rewards_become_failures(monkeypatch):
    monkeypatch.setattr("molrl.rl.score.grade",
                        lambda tasks, completions, pool=None, code=None: [Grade(math.nan, False, "wrong"),
                                                                          Grade(0.5, False, "wrong")])
    scores = score([SIX_BY_SEVEN] * 2, ["a", "b"])
    assert scores.rewards == [0.0, 0.5] and scores.stages[0] == "scoring_error" and "non-finite" in scores.errors[0]
    assert scores.excluded == ["scoring_error", None]


class FailingJobBackend:
    """A sandbox backend that loses the job whose code mentions LOST (a worker dying mid-batch)."""

    name = "flaky"

    def __init__(self, inner):
        self.inner = inner

    def execute(self, jobs):
        outs = self.inner.execute(jobs)
        return [{"status": "sandbox_error", "error": "worker lost"} if "LOST" in job["code"] else out
                for job, out in zip(jobs, outs)]

    def close(self):
        self.inner.close()


def test_sandbox_failure_mid_batch_scores_that_row_and_the_rest_normally():
    from molrl.graders.code import CodeRewardConfig
    from molrl.sandbox import LocalBackend, SandboxConfig, SandboxPool

    cfg = SandboxConfig(workers=2, timeout_s=2.0)
    pool = SandboxPool(cfg, backend=FailingJobBackend(LocalBackend(cfg)))
    try:
        lost = "```python\ndef sq(x):\n    return x * x  # LOST\n```"
        hang = "```python\ndef sq(x):\n    while True:\n        pass\n```"
        completions = [GOOD_CODE, lost, hang, "so \\boxed{42}"]
        scores = score([SQUARE] * 3 + [SIX_BY_SEVEN], completions, pool, CodeRewardConfig(mode="binary"))
    finally:
        pool.close()
    assert scores.rewards == [1.0, 0.0, 0.0, 1.0]  # the hanging solution times out instead of hanging the batch
    assert scores.stages[:2] == ["code/all_pass", "code/sandbox_error"]
    # the lost row is no verdict; the timeout is the completion's own (a verdict of 0)
    assert scores.excluded == [None, "sandbox_error", None, None]
    assert "worker lost" in scores.errors[1] and scores.errors[0] is None
    assert scores.stages[3] == "math/correct"


def test_checker_output_is_parsed_outside_the_sandbox():
    assert parse_checker_output("3 4\n") == 0.75
    assert parse_checker_output("0 0") == 0.0
    with pytest.raises(ValueError):
        parse_checker_output("5 4")


def test_training_continues_when_the_grader_raises(tmp_path, monkeypatch):
    from molrl.rl.run import run_rl
    from molrl.tasks import toy

    calls = {"n": 0}
    real = toy.grade_toy

    def sometimes_raises(completions, pool):
        calls["n"] += 1
        if len(completions) == 1 and calls["n"] % 3 == 0:
            raise RuntimeError("grader crashed")
        if len(completions) > 1:
            raise RuntimeError("batch grader crashed")  # every batch falls back to row-by-row grading
        return real(completions, pool)

    monkeypatch.setattr(toy, "grade_toy", sometimes_raises)
    base = save_tiny_model(tmp_path / "base")
    out = run_rl(toy_config(tmp_path / "run", base, max_steps=2))
    rows = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    failed = [r for r in rows if r["reward_error"]]
    assert len(rows) == 16 and failed and len(failed) < 16
    assert all(r["rewards"]["correctness"] is None and "grader crashed" in r["reward_error"] for r in failed)
    assert all(r["reward_stage"] == "scoring_error" and r["excluded"] == "scoring_error" for r in failed)
    assert all(r["advantage"] == 0.0 for r in failed)  # no verdict: out of the loss and its group's statistics
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any(m.get("reward_stage/scoring_error", 0) > 0 for m in metrics)  # per-stage fractions, logged once
    assert (out / "adapter" / "adapter_config.json").is_file()
