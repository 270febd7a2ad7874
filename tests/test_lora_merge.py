"""Generating with the LoRA adapter merged: the same outputs as unmerged, and the base weights back bit for bit."""

from __future__ import annotations

import json

import pytest
import torch
from peft import LoraConfig, get_peft_model

from grpo_helpers import save_tiny_model, toy_config
from molrl.engines.lora_merge import lora_layers, merged_lora
from molrl.rl.config import RlConfig


def lora_model(dtype: torch.dtype):
    from molrl.tiny import build_tiny_pair

    model, tok = build_tiny_pair("chatml", initializer_range=0.1)
    torch.manual_seed(3)
    model = get_peft_model(model.to(dtype), LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                                        init_lora_weights=False, task_type="CAUSAL_LM"))
    return model.eval(), tok


def base_weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merged_outputs_match_unmerged_and_the_base_comes_back_exactly(dtype):
    model, _ = lora_model(dtype)
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    before = base_weights(model)
    with torch.no_grad():
        unmerged = model(input_ids=ids).logits.float()
        with merged_lora(model):
            assert all(layer.merged for layer in lora_layers_all(model))
            changed = [n for n, p in model.named_parameters() if "lora_" not in n and not torch.equal(p, before[n])]
            assert changed  # the adapter really is in the weights
            merged = model(input_ids=ids).logits.float()
        after = model(input_ids=ids).logits.float()
    tolerance = 1e-4 if dtype == torch.float32 else 0.1
    assert (merged - unmerged).abs().max() < tolerance
    assert torch.equal(after, unmerged)  # unmerged again, on the very same weights
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters() if "lora_" not in n)
    assert not any(layer.merged for layer in lora_layers_all(model))


def test_peft_unmerge_in_bfloat16_does_not_give_the_base_back():
    """Why merged_lora copies the weights back instead of subtracting the update again."""
    model, _ = lora_model(torch.bfloat16)
    before = base_weights(model)
    model.merge_adapter()
    model.unmerge_adapter()
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters() if "lora_" not in n)


def test_a_disabled_adapter_and_a_plain_model_pass_through():
    from molrl.tiny import build_tiny_pair

    plain, _ = build_tiny_pair("chatml")
    before = base_weights(plain)
    with merged_lora(plain) as model:
        assert model is plain
    assert all(torch.equal(p, before[n]) for n, p in plain.named_parameters())
    model, _ = lora_model(torch.float32)
    with model.disable_adapter():
        assert lora_layers(model) == []
        with merged_lora(model):
            assert not any(layer.merged for layer in lora_layers_all(model))


def test_an_error_inside_still_restores_the_base():
    model, _ = lora_model(torch.bfloat16)
    before = base_weights(model)
    with pytest.raises(RuntimeError, match="generation failed"):
        with merged_lora(model):
            raise RuntimeError("generation failed")
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters() if "lora_" not in n)
    assert not any(layer.merged for layer in lora_layers_all(model))


def lora_layers_all(model):
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


def test_an_rl_run_with_merged_generation_samples_what_the_unmerged_one_does(tmp_path):
    base = save_tiny_model(tmp_path / "base")
    completions = {}
    for merged in (False, True):
        cfg = toy_config(tmp_path / f"run-{merged}", base, max_steps=2)
        cfg.rollout.merged_generation = merged
        cfg.__post_init__()
        from molrl.rl import run_rl

        run_rl(cfg)
        rows = [json.loads(line) for line in (cfg.output_dir / "completions.jsonl").read_text().splitlines()]
        completions[merged] = [r["completion"] for r in rows]
    assert len(completions[True]) == 16 and completions[True] == completions[False]


@pytest.mark.parametrize("setting", [{"engine": "vllm"}, {"behaviour": "props"}])
def test_merged_generation_is_refused_where_transformers_does_not_sample_the_policy(tmp_path, setting):
    cfg = toy_config(tmp_path, tmp_path / "base")
    cfg.rollout.merged_generation = True
    if "engine" in setting:
        cfg.engine = "vllm"
    else:
        cfg.rollout.behaviour = "props"
    with pytest.raises(ValueError, match="rollout.merged_generation"):
        RlConfig.__post_init__(cfg)
