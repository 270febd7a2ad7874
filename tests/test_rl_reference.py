"""Which weights the KL reference really uses, for each policy layout and reference choice.

The policy's trainable adapter is moved away from its start, TRL's own scoring path
(``_generate_and_score_completions``) produces the reference log-probs, and those are compared
with log-probs computed from freshly loaded base and MoL models.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from grpo_helpers import save_mol_adapter, save_tiny_model, toy_config
from molrl.config.blocks import RlModelSource
from molrl.rl.run import build_trainer
from molrl.models import load_model


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ref")
    base = save_tiny_model(root / "base")
    return base, save_mol_adapter(base, root / "mol")


def temperature_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature):
    """log softmax(logits / T) of each completion token: [B, C]."""
    ids = torch.cat([prompt_ids, completion_ids], 1)  # [B, P+C]
    mask = torch.cat([prompt_mask, completion_mask], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1] / temperature  # [B, P+C-1, V]
    logps = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return logps[:, -completion_ids.size(1):]  # [B, C]


def reference_logps(cfg):
    """(TRL's reference log-probs, base log-probs, MoL log-probs, policy log-probs, completion mask)."""
    trainer, policy, pool = build_trainer(cfg)
    try:
        peft_model = trainer.model
        with torch.no_grad():  # move the trained adapter away from its starting point
            for name, p in peft_model.named_parameters():
                if p.requires_grad:
                    p.add_(torch.randn_like(p) * 0.3)
        peft_model.train()
        out = trainer._generate_and_score_completions([trainer.train_dataset[0]] * cfg.sampling.n)
    finally:
        pool.close()
    args = (out["prompt_ids"], out["prompt_mask"], out["completion_ids"], out["completion_mask"], cfg.sampling.temperature)
    base = load_model(cfg.model.path)
    mol = load_model(cfg.model.path, adapter=cfg.model.adapter / "adapter") if cfg.model.adapter else None
    peft_model.eval()
    return (out["reference_logps"], temperature_logps(base, *args), mol and temperature_logps(mol, *args),
            temperature_logps(peft_model, *args), out["completion_mask"].bool())


def assert_same(a, b, mask):
    torch.testing.assert_close(a[mask], b[mask], atol=2e-4, rtol=1e-4)


def assert_different(a, b, mask):
    assert (a[mask] - b[mask]).abs().max() > 1e-2


@pytest.mark.parametrize("mode", ["continue", "merge_new"])
@pytest.mark.parametrize("reference", ["base", "mol"])
def test_reference_is_the_configured_model(tmp_path, dirs, mode, reference):
    base, mol = dirs
    cfg = toy_config(tmp_path, base, beta=0.1, max_new_tokens=6)
    cfg.model = RlModelSource(str(base), adapter=mol, adapter_mode=mode, reference=reference)
    ref, base_lp, mol_lp, policy_lp, mask = reference_logps(cfg)
    expected, other = (base_lp, mol_lp) if reference == "base" else (mol_lp, base_lp)
    assert_same(ref, expected, mask)
    assert_different(ref, other, mask)
    assert_different(ref, policy_lp, mask)  # the reference is frozen, not the moving policy


def test_plain_base_reference_is_the_base(tmp_path, dirs):
    base, _ = dirs
    cfg = toy_config(tmp_path, base, beta=0.1, max_new_tokens=6)
    cfg.lora = dataclasses.replace(cfg.lora, rank=4)
    ref, base_lp, _, policy_lp, mask = reference_logps(cfg)
    assert_same(ref, base_lp, mask)
    assert_different(ref, policy_lp, mask)


def test_mol_reference_needs_a_mol_adapter(tmp_path, dirs):
    base, _ = dirs
    with pytest.raises(ValueError, match="needs model.adapter"):
        toy_config(tmp_path, base, model=RlModelSource(str(base), reference="mol"))
