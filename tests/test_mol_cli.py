"""`molrl mol` and `molrl export` on the shipped tiny config: outputs load with plain peft / transformers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from molrl.config import load_config
from molrl.mol.config import MolConfig

REPO = Path(__file__).resolve().parents[1]


def _parse(argv: list[str]) -> argparse.Namespace:
    from molrl.commands import export, mol

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    mol.register(sub)
    export.register(sub)
    return parser.parse_args(argv)


def test_mol_then_export_on_tiny_config(tmp_path, monkeypatch):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from molrl.models import load_model

    monkeypatch.chdir(REPO)  # the shipped config names its traces relative to the repository root
    out = tmp_path / "run"
    args = _parse(["mol", "--config", "configs/mol_tiny.yaml", f"output_dir={out}", "train.max_steps=2"])
    assert args.func(args) == 0

    cfg = load_config(MolConfig, out / "config.yaml")  # the resolved config reloads as it was run
    assert cfg.train.max_steps == 2 and cfg.loss.mode == "mol"
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "loss" in r] == [1, 2]
    assert {"ce_feedback", "kl_decision", "tokens_feedback", "tokens_decision", "learning_rate", "grad_norm",
            "tokens_per_s"} <= set(logged[0])
    assert list(out.glob("checkpoints/runs/*/events.out.tfevents.*"))  # tensorboard, offline, as RL keeps it

    args = _parse(["export", "--merge", "--adapter", str(out / "adapter"), "--out", str(tmp_path / "merged")])
    assert args.func(args) == 0
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        adapted = PeftModel.from_pretrained(load_model("tiny:chatml"), str(out / "adapter"))(ids).logits
        merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"))(ids).logits
    torch.testing.assert_close(merged, adapted, rtol=1e-4, atol=1e-5)


def test_shipped_qwen3_configs_load_with_paper_adapter_settings():
    for name in ("mol_qwen3_4b.yaml", "mol_qwen3_8b.yaml"):
        cfg = load_config(MolConfig, REPO / "configs" / name)
        assert (cfg.lora.rank, cfg.lora.target_modules, cfg.loss.mode) == (64, ["all-linear"], "mol")
        assert cfg.train.bf16 and cfg.train.gradient_checkpointing
