"""MoL vs plain SFT on real MINT traces: feedback CE falls in both, only MoL keeps decisions near the base."""

from __future__ import annotations

import pytest

from molrl.mol.config import MolConfig
from molrl.mol.losses import LossSettings
from molrl.mol.run import build_trainer

MINT_FILE = "traces/mint/gpt-4-0613_F_None__mbpp.jsonl"


@pytest.fixture(scope="module")
def mint_examples(shared_data, tmp_path_factory):
    """The 4 MINT MBPP traces whose first feedback comes earliest, tokenised by the tiny byte tokenizer."""
    from molrl.mol.data import load_examples
    from molrl.tiny import build_tiny_tokenizer
    from molrl.traces.importers import import_file
    from molrl.traces.schema import write_traces

    traces = [t for _, t in import_file(shared_data / MINT_FILE, "mint").traces]

    def chars_before_feedback(trace):
        roles = [m["role"] for m in trace.messages]
        return sum(len(m["content"]) for m in trace.messages[: roles.index("tool")])

    path = tmp_path_factory.mktemp("mint") / "mint.jsonl"
    write_traces(path, sorted(traces, key=chars_before_feedback)[:4])
    examples, stats = load_examples([str(path)], build_tiny_tokenizer("chatml"), max_length=4096)
    assert stats.without_feedback == 0 and stats.without_decision == 0
    return examples


def _train(tmp_path, examples, mode: str) -> list[dict]:
    from molrl.tiny import build_tiny_tokenizer

    # Full fine-tuning: a random tiny model learns little through a LoRA adapter in 10 steps.
    cfg = MolConfig(model="tiny:chatml", output_dir=tmp_path / mode, loss=LossSettings(mode=mode))
    cfg.lora.enabled = False
    t = cfg.train
    t.max_steps, t.micro_batch_size, t.grad_accumulation = 10, 1, 1
    t.learning_rate, t.lr_scheduler, t.warmup_ratio, t.report_to, t.save_steps = 4e-3, "constant", 0.0, ["none"], 1000
    trainer = build_trainer(cfg, examples, build_tiny_tokenizer("chatml"))
    trainer.train()
    return [h for h in trainer.state.log_history if "loss" in h]


def test_mol_keeps_decisions_near_base_while_ce_drifts(tmp_path, mint_examples):
    mol = _train(tmp_path, mint_examples, "mol")
    ce = _train(tmp_path, mint_examples, "ce")
    for logs in (mol, ce):
        # The random model starts near ln(263) = 5.57 nats per byte; feedback text is learnt.
        assert logs[0]["ce_feedback"] > 5.0
        assert sum(h["ce_feedback"] for h in logs[-3:]) / 3 < logs[0]["ce_feedback"] - 0.8
    kl_mol = sum(h["kl_decision"] for h in mol[-3:]) / 3
    kl_ce = sum(h["kl_decision"] for h in ce[-3:]) / 3
    assert kl_mol < 0.5
    assert kl_ce > 2 * kl_mol
