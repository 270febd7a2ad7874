"""A LoRA adapter on the output head: the chunked MoL loss uses it, the KL reference does not, it trains."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from molrl.errors import MolrlError
from molrl.mol.config import MolConfig
from molrl.mol.data import MolCollator
from molrl.mol.losses import token_masks
from molrl.mol.run import build_trainer
from molrl.tiny import build_tiny_tokenizer
from test_mol_trainer import synthetic_examples

TARGETS = ["q_proj", "v_proj", "lm_head"]


def head_lora_trainer(tmp_path, mode: str, dropout: float = 0.0):
    """A MolTrainer with LoRA on attention and the head, every adapter given a non-zero delta."""
    cfg = MolConfig(model="tiny:chatml", output_dir=tmp_path)
    cfg.lora.rank, cfg.lora.alpha, cfg.lora.dropout, cfg.lora.target_modules = 4, 8, dropout, TARGETS
    cfg.loss = dataclasses.replace(cfg.loss, mode=mode, monitor_kl=mode == "mol", chunk_size=16)
    cfg.train.report_to = ["none"]
    trainer = build_trainer(cfg, synthetic_examples(), build_tiny_tokenizer("chatml"))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # peft starts B at zero, where a skipped adapter would not show
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return trainer


def _batch(tokenizer_pad: int = 0) -> dict[str, torch.Tensor]:
    return MolCollator(tokenizer_pad)(synthetic_examples()[:4])


def _masks(batch):
    return token_masks(batch["input_ids"], batch["feedback_mask"], batch["decision_mask"],
                       batch["attention_mask"], batch["is_general"])


def _forward_logits(model, batch) -> torch.Tensor:
    """[B, L-1, V] fp32 logits at the prediction positions, through the model's own forward."""
    return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].float()


def _head_grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if "lm_head" in n and p.grad is not None}


def test_ce_loss_and_head_gradients_match_the_forward_with_the_head_adapter(tmp_path):
    trainer = head_lora_trainer(tmp_path, "ce_feedback")
    model, batch = trainer.model, _batch()
    masks = _masks(batch)
    loss = trainer.compute_loss(model, batch)
    loss.backward()
    got = _head_grads(model)
    model.zero_grad()

    # ce_feedback: CE over feedback and general tokens, divided by their count.
    ce = F.cross_entropy(_forward_logits(model, batch).flatten(0, 1), masks.targets.flatten(), reduction="none")
    carried = (masks.feedback | masks.general).flatten()
    expected = ce[carried].mean()
    expected.backward()
    want = _head_grads(model)
    with model.disable_adapter():
        unadapted = F.cross_entropy(_forward_logits(model, batch).flatten(0, 1)[carried],
                                    masks.targets.flatten()[carried])

    assert abs(unadapted.item() - expected.item()) > 0.05  # the adapters do move this loss
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert sorted(got) == sorted(want) and len(got) == 2  # lora_A and lora_B of the head
    for name in want:
        assert want[name].abs().max() > 0
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6)


def test_kl_reference_is_the_head_without_its_adapter(tmp_path):
    trainer = head_lora_trainer(tmp_path, "mol")
    model, batch = trainer.model, _batch()
    masks = _masks(batch)
    with torch.no_grad():
        loss = trainer.compute_loss(model, batch)
        logp = torch.log_softmax(_forward_logits(model, batch), -1)  # [B, L-1, V]
        with model.disable_adapter():
            logq = torch.log_softmax(_forward_logits(model, batch), -1)
    # mol: CE on feedback / n_feedback + reverse KL(p || q) on decision and general / their count.
    ce = -logp.gather(-1, masks.targets[..., None]).squeeze(-1)  # [B, L-1]
    kl = (logp.exp() * (logp - logq)).sum(-1)  # [B, L-1]
    kl_tokens = masks.decision | masks.general
    expected = ce[masks.feedback].mean() + kl[kl_tokens].mean()
    assert kl[kl_tokens].mean() > 0.01  # the adapted head does differ from the base
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_head_adapter_with_dropout_is_refused_before_training(tmp_path):
    with pytest.raises(MolrlError, match=r"lora.dropout=0.05 with the output head .* set lora.dropout=0"):
        head_lora_trainer(tmp_path, "mol", dropout=0.05)
