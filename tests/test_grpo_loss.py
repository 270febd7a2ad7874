"""The GRPO objectives as TRL computes them, checked against closed forms and a hand-written loss.

TRL's ``_compute_loss`` is called on a fixed batch (two completions of one prompt, lengths 3
and 1, padded to 4); the expected values are derived in the comments.
"""

from __future__ import annotations

import math

import pytest
import torch

from molrl.grpo.algorithms import trl_loss_settings
from molrl.grpo.config import GrpoConfig, PolicyConfig
from molrl.grpo.run import trl_args
from molrl.grpo.trainer import GrpoTrainer

MAX_COMPLETION = 4  # Dr.GRPO's constant normaliser is B * max_completion_length = 2 * 4


def make_trainer(tmp_path, algorithm="dr_grpo", beta=0.0, epsilon=0.2, rewards=None):
    """A trainer on the tiny model; with beta > 0 the model gets a LoRA adapter (its reference is the base)."""
    from datasets import Dataset
    from peft import LoraConfig
    from molrl.tiny import build_tiny_pair

    model, tok = build_tiny_pair("chatml", initializer_range=0.1)
    cfg = GrpoConfig(output_dir=tmp_path, policy=PolicyConfig(), algorithm=algorithm, beta=beta, epsilon=epsilon,
                     num_generations=2, micro_batch_size=2, max_completion_length=MAX_COMPLETION, max_steps=1,
                     temperature=1.0)
    fixed = rewards or [0.0, 0.0]

    def fixed_reward(prompts, completions, **kwargs):
        return list(fixed)[: len(completions)]

    args = trl_args(cfg, tmp_path / "ckpt", cuda=False)
    ds = Dataset.from_list([{"prompt": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"}] * 4)
    peft_config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False) if beta else None
    trainer = GrpoTrainer(model=model, reward_funcs=[fixed_reward], args=args, train_dataset=ds, processing_class=tok,
                          peft_config=peft_config)
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop; one micro-batch per step here
    return trainer, trainer.model


def fixed_batch(advantages):
    """Prompt 'ab' (2 tokens), completions of 3 and 1 tokens, right-padded to 4."""
    prompt_ids = torch.tensor([[97, 98], [97, 98]])  # [B=2, P=2]
    completion_ids = torch.tensor([[99, 100, 101, 0], [102, 0, 0, 0]])  # [B, C=4]
    completion_mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])  # [B, C] real completion tokens
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor(advantages, dtype=torch.float32),  # [B]
        "num_items_in_batch": completion_mask.sum(),
    }


def completion_logps(model, batch):
    """log pi(o_t | q, o_<t) of every completion position, by a plain forward pass: [B, C]."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)  # [B, P+C]
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]  # [B, P+C-1, V] predicts tokens 1..
    logps = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)  # [B, P+C-1]
    return logps[:, -batch["completion_ids"].size(1):]  # [B, C]


def trl_loss_and_grads(trainer, model, batch):
    model.zero_grad()
    loss = trainer._compute_loss(model, batch)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def test_dr_grpo_loss_is_token_sum_over_constant(tmp_path):
    # On-policy (old = current) the ratio is 1 and no clipping acts, so the per-token loss is -A_i:
    # loss = -(sum_i A_i |o_i|) / (B * L) = -(1 * 3 + (-1) * 1) / (2 * 4) = -0.25.
    trainer, model = make_trainer(tmp_path)
    batch = fixed_batch([1.0, -1.0])
    loss, grads = trl_loss_and_grads(trainer, model, batch)
    assert loss.item() == pytest.approx(-0.25, abs=1e-6)

    # Its gradient is -(1/8) * (grad sum_t log pi(o_1,t) - grad log pi(o_2,1)).
    model.zero_grad()
    logps = completion_logps(model, batch)  # [B, C]
    masked = logps * batch["completion_mask"]
    (-(masked[0].sum() - masked[1].sum()) / 8).backward()
    for name, p in model.named_parameters():
        if name in grads:
            torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-7)


def test_grpo_loss_averages_per_sequence(tmp_path):
    # GRPO averages within each completion first: (1/2) * (-(1 * 3)/3 - ((-1) * 1)/1) = 0, where
    # Dr.GRPO gave -0.25: the length bias Dr.GRPO removes.
    trainer, model = make_trainer(tmp_path, algorithm="grpo")
    loss, _ = trl_loss_and_grads(trainer, model, fixed_batch([1.0, -1.0]))
    assert loss.item() == pytest.approx(0.0, abs=1e-6)


def test_dr_grpo_loss_with_clipping_and_kl_matches_hand_computation(tmp_path):
    # Off-policy old log-probs push some ratios outside [1 - eps, 1 + eps]; beta adds TRL's k3 KL
    # estimate exp(ref - logp) - (ref - logp) - 1, weighted by the ratio (bias-corrected KL).
    beta, eps = 0.1, 0.2
    trainer, model = make_trainer(tmp_path, beta=beta, epsilon=eps)
    batch = fixed_batch([0.7, -1.3])
    with torch.no_grad():
        current = completion_logps(model, batch)  # [B, C]
    batch["old_per_token_logps"] = current + torch.tensor([[0.5, -0.5, 0.05, 0.0], [-0.4, 0.0, 0.0, 0.0]])
    batch["ref_per_token_logps"] = current + torch.tensor([[0.3, 0.1, -0.2, 0.0], [0.2, 0.0, 0.0, 0.0]])
    loss, grads = trl_loss_and_grads(trainer, model, batch)

    model.zero_grad()
    logp = completion_logps(model, batch)  # [B, C]
    adv = batch["advantages"][:, None]  # [B, 1]
    ratio = torch.exp(logp - batch["old_per_token_logps"])
    surrogate = -torch.min(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv)
    d = batch["ref_per_token_logps"] - logp
    kl = (torch.exp(d) - d - 1) * ratio
    per_token = (surrogate + beta * kl) * batch["completion_mask"]
    expected = per_token.sum() / (2 * MAX_COMPLETION)
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)  # fused vs plain log-softmax rounding
    # the batch really exercises clipping: ratio e^-0.5 < 0.8 with A > 0 and e^0.4 > 1.2 with A < 0
    assert math.exp(-0.5) < 1 - eps and math.exp(0.4) > 1 + eps
    for name, p in model.named_parameters():
        if name in grads:
            torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize(
    "algorithm, expected",
    [
        # rewards [1, 0] of one group: mean 0.5, unbiased std sqrt(0.5) = 0.7071
        ("dr_grpo", [0.5, -0.5]),  # A = R - mean
        ("dr_grpo_std", [0.5 / (0.70711 + 1e-4), -0.5 / (0.70711 + 1e-4)]),  # A = (R - mean) / (std + 1e-4)
        ("grpo", [0.5 / (0.70711 + 1e-4), -0.5 / (0.70711 + 1e-4)]),
    ],
)
def test_advantages_scale_as_the_algorithm_says(tmp_path, algorithm, expected):
    trainer, model = make_trainer(tmp_path, algorithm=algorithm, rewards=[1.0, 0.0])
    trainer.model.train()
    rows = [trainer.train_dataset[0], trainer.train_dataset[0]]  # one prompt, G = 2
    out = trainer._generate_and_score_completions(rows)
    assert out["advantages"].tolist() == pytest.approx(expected, rel=1e-4)


def test_algorithm_names_map_to_trl_settings():
    assert trl_loss_settings("dr_grpo") == {"loss_type": "dr_grpo", "scale_rewards": "none"}
    assert trl_loss_settings("dr_grpo_std") == {"loss_type": "dr_grpo", "scale_rewards": "group"}
    assert trl_loss_settings("grpo") == {"loss_type": "grpo", "scale_rewards": "group"}
    with pytest.raises(ValueError, match="expected one of"):
        trl_loss_settings("ppo")
