"""MoL in bfloat16 on CPU: the stage as a GPU config runs it (bf16 weights and bf16 mixed precision).

Each run is the real stage (``run_mol``) on the tiny model for two optimiser steps; what a GPU's
first bf16 run would trip over is checked here: finite losses, a KL of zero while the policy is
still its base, weights that move, and the dtype of what is saved.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from molrl.config.blocks import ModelSource
from molrl.mol.config import MolConfig
from molrl.mol.losses import LossSettings, mol_loss, step_counts, token_masks
from molrl.mol.run import run_mol
from molrl.traces.schema import Trace, write_traces


def write_tiny_traces(path) -> str:
    """Four two-turn traces with decision and feedback tokens, one of them general."""
    traces = []
    for i in range(4):
        messages = [
            {"role": "user", "content": f"Compute f({i}3) with the tool."},
            {"role": "assistant", "content": f"I run it.\n```python\nprint(f({i}3))\n```"},
            {"role": "tool", "content": f"Output: {(i * 7) % 10}\nTests passed: {i % 2}/1"},
            {"role": "assistant", "content": f"The answer is \\boxed{{{(i * 7) % 10}}}."},
        ]
        traces.append(Trace(messages, {"kind": "general" if i == 3 else "domain"}))
    write_traces(path, traces)
    return str(path)


def bf16_config(tmp_path, traces: str, **loss) -> MolConfig:
    cfg = MolConfig(model=ModelSource("tiny:chatml", dtype="bfloat16"), output_dir=tmp_path / "run", loss=LossSettings(**loss))
    cfg.data.traces = [traces]
    cfg.lora.rank, cfg.lora.alpha, cfg.lora.dropout = 4, 8, 0.0
    t = cfg.train
    t.bf16 = True  # the GPU configs set both: bf16 weights and bf16 autocast
    t.max_steps, t.micro_batch_size, t.grad_accumulation = 2, 2, 1
    t.learning_rate, t.lr_scheduler, t.warmup_ratio, t.report_to, t.save_steps = 5e-2, "constant", 0.0, ["none"], 1000
    return cfg


def logged_steps(out) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r]


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> str:
    return write_tiny_traces(tmp_path_factory.mktemp("bf16_traces") / "traces.jsonl")


@pytest.mark.parametrize("dtype,direction,kl_at_start", [
    ("bfloat16", "reverse", 0.0),
    ("bfloat16", "forward", 0.0),
    # fp32 weights under bf16 autocast: PEFT's adapter branch promotes q/k/v to fp32, and CPU autocast
    # leaves attention in the inputs' dtype, so the policy's attention runs in fp32 and the base's in
    # bf16 (on CUDA autocast casts both to bf16); the two differ by bf16 rounding only
    ("float32", "reverse", 1e-5),
])
def test_lora_mol_in_bf16_trains_and_saves_a_float32_adapter(tmp_path, traces, dtype, direction, kl_at_start):
    from safetensors.torch import load_file

    cfg = bf16_config(tmp_path, traces, kl_direction=direction)
    cfg.model.dtype = dtype
    cfg.lora.target_modules = ["q_proj", "v_proj", "down_proj", "lm_head"]  # the head's adapter enters the chunked loss
    out = run_mol(cfg)
    steps = logged_steps(out)
    assert len(steps) == 2
    assert all(math.isfinite(r[k]) for r in steps for k in ("loss", "ce_feedback", "kl_decision"))
    # step 1 is measured before any update: the policy is its base (LoRA B = 0), so the KL is 0
    assert steps[0]["kl_decision"] <= kl_at_start
    assert steps[1]["kl_decision"] > 1e-6  # after one update the policy has left its base
    weights = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    lora_b = [w for name, w in weights.items() if "lora_B" in name]
    assert lora_b and all(w.abs().sum() > 0 for w in lora_b)  # B starts at zero: every one moved
    # PEFT keeps adapter weights in float32 on a bf16 base (docs/scale-out.md counts them so)
    assert {w.dtype for name, w in weights.items() if "lora_" in name} == {torch.float32}


def test_full_fine_tuning_mol_in_bf16_saves_a_bf16_model_and_keeps_its_reference(tmp_path, traces):
    from safetensors.torch import load_file

    cfg = bf16_config(tmp_path, traces)
    cfg.lora.enabled = False
    out = run_mol(cfg)
    steps = logged_steps(out)
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["kl_decision"]) for r in steps)
    assert steps[0]["kl_decision"] == pytest.approx(0.0, abs=1e-6) and steps[1]["kl_decision"] > 1e-6
    saved = load_file(str(out / "model" / "model.safetensors"))
    assert {w.dtype for w in saved.values()} == {torch.bfloat16}
    from molrl.models import load_model

    fresh = load_model("tiny:chatml", dtype="bfloat16").state_dict()
    moved = [name for name, w in saved.items() if name in fresh and not torch.equal(w, fresh[name])]
    assert len(moved) > len(saved) // 2  # the weights themselves were trained


def test_full_fine_tuning_in_bf16_keeps_float32_master_weights_that_small_updates_move(tmp_path, traces):
    # bf16 weights would round an AdamW update of ~1e-5 away: before float32 master weights, two steps at
    # learning rate 1e-5 left 85% of the tiny model's weights exactly unchanged
    from molrl.mol.data import load_examples
    from molrl.mol.run import build_trainer
    from molrl.tiny import build_tiny_tokenizer

    cfg = bf16_config(tmp_path, traces)
    cfg.lora.enabled, cfg.train.learning_rate = False, 1e-5
    tok = build_tiny_tokenizer("chatml")
    examples, _ = load_examples(cfg.data.traces, tok, cfg.data.max_length)
    trainer = build_trainer(cfg, examples, tok)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    assert {p.dtype for p in before.values()} == {torch.float32}
    assert {p.dtype for p in trainer.ref_model.parameters()} == {torch.bfloat16}  # frozen: in the configured dtype
    trainer.train()
    changed = sum(int((p.detach() != before[n]).sum()) for n, p in trainer.model.named_parameters())
    assert changed == sum(p.numel() for p in before.values())  # every weight moved (AdamW: about lr each)
    logs = [h for h in trainer.state.log_history if "kl_decision" in h]
    # the policy's float32 weights against their bf16-rounded reference: near zero before any update
    assert logs[0]["kl_decision"] < 1e-4


@pytest.mark.parametrize("direction", ["reverse", "forward"])
def test_chunked_loss_on_bf16_inputs_matches_float32_and_returns_bf16_gradients(direction):
    # The loss path on a GPU: bf16 hidden states and head. Logits come out of a bf16 matmul and are
    # turned into CE and KL in float32, so the loss must agree with the float32 computation on the
    # same (bf16-representable) numbers to within bf16 logit rounding, and the gradient must come
    # back in the hidden states' own dtype.
    g = torch.Generator().manual_seed(0)
    B, L, H, V = 2, 24, 32, 300
    hidden = torch.randn(B, L, H, generator=g).to(torch.bfloat16)  # [B, L, H]
    base_hidden = (hidden.float() + 0.05 * torch.randn(B, L, H, generator=g)).to(torch.bfloat16)
    weight = (0.3 * torch.randn(V, H, generator=g)).to(torch.bfloat16)  # [V, H]
    ids = torch.randint(0, V, (B, L), generator=g)
    roles = torch.randint(0, 3, (B, L), generator=g)
    masks = token_masks(ids, (roles == 1).long(), (roles == 2).long(), torch.ones_like(ids), torch.zeros(B, dtype=torch.bool))
    settings = LossSettings(kl_direction=direction, chunk_size=7)

    def loss_and_grad(dtype):
        h = hidden.to(dtype).detach().clone().requires_grad_(True)
        out = mol_loss(h, base_hidden.to(dtype), (weight.to(dtype), None), (weight.to(dtype), None), masks,
                       step_counts(masks), settings)
        out.loss.backward()
        return out, h.grad

    out16, grad16 = loss_and_grad(torch.bfloat16)
    out32, grad32 = loss_and_grad(torch.float32)
    assert out16.loss.dtype == torch.float32 and grad16.dtype == torch.bfloat16
    assert out16.loss.item() == pytest.approx(out32.loss.item(), rel=1e-2)
    assert out16.metrics.kl_decision_sum == pytest.approx(out32.metrics.kl_decision_sum, rel=5e-2)
    assert out32.metrics.kl_decision_sum > 0
    cos = torch.nn.functional.cosine_similarity(grad16.float().flatten(), grad32.flatten(), dim=0)
    assert cos > 0.99
