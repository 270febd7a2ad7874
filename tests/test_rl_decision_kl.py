"""``loss.kl_weight`` in single-turn GRPO: MoL's KL(policy || base) on every sampled token, beside the policy
gradient (the study's claim 6 trains GRPO from MoL with it).

A single-turn batch has no feedback and no attention mask of its own: every completion token is a decision token.
The term is checked against a hand computation from two forward passes (adapter on, adapter off), its gradient
against that computation's, over one micro-batch and two; then the RL stage runs it from a plain base, from a MoL
adapter trained on (``continue``: the base is the model before MoL, so the KL starts above 0) and from a merged
MoL model (``merge_new``: the base is the MoL model, so it starts at 0).
"""

from __future__ import annotations

import json

import pytest
import torch

from grpo_helpers import save_mol_adapter, save_tiny_model, toy_config
from molrl.rl.batch import LossInputs
from molrl.rl.config import rl_lora
from molrl.rl.terms import DecisionKL
from test_rl_terms_normalisers import WIDTH, gradients, make_trainer, relative_difference


def single_turn_inputs(trainer) -> dict[str, torch.Tensor]:
    """Four single-turn rows of 6, 5, 3 and 2 sampled tokens (right-padded), advantages 0, the step's counts."""
    generator = torch.Generator().manual_seed(1)
    mask = torch.tensor([[1] * 6, [1] * 5 + [0], [1] * 3 + [0] * 3, [1] * 2 + [0] * 4])
    prompt_ids = torch.randint(0, 256, (4, 3), generator=generator)
    rows = LossInputs(prompt_ids, torch.ones_like(prompt_ids), torch.randint(0, 256, (4, WIDTH), generator=generator)
                      * mask, mask, torch.zeros(4, WIDTH))
    return rows.counted(trainer.accelerator.gather).to_dict()


def hand_decision_kl(trainer, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """[] mean over the sampled tokens of KL(softmax(policy) || softmax(policy without its adapter))."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    policy = trainer.model(input_ids=ids, attention_mask=attention).logits[:, -WIDTH - 1:-1].log_softmax(-1)
    with torch.no_grad(), trainer.model.disable_adapter():
        base = trainer.model(input_ids=ids, attention_mask=attention).logits[:, -WIDTH - 1:-1].log_softmax(-1)
    kl = (policy.exp() * (policy - base)).sum(-1)  # [B, T]
    mask = inputs["completion_mask"].float()
    return (kl * mask).sum() / mask.sum()


def test_single_turn_decision_kl_is_the_mean_kl_to_the_adapterless_model_over_sampled_tokens(tmp_path):
    trainer = make_trainer(tmp_path)  # a random non-zero LoRA: the policy differs from its base
    trainer.terms = [DecisionKL(1.0)]
    inputs = single_turn_inputs(trainer)
    trained = gradients(trainer, trainer.model, inputs, 1, "token_mean")  # advantages 0: the loss is the KL alone
    logged = trainer.metrics()["loss/decision_kl"][-1]

    trainer.model.zero_grad()
    expected = hand_decision_kl(trainer, inputs)
    assert expected.item() > 1e-4 and logged == pytest.approx(expected.item(), rel=1e-5)
    expected.backward()
    by_hand = {n: p.grad for n, p in trainer.model.named_parameters() if p.grad is not None}
    assert relative_difference(trained, by_hand) < 1e-5
    # two micro-batches of 11 and 5 sampled tokens: each divides by the step's 16, so the step is the same
    assert relative_difference(gradients(trainer, trainer.model, inputs, 2, "token_mean"), trained) < 1e-5


@pytest.mark.parametrize("start, first_kl", [("plain", "zero"), ("continue", "positive"), ("merge_new", "zero")])
def test_single_turn_grpo_runs_with_the_decision_kl_against_the_model_before_mol(tmp_path, start, first_kl):
    from molrl.rl import run_rl

    base = save_tiny_model(tmp_path / "base")
    cfg = toy_config(tmp_path / "run", base, max_steps=2, algorithm="grpo")
    if start != "plain":
        cfg.model.adapter = str(save_mol_adapter(base, tmp_path / "mol") / "adapter")
        cfg.model.adapter_mode = start
        cfg.lora = rl_lora() if start == "continue" else cfg.lora  # continue: the adapter's own shape
    cfg.loss.kl_weight = 0.5
    cfg.__post_init__()
    out = run_rl(cfg)
    steps = [m for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "reward" in m]
    kl = [s["loss/decision_kl"] for s in steps]
    assert len(kl) == 2 and all(value >= 0 for value in kl)
    if first_kl == "zero":  # a fresh LoRA on the plain base or on the merged MoL model is its own base
        assert kl[0] == pytest.approx(0.0, abs=1e-6) and kl[1] > 1e-7
    else:  # the MoL adapter trained on: its base is the model before MoL, MoL's own reference
        assert kl[0] > 1e-3
