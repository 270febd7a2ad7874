"""MolTrainer wiring: invariance to how a step is split, the frozen reference, parameter updates, export."""

from __future__ import annotations

import random

import pytest
import torch

from molrl.config import ConfigError
from molrl.mol.config import MolConfig
from molrl.mol.run import build_trainer, check_reference_room


def synthetic_examples(n: int = 8, seed: int = 0, general: tuple[int, ...] = (3,)) -> list[dict]:
    """Random byte-token examples of different lengths with feedback / decision spans."""
    rng = random.Random(seed)
    examples = []
    for i in range(n):
        length = rng.randrange(12, 40)
        roles = [rng.choice("pfd") for _ in range(length)]
        examples.append({
            "input_ids": [rng.randrange(256) for _ in range(length)],
            "feedback_mask": [int(r == "f") for r in roles],
            "decision_mask": [int(r == "d") for r in roles],
            "is_general": i in general,
        })
    return examples


def make_cfg(tmp_path, **train) -> MolConfig:
    cfg = MolConfig(model="tiny:chatml", output_dir=tmp_path)
    cfg.lora.rank, cfg.lora.alpha, cfg.lora.dropout = 4, 8, 0.0
    cfg.train.optim, cfg.train.learning_rate, cfg.train.warmup_ratio = "sgd", 0.5, 0.0
    cfg.train.lr_scheduler, cfg.train.max_grad_norm = "constant", 0.0
    cfg.train.report_to, cfg.train.save_steps = ["none"], 1000
    for key, value in train.items():
        setattr(cfg.train, key, value)
    return cfg


def _trainable(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def one_step_update(tmp_path, examples, **train) -> tuple[float, dict[str, torch.Tensor]]:
    """Run one SGD step; returns the logged loss and the change of every trainable parameter."""
    from molrl.tiny import build_tiny_tokenizer

    trainer = build_trainer(make_cfg(tmp_path, max_steps=1, **train), examples, build_tiny_tokenizer("chatml"))
    before = _trainable(trainer)
    trainer.train()
    after = _trainable(trainer)
    loss = next(h["loss"] for h in trainer.state.log_history if "loss" in h)
    return loss, {n: after[n] - before[n] for n in before}


def test_micro_batch_8_equals_8_micro_batches_of_1(tmp_path):
    examples = synthetic_examples()
    loss_a, delta_a = one_step_update(tmp_path / "a", examples, micro_batch_size=8, grad_accumulation=1)
    loss_b, delta_b = one_step_update(tmp_path / "b", examples, micro_batch_size=1, grad_accumulation=8)
    assert loss_a == pytest.approx(loss_b, rel=1e-5)
    assert max(d.abs().max().item() for d in delta_a.values()) > 1e-4  # the step did move the adapter
    for name in delta_a:
        torch.testing.assert_close(delta_a[name], delta_b[name], rtol=1e-4, atol=1e-7)


def test_trainable_parameters_change_and_base_stays(tmp_path):
    from molrl.tiny import build_tiny_tokenizer

    cfg = make_cfg(tmp_path, max_steps=3, micro_batch_size=2, grad_accumulation=1)
    trainer = build_trainer(cfg, synthetic_examples(), build_tiny_tokenizer("chatml"))
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    before = _trainable(trainer)
    trainer.train()
    unchanged = [n for n, p in _trainable(trainer).items() if torch.equal(p, before[n])]
    assert unchanged == []
    assert all(torch.equal(p, frozen[n]) for n, p in trainer.model.named_parameters() if not p.requires_grad)


def test_adapter_disabled_reference_equals_untouched_base(tmp_path):
    from molrl.models import load_model
    from molrl.tiny import build_tiny_tokenizer

    trainer = build_trainer(make_cfg(tmp_path), synthetic_examples(), build_tiny_tokenizer("chatml"))
    with torch.no_grad():  # a trained-looking adapter: LoRA B starts at zero, so perturb it
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    batch = trainer.data_collator(synthetic_examples()[:3])
    base = load_model("tiny:chatml").eval()
    with torch.no_grad():
        want = base.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        got = trainer._base_hidden(trainer.model, batch)
        policy = trainer._policy_hidden(trainer.model, batch)
    torch.testing.assert_close(got, want)
    assert (policy - want).abs().max() > 1e-3  # while the policy itself is changed by its adapter


def test_full_fine_tuning_kl_without_room_is_refused_before_loading(tmp_path):
    cfg = make_cfg(tmp_path)
    cfg.lora.enabled = False
    with pytest.raises(ConfigError, match="KL with full fine-tuning needs a frozen reference copy"):
        check_reference_room(cfg, available_bytes=10_000)
    cfg.loss = type(cfg.loss)(mode="ce", monitor_kl=False)
    check_reference_room(cfg, available_bytes=10_000)  # no KL, no reference copy: nothing to refuse


def test_full_fine_tuning_trains_against_frozen_copy(tmp_path):
    from molrl.tiny import build_tiny_tokenizer

    cfg = make_cfg(tmp_path, max_steps=2, micro_batch_size=4, grad_accumulation=1)
    cfg.lora.enabled = False
    trainer = build_trainer(cfg, synthetic_examples(), build_tiny_tokenizer("chatml"))
    ref_before = {n: p.clone() for n, p in trainer.ref_model.named_parameters()}
    trainer.train()
    logs = [h for h in trainer.state.log_history if "kl_decision" in h]
    assert logs[-1]["kl_decision"] > 0  # the policy moved away from the frozen copy
    assert all(torch.equal(p, ref_before[n]) for n, p in trainer.ref_model.named_parameters())
