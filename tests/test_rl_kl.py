"""The eval hook's KL to the base: closed form, and wired into a run's metrics."""

from __future__ import annotations

import json
import math

import pytest
import torch

from grpo_helpers import save_tiny_model, toy_config
from molrl.config.blocks import RlModelSource
from molrl.rl.config import EvalHookSettings, TaskSource
from molrl.rl.kl import mean_token_kl, policy_base_kl
from molrl.engines.sampling import HookSampling


def test_mean_token_kl_closed_form():
    # position 0: p = (1/2, 1/2), q = (1/4, 3/4): KL = 1/2 ln 2 + 1/2 ln(2/3) = 1/2 ln(4/3)
    # position 1: very different, but outside the completion mask, so not counted
    policy = torch.tensor([[[0.0, 0.0], [10.0, -10.0]]])  # [B=1, T=2, V=2]
    base = torch.tensor([[[0.0, math.log(3.0)], [-10.0, 10.0]]])
    mask = torch.tensor([[1, 0]])
    assert mean_token_kl(policy, base, mask) == pytest.approx(0.5 * math.log(4 / 3), rel=1e-6)
    assert mean_token_kl(policy, policy, torch.ones(1, 2)) == pytest.approx(0.0, abs=1e-7)


def test_policy_base_kl_is_zero_until_the_adapter_moves(tiny_pair):
    from peft import LoraConfig, get_peft_model

    model, tok = tiny_pair
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    prompts, completions = ["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"] * 2, ["abc", "zz"]
    assert policy_base_kl(peft_model, peft_model.disable_adapter, tok, prompts, completions) == pytest.approx(0, abs=1e-7)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 1.0)
    assert policy_base_kl(peft_model, peft_model.disable_adapter, tok, prompts, completions) > 1e-4


def test_eval_hook_writes_accuracy_and_kl_every_n_steps(tmp_path):
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text("\n".join(json.dumps({"id": f"h{i}", "prompt": f"What is {i}+1?", "answer": str(i + 1)})
                                  for i in range(2)) + "\n")
    base = save_tiny_model(tmp_path / "base")
    cfg = toy_config(tmp_path / "run", base, max_steps=2,
                     eval=EvalHookSettings(every_steps=1, data=TaskSource(path=held_out, format="jsonl"),
                                           sampling=HookSampling(max_new_tokens=8), kl_prompts=2))
    from molrl.rl.run import run_rl

    out = run_rl(cfg)
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "eval/accuracy" in line]
    assert [e["step"] for e in evals] == [1, 2]
    assert all(e["eval/accuracy"] == 0.0 for e in evals)  # a random tiny model does not add numbers
    assert all(e["eval/kl_to_base"] > 0 for e in evals)  # the LoRA update moved the policy off the base


@pytest.mark.parametrize("reference, beta", [("base", 0.1), ("mol", 0.0)])
def test_after_merge_new_the_hook_measures_against_the_original_base(tmp_path, reference, beta):
    from grpo_helpers import save_mol_adapter
    from molrl.rl.callbacks import BaseAccess
    from molrl.rl.run import build_trainer
    from molrl.models import load_model

    base = save_tiny_model(tmp_path / "base")
    mol = save_mol_adapter(base, tmp_path / "mol")
    cfg = toy_config(tmp_path / "run", base, beta=beta)
    cfg.model = RlModelSource(str(base), adapter=mol, adapter_mode="merge_new", reference=reference)
    trainer, policy, pool = build_trainer(cfg)
    pool.close()
    hook_base = BaseAccess(policy)(trainer.model)
    ids = torch.tensor([[60, 61, 62, 63, 64]])
    expected = load_model(str(base))(ids).logits
    torch.testing.assert_close(hook_base(ids).logits, expected)
    assert (trainer.model(ids).logits - expected).abs().max() > 1e-3  # the policy (merged MoL) is not the base
