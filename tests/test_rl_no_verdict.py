"""A row whose grading failed is no verdict: RL leaves it out of its group's statistics and out of the loss, for
every algorithm, marks it in completions.jsonl, and stops a run whose sandbox fails past sandbox.max_error_rate."""

from __future__ import annotations

import json
import math

import pytest
import torch

from failing_sandbox import LOST, fail_every
from grpo_helpers import loss_inputs, save_tiny_model, toy_config
from molrl.errors import MolrlError
from molrl.graders.grade import Grade
from molrl.rl.algorithms.names import ENTRIES
from molrl.rl.batch import LossInputs, RolloutBatch
from molrl.rl.groups import group_advantages, group_stats, zero_std_fraction
from molrl.rl.loss import AGGREGATORS, PolicyLossSettings, policy_loss
from molrl.rl.method_settings import PpoSettings
from molrl.rl.score import exclusion, score
from molrl.tasks import Task

T, F = True, False


# --- a group's statistics over its verdict rows, closed form ----------------------------------------------------

def test_a_failed_row_is_left_out_of_its_groups_mean_and_std():
    # one group of G = 4; the verdict rows' rewards are 1, 0, 0.5: mean 0.5, sample std sqrt((0.25 + 0.25 + 0) / 2)
    # = 0.5; the failed row's 7 is never read, and its advantage is 0
    rewards, verdicts = torch.tensor([1.0, 0.0, 0.5, 7.0]), torch.tensor([T, T, T, F])
    torch.testing.assert_close(group_advantages(rewards, verdicts, 4, scale=False), torch.tensor([0.5, -0.5, 0.0, 0.0]))
    torch.testing.assert_close(group_advantages(rewards, verdicts, 4, scale=True),
                               torch.tensor([0.5 / 0.5001, -0.5 / 0.5001, 0.0, 0.0]))


def test_a_failed_rows_reward_is_never_read():
    verdicts = torch.tensor([T, T, T, F])
    expected = group_advantages(torch.tensor([1.0, 0.0, 0.5, 0.0]), verdicts, 4, scale=True)
    for unread in (math.nan, math.inf, -1e9):
        got = group_advantages(torch.tensor([1.0, 0.0, 0.5, unread]), verdicts, 4, scale=True)
        assert torch.equal(got, expected)


def test_a_group_left_with_fewer_than_two_verdicts_contributes_nothing():
    # groups of G = 2: [1 | failed] has one verdict, [failed | failed] none; neither carries a signal, and no NaN
    rewards, verdicts = torch.tensor([1.0, 0.0, 0.3, 0.9]), torch.tensor([T, F, F, F])
    for scale in (False, True):
        assert group_advantages(rewards, verdicts, 2, scale).tolist() == [0.0] * 4
    stats = group_stats(rewards, verdicts, 2)
    assert stats.mean.tolist() == [1.0, 1.0, 0.0, 0.0] and stats.std.tolist() == [0.0] * 4
    assert stats.count.tolist() == [1.0, 1.0, 0.0, 0.0] and stats.signal().tolist() == [F, F, F, F]


def test_with_every_row_a_verdict_the_statistics_are_the_plain_group_mean_and_sample_std():
    rewards = torch.tensor([0.1, 0.7, 0.2, 1.0, 0.0, 0.0, 0.4, 0.9, 0.3])  # three groups of 3
    grouped = rewards.view(3, 3)
    stats = group_stats(rewards, torch.ones(9, dtype=torch.bool), 3)
    torch.testing.assert_close(stats.mean, grouped.mean(1).repeat_interleave(3))
    torch.testing.assert_close(stats.std, grouped.std(1).repeat_interleave(3))


def test_a_group_with_one_verdict_counts_as_one_without_signal():
    every = torch.ones(4, dtype=torch.bool)
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.2])
    assert zero_std_fraction(rewards, every, 2) == 0.0
    assert zero_std_fraction(rewards, torch.tensor([T, F, T, T]), 2) == 0.5  # [1 | failed]: no signal
    assert zero_std_fraction(torch.tensor([1.0, 0.0, 0.5, 0.5]), torch.tensor([T, T, T, T]), 2) == 0.5  # a tie


# --- which rows are no verdict -----------------------------------------------------------------------------------

@pytest.mark.parametrize("stage, error, stop, why", [
    ("all_pass", None, None, None),
    ("runtime_error", None, None, None),  # the completion's own failure is a verdict
    ("sandbox_error", "worker lost", None, "sandbox_error"),
    ("grader_error", "math worker died", None, "grader_error"),
    (None, "ZeroDivisionError: division by zero", None, "scoring_error"),  # grading raised
    ("wrong", "non-finite reward nan", None, "scoring_error"),
    ("correct", None, "sandbox_error", "sandbox_error"),  # the sandbox stopped the episode before its last answer
    ("correct", None, "max_turns", None),
])
def test_the_one_rule(stage, error, stop, why):
    assert exclusion(stage, error, stop) == why


def test_a_multi_turn_row_the_sandbox_stopped_is_no_verdict_whatever_its_answers_grade(monkeypatch):
    monkeypatch.setattr("molrl.rl.score.grade", lambda tasks, completions, pool=None, code=None:
                        [Grade(1.0, True, "correct")] * len(completions))
    task = Task(id="m", prompt="6*7?", kind="math", answer="42")
    scores = score([task] * 3, ["42"] * 3, stop_reasons=["solved", "sandbox_error", None])
    assert scores.excluded == [None, "sandbox_error", None] and scores.verdicts() == [T, F, T]
    assert scores.stages == ["math/correct"] * 3 and scores.errors == [None] * 3


# --- the loss ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("aggregation", list(AGGREGATORS))
def test_a_failed_rows_gradient_is_exactly_zero_and_the_loss_is_the_one_without_it(aggregation):
    # rows 0 and 2 are verdicts, row 1 failed: its loss mask is all 0 (RolloutBatch.leave_out) and it is no completion
    # of the step; its advantage is left at -2 to show the masks alone keep it out, the KL term included
    logps = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -0.8], [-1.5, -1.0, -1.0]], requires_grad=True)
    reference = torch.tensor([[-0.7, -2.2, -0.4], [-0.1, -1.0, -0.9], [-1.3, -1.1, -1.0]])
    mask = torch.tensor([[1.0, 1, 0], [0, 0, 0], [1, 0, 0]])
    adv = torch.tensor([[1.0, 1.0, 0.0], [-2.0, -2.0, -2.0], [0.5, 0.0, 0.0]])
    settings = PolicyLossSettings(aggregation, 3, beta=0.1)
    whole = loss_inputs(adv, mask, reference=reference)
    whole.verdict_mask = torch.tensor([[1.0], [0.0], [1.0]])
    loss = policy_loss(logps, whole, settings).loss
    loss.backward()
    kept_logps = logps.detach()[[0, 2]].clone().requires_grad_(True)
    kept = policy_loss(kept_logps, loss_inputs(adv[[0, 2]], mask[[0, 2]], reference=reference[[0, 2]]), settings).loss
    kept.backward()
    assert loss.item() == kept.item()
    assert logps.grad[1].tolist() == [0.0, 0.0, 0.0]
    torch.testing.assert_close(logps.grad[[0, 2]], kept_logps.grad)


def test_constant_aggregation_divides_by_the_verdict_rows_only():
    # on-policy, no KL: token losses -A; -(1 * 2 + 0.5 * 1) / (2 verdict rows * T_max 3) = -2.5 / 6
    logps = torch.zeros(3, 3)
    mask = torch.tensor([[1.0, 1, 0], [0, 0, 0], [1, 0, 0]])
    inputs = loss_inputs(torch.tensor([[1.0, 1, 0], [-2, -2, -2], [0.5, 0, 0]]), mask)
    inputs.verdict_mask = torch.tensor([[1.0], [0.0], [1.0]])
    assert policy_loss(logps, inputs, PolicyLossSettings("constant", 3)).loss.item() == pytest.approx(-2.5 / 6)


def test_leave_out_takes_a_rows_loss_and_feedback_tokens_and_leaves_attention():
    mask = torch.tensor([[1, 1, 0, 1], [1, 0, 1, 1]])
    feedback = torch.tensor([[0, 0, 1, 0], [0, 1, 0, 0]])
    attention = torch.ones(2, 4, dtype=torch.long)
    batch = RolloutBatch(torch.ones(2, 1), torch.ones(2, 1), torch.zeros(2, 4), mask, None, None, None, [], [], [],
                         torch.ones(2, dtype=torch.bool), attention_mask=attention, feedback_mask=feedback)
    batch.leave_out(torch.tensor([T, F]))
    assert batch.completion_mask.tolist() == [[1, 1, 0, 1], [0, 0, 0, 0]]
    assert batch.feedback_mask.tolist() == [[0, 0, 1, 0], [0, 0, 0, 0]]
    assert batch.attention().tolist() == attention.tolist()
    single = RolloutBatch(torch.ones(2, 1), torch.ones(2, 1), torch.zeros(2, 4), mask, None, None, None, [], [], [],
                          torch.ones(2, dtype=torch.bool))
    single.leave_out(torch.tensor([F, T]))
    assert single.completion_mask.tolist() == [[0, 0, 0, 0], [1, 0, 1, 1]]
    assert single.attention().tolist() == mask.tolist()  # single-turn: attention still sees the row as sampled


# --- every algorithm, through the trainer ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("no_verdict") / "base", eos_logit=2.0)


def _loss_and_grads(trainer, inputs: LossInputs) -> tuple[float, dict[str, torch.Tensor]]:
    model = trainer.model
    model.zero_grad()
    loss = trainer._compute_loss(model, inputs.to_dict())
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("algorithm", list(ENTRIES))
def test_every_algorithm_trains_nothing_on_a_row_the_sandbox_failed(tmp_path, monkeypatch, base, algorithm):
    from molrl.rl.run import build_trainer

    fail_every(monkeypatch, 4)  # the toy task's checker runs once per row: 2 of the step's 8 rows fail
    torch.manual_seed(0)
    shared = {"ppo": PpoSettings(critic="shared")} if algorithm == "ppo" else {}  # a value loss beside the policy's
    cfg = toy_config(tmp_path / "run", base, algorithm=algorithm, max_steps=1, max_new_tokens=6, **shared)
    trainer, _, pool = build_trainer(cfg)
    try:
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = trainer.args.steps_per_generation  # the step is this batch
        inputs = trainer.step([trainer.train_dataset[0]] * 8)
    finally:
        pool.close()
    failed = inputs.verdict_mask[:, 0] == 0
    assert failed.sum().item() == 2 and trainer.sandbox_errors.errors == 2
    assert (inputs.completion_mask[failed] == 0).all() and (inputs.advantages[failed] == 0).all()
    assert inputs.counts().completions.item() == 6
    whole_loss, whole = _loss_and_grads(trainer, inputs)
    kept = LossInputs.from_dict({k: v[~failed] for k, v in inputs.to_dict().items() if v.dim() > 0})
    kept_loss, without = _loss_and_grads(trainer, kept.counted(trainer.accelerator.gather))
    assert whole_loss == pytest.approx(kept_loss, rel=1e-5, abs=1e-7)
    assert whole.keys() == without.keys() and whole
    for name, grad in whole.items():
        torch.testing.assert_close(grad, without[name], rtol=1e-4, atol=1e-7)


# --- a run ----------------------------------------------------------------------------------------------------------

def test_a_run_keeps_and_marks_each_failed_row_and_logs_the_share(tmp_path, monkeypatch, base):
    from molrl.rl.run import run_rl

    fail_every(monkeypatch, 4)
    out = run_rl(toy_config(tmp_path / "run", base, max_steps=1, max_new_tokens=6))
    rows = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    failed = [r for r in rows if r["excluded"]]
    assert len(rows) == 8 and 1 <= len(failed) <= 2  # every 4th distinct job of the 8 fails; nothing is dropped
    assert failed == [r for r in rows if r["reward_stage"] == "toy/sandbox_error"]
    assert all(r["excluded"] == "sandbox_error" for r in failed)
    assert all(r["rewards"]["correctness"] is None and r["advantage"] == 0.0 and LOST in r["reward_error"]
               for r in failed)
    assert all(r["rewards"]["correctness"] is not None for r in rows if not r["excluded"])
    (step,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "reward" in line]
    assert step["reward/sandbox_error_rate"] == step["reward_stage/toy/sandbox_error"] == len(failed) / 8
    judged = [r["rewards"]["correctness"] for r in rows if not r["excluded"]]
    assert step["reward"] == pytest.approx(sum(judged) / len(judged), abs=1e-6)  # the mean of the verdicts alone


def test_a_run_whose_sandbox_fails_past_the_limit_stops_in_one_line(tmp_path, monkeypatch, base):
    from molrl.rl.run import run_rl

    fail_every(monkeypatch, 1)  # every execution fails
    cfg = toy_config(tmp_path / "run", base, max_steps=3, max_new_tokens=4, prompts_per_step=4)  # 32 rows a step
    with pytest.raises(MolrlError, match=r"^rl: 32 of 32 graded rows \(100.0%\) were sandbox errors, past "
                                         r"sandbox.max_error_rate=0.1"):
        run_rl(cfg)
    rows = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert len(rows) == 32 and {r["excluded"] for r in rows} == {"sandbox_error"}  # logged before the stop
    assert not (tmp_path / "run" / "adapter").exists()


def test_the_failure_reward_key_is_gone_and_a_value_other_than_its_old_default_is_refused():
    from molrl.config import load_config
    from molrl.errors import ConfigError
    from molrl.rl.config import RlConfig

    assert load_config(RlConfig, None, ["reward.failure_reward=0"]).reward.code_mode == "staged"  # a saved run loads
    with pytest.raises(ConfigError, match=r"reward.failure_reward=-1: a completion whose scoring failed .* has no "
                                          r"reward: it is left out of the loss; remove it"):
        load_config(RlConfig, None, ["reward.failure_reward=-1"])
