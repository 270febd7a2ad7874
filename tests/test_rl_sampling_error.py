"""``rollout.sampling_error`` read from the loss's own log-probs: the value the old extra forward pass gave, without it.

TRL shuffles a generation batch's rows before splitting it into micro-batches, so a prompt's group reaches the
loss in pieces; the metric puts the pieces back in the batch's order (``LossInputs.row_index``) and is logged once
every row is in. Each run here is a short toy run of the tiny model, 16 rows sampled a step, in 4 micro-batches.
"""

from __future__ import annotations

import pytest
import torch

from grpo_helpers import save_tiny_model, toy_config
from molrl.rl.batch import LossInputs
from molrl.rl.rollouts.props_math import sampling_error_by_entropy, shared_state_sampling_error

SPLIT = 4.2
"""``rollout.sampling_error_split``: the error is split too, at this entropy (nats; the runs' shared states have
entropies from 3.4 to 4.4 at temperature 0.5, so some fall on each side)."""
NAMES = ("sampling_error", "sampling_error/shared_states", "sampling_error/low_entropy",
         "sampling_error/low_entropy_states", "sampling_error/high_entropy", "sampling_error/high_entropy_states")
"""Every figure the metric logs."""


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("sampling_error") / "base", eos_logit=2.0)


def make_trainer(root, base, sampling_error: bool = True, buffer_batches: int = 1):
    """A 2-step toy run's trainer (2 prompts x 8 completions of up to 16 tokens a step, sampled at temperature 0.5,
    in 4 micro-batches; beta 0, so the loss is the only log-prob forward pass besides the metric's) and its pool."""
    from molrl.rl.run import build_trainer

    cfg = toy_config(root, base, max_steps=2, prompts_per_step=2, max_new_tokens=16, beta=0.0, temperature=0.5,
                     micro_batch_size=4)
    cfg.train.report_to = ["none"]
    cfg.rollout.sampling_error, cfg.rollout.sampling_error_split = sampling_error, SPLIT
    cfg.rollout.buffer_batches = buffer_batches
    trainer, _, pool = build_trainer(cfg)
    return trainer, pool


def old_figures(trainer, inputs: LossInputs) -> dict[str, float]:
    """The metric as it was computed before: a no-grad forward pass of the current policy over the update's rows."""
    logps = trainer.logprobs.completion(trainer.model, inputs.prompt_ids, inputs.prompt_mask, inputs.completion_ids,
                                     inputs.attention())
    entropies = trainer.logprobs.completion(trainer.model, inputs.prompt_ids, inputs.prompt_mask,
                                             inputs.completion_ids, inputs.completion_mask, entropies=True)
    ids, mask, group = inputs.completion_ids.cpu(), inputs.completion_mask.cpu(), trainer.group_size()
    error, states = shared_state_sampling_error(ids, logps.cpu(), mask, group)
    split = sampling_error_by_entropy(ids, logps.cpu(), entropies.cpu(), mask, group, SPLIT)
    return dict(zip(NAMES, (error, float(states), split["low"][0], float(split["low"][1]), split["high"][0],
                            float(split["high"][1]))))


@pytest.mark.parametrize("buffer_batches", [1, 2])  # 2: the second step trains on 32 rows, the first step's too
def test_the_error_from_the_loss_equals_the_old_forward_pass_with_groups_split_across_micro_batches(
        tmp_path, base, buffer_batches):
    trainer, pool = make_trainer(tmp_path / "run", base, buffer_batches=buffer_batches)
    rollout, expected, micro_batches = trainer.rollouts["train"], [], []
    finish, compute_loss = rollout.finish, trainer._compute_loss

    def finish_and_measure(inputs):
        out = finish(inputs)
        expected.append(old_figures(trainer, out))
        return out

    def loss_and_record(model, inputs):
        micro_batches.append(inputs["row_index"].tolist())
        return compute_loss(model, inputs)

    rollout.finish, trainer._compute_loss = finish_and_measure, loss_and_record
    try:
        trainer.train()
    finally:
        pool.close()
    logged = [row for row in trainer.state.log_history if "sampling_error" in row]
    assert len(logged) == len(expected) == 2  # once per step
    for got, want in zip(logged, expected):
        assert want["sampling_error/shared_states"] > 0 and want["sampling_error"] > 0  # there is something to measure
        for name in NAMES:
            assert got[name] == pytest.approx(want[name], rel=1e-5, abs=1e-7), name
    assert all(any(want[f"sampling_error/{side}_entropy_states"] > 0 for want in expected) for side in ("low", "high"))
    # each step's rows reach the loss once, in 4 shuffled micro-batches: every group of 8 is spread over several
    assert len(micro_batches) == 8
    for step, rows in zip((micro_batches[:4], micro_batches[4:]), (16, 16 * buffer_batches)):
        assert sorted(r for part in step for r in part) == list(range(rows))
    assert any(part != list(range(part[0], part[0] + len(part))) for part in micro_batches)  # shuffled
    assert any(len({r // 8 for r in part}) > 1 for part in micro_batches)  # groups meet in a micro-batch


def count_policy_forwards(trainer, pool) -> int:
    """Forward passes of the policy over whole rows (the loss's and any metric's) in a run of ``trainer``;
    generation steps its inner model token by token and is not counted."""
    calls = []
    handle = trainer.model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        trainer.train()
    finally:
        handle.remove()
        pool.close()
    return len(calls)


def test_the_metric_costs_no_forward_pass(tmp_path, base):
    with_metric = count_policy_forwards(*make_trainer(tmp_path / "on", base, sampling_error=True))
    without = count_policy_forwards(*make_trainer(tmp_path / "off", base, sampling_error=False))
    assert without == 2 * 4  # 2 steps x 4 micro-batches: the loss's forward passes
    assert with_metric == without  # the old metric added 2 x 8 more (log-probs, then entropies: 16 rows in 4s)


def test_evaluation_logs_the_error_of_its_one_whole_batch(tmp_path, base):
    trainer, pool = make_trainer(tmp_path / "eval", base)
    row = dict(trainer.train_dataset[0])
    trainer.model.eval()
    try:
        torch.manual_seed(0)
        inputs = trainer._prepare_inputs([row] * trainer.num_generations_eval)
        want = old_figures(trainer, LossInputs.from_dict(inputs))
        with torch.no_grad():
            trainer._compute_loss(trainer.model, inputs)
    finally:
        trainer.model.train()
        pool.close()
    got = trainer._metrics["eval"]
    for name in NAMES:
        assert got[name] == [pytest.approx(want[name], rel=1e-5, abs=1e-7)], name
    assert not trainer._metrics["train"].get("sampling_error")


def test_behaviour_log_probs_keep_the_error_at_the_steps_start(tmp_path, base):
    # two optimiser steps per generation batch: the loss's second half reads an updated policy, so the metric reads
    # the behaviour log-probs computed at the step's start and the rows carry no index
    from molrl.rl.run import build_trainer

    cfg = toy_config(tmp_path / "behaviour", base, max_steps=2, prompts_per_step=2, max_new_tokens=16,
                     micro_batch_size=4)
    cfg.train.report_to = ["none"]
    trainer, _, pool = build_trainer(cfg)
    trainer.args.gradient_accumulation_steps = 2  # TRL's steps_per_generation stays 4
    trainer.model.train()
    rows = [dict(trainer.train_dataset[i % 2]) for i in range(16)]
    try:
        torch.manual_seed(0)
        inputs = trainer._generate_and_score_completions(rows)
    finally:
        pool.close()
    assert "behaviour_logps" in inputs and "row_index" not in inputs
    batch = LossInputs.from_dict(inputs)
    error, states = shared_state_sampling_error(batch.completion_ids, batch.behaviour_logps, batch.completion_mask, 8)
    assert trainer._metrics["train"]["sampling_error"] == [pytest.approx(error)]
    assert trainer._metrics["train"]["sampling_error/shared_states"] == [float(states)]
