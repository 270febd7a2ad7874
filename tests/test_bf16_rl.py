"""Every RL algorithm and rollout policy in bfloat16 on CPU: ``run_rl`` with ``model.dtype=bfloat16``.

Two steps of the toy task per run. Checked: finite losses and gradient norms, importance ratios at 1
where the batch is the policy's own (a ratio formed from bf16 log-probs would not be), LoRA weights
that move, and the dtype of what is saved (the adapter in float32, as PEFT keeps it on a bf16 base).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from grpo_helpers import save_tiny_model, toy_config
from molrl.rl import run_rl
from molrl.rl.config import MacroSettings, OpdSettings


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("bf16_rl") / "base", eos_logit=2.0)


def configure(cfg, case: str):
    """The settings that select ``case``'s algorithm or rollout policy."""
    if case == "grpo_kl":
        cfg.algorithm, cfg.beta = "grpo", 0.1  # the reference's log-probs enter the loss
    elif case == "dr_grpo":
        cfg.algorithm = "dr_grpo"
    elif case == "opd":
        cfg.algorithm, cfg.opd = "opd", OpdSettings(teacher="feedback", lam=1.25)
    elif case == "ppo_macro":
        cfg.algorithm, cfg.beta, cfg.macro = "ppo", 0.05, MacroSettings(rule="fixed:2")
    elif case == "partial":
        cfg.algorithm = "grpo"
        cfg.rollout.partial, cfg.rollout.over_provision = True, 2.0
    elif case == "props":
        cfg.algorithm, cfg.prompts_per_step = "grpo", 2
        cfg.rollout.behaviour, cfg.rollout.rounds, cfg.rollout.buffer_batches = "props", 2, 2
        cfg.props.update_epochs, cfg.props.minibatches = 2, 1
    elif case == "two_iterations":
        cfg.algorithm, cfg.num_iterations = "grpo", 2  # the second pass's ratio is against stored log-probs
    else:
        raise ValueError(case)
    return cfg


CASES = ["grpo_kl", "dr_grpo", "opd", "ppo_macro", "partial", "props", "two_iterations"]


@pytest.mark.parametrize("case", CASES)
def test_rl_in_bf16_trains_with_finite_losses_and_saves_a_float32_adapter(tmp_path, base, case):
    from safetensors.torch import load_file

    cfg = configure(toy_config(tmp_path / case, base, max_steps=2, max_new_tokens=12), case)
    cfg.model.dtype = "bfloat16"
    out = run_rl(cfg)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    assert len(steps) >= 1
    for r in steps:
        assert math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0, r
        for key, value in r.items():
            assert not (isinstance(value, float) and math.isinf(value)), (key, value)
    # step 1 samples from and trains the policy it starts from: every ratio is exactly 1 (none clipped),
    # and where a reference is scored, the fresh adapter (B = 0) makes the policy its reference: KL 0
    assert steps[0]["clip_ratio/region_mean"] == 0.0
    if "kl" in steps[0]:
        assert steps[0]["kl"] == 0.0
    weights = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    lora_b = [w for name, w in weights.items() if "lora_B" in name]
    assert lora_b and all(w.abs().sum() > 0 for w in lora_b)  # B starts at zero: every one moved
    assert {w.dtype for w in weights.values()} == {torch.float32}
    if case == "ppo_macro":
        critic = torch.load(out / "value_head.pt")  # the separate critic: its head and its own adapter
        assert all(t.dtype == torch.float32 and torch.isfinite(t).all() for t in critic["head"].values())
        assert critic["adapter"] and all(torch.isfinite(t).all() for t in critic["adapter"].values())
