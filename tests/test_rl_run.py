"""End-to-end GRPO runs on tiny models: outputs, learning, MoL adapters, resuming, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from grpo_helpers import save_mol_adapter, save_tiny_model, toy_config
from molrl.config.blocks import RlModelSource
from molrl.rl.config import rl_lora
from molrl.rl.run import build_trainer, run_rl


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("grpo") / "base")


@pytest.fixture(scope="module")
def mol(base, tmp_path_factory):
    return save_mol_adapter(base, tmp_path_factory.mktemp("grpo") / "mol")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def step_rewards(out: Path) -> list[float]:
    return [r["reward"] for r in read_jsonl(out / "metrics.jsonl") if "reward" in r]


def lora_tensors(adapter_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(adapter_dir / "adapter_model.safetensors"))


def test_toy_run_logs_every_step_and_every_completion(tmp_path, base):
    out = run_rl(toy_config(tmp_path, base, max_steps=3))
    metrics = [r for r in read_jsonl(out / "metrics.jsonl") if "reward" in r]
    assert [r["step"] for r in metrics] == [1, 2, 3]
    assert all(0.0 <= r["reward"] <= 1.0 and r["time/generation_s"] > 0 and r["time/reward_s"] > 0 for r in metrics)
    completions = read_jsonl(out / "completions.jsonl")
    assert [c["step"] for c in completions] == [1] * 8 + [2] * 8 + [3] * 8
    # the logged step reward is the mean of that step's logged completion rewards
    step1 = [c["rewards"]["correctness"] for c in completions if c["step"] == 1]
    assert metrics[0]["reward"] == pytest.approx(sum(step1) / 8, abs=1e-6)
    assert completions[0]["task_id"].startswith("toy-") and completions[0]["reward_error"] is None
    assert (out / "config.yaml").is_file() and json.loads((out / "data_summary.json").read_text())["kept"] == 32


def test_saved_adapter_loads_with_peft_and_every_lora_weight_trained(tmp_path, base):
    from peft import PeftModel
    from molrl.models import load_model

    out = run_rl(toy_config(tmp_path, base, max_steps=2))
    model = PeftModel.from_pretrained(load_model(str(base)), str(out / "adapter"))
    assert model.peft_config["default"].r == 16
    weights = lora_tensors(out / "adapter")
    lora_b = [t for name, t in weights.items() if "lora_B" in name]
    assert lora_b and all(t.abs().sum() > 0 for t in lora_b)  # B starts at zero: every one was updated


def test_toy_reward_rises_over_thirty_steps(tmp_path, base):
    out = run_rl(toy_config(tmp_path, base, max_steps=30))
    rewards = step_rewards(out)
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    # seed 0 measured: 0.16 over the first five steps, 0.82 over the last five
    assert last > first + 0.3, rewards


def test_continue_mol_adapter_trains_it_and_keeps_a_frozen_mol_reference(tmp_path, base, mol):
    cfg = toy_config(tmp_path, base, max_steps=2, beta=0.1)
    cfg.model = RlModelSource(str(base), adapter=mol, adapter_mode="continue", reference="mol")
    cfg.lora = rl_lora()  # left unset: continue trains the adapter in its own shape
    trainer, policy, pool = build_trainer(cfg)
    try:
        trainer.train()
    finally:
        pool.close()
    start = lora_tensors(mol / "adapter")
    params = dict(trainer.model.named_parameters())
    for key, value in start.items():  # key: base_model.model.<module>.lora_B.weight
        ref = params[key.replace(".weight", ".ref.weight")]
        trained = params[key.replace(".weight", ".default.weight")]
        torch.testing.assert_close(ref.detach(), value)  # the reference copy never moved
        assert not torch.equal(trained.detach(), value)  # the policy's copy did


def test_mol_adapter_runs_save_adapters_peft_loads(tmp_path, base, mol):
    from peft import PeftModel
    from molrl.models import load_model

    for mode in ("continue", "merge_new"):
        cfg = toy_config(tmp_path / mode, base, max_steps=1)
        cfg.model = RlModelSource(str(base), adapter=mol, adapter_mode=mode)
        cfg.lora = rl_lora() if mode == "continue" else cfg.lora  # continue: the adapter's own shape
        out = run_rl(cfg)
        assert not (out / "adapter" / "ref").exists()
        if mode == "continue":  # the MoL adapter, trained further, on the original base
            model = PeftModel.from_pretrained(load_model(str(base)), str(out / "adapter"))
            assert model.peft_config["default"].r == 4
        else:  # a fresh adapter on the merged MoL model, and the whole merged policy
            merged = load_model(str(out / "model"))
            model = PeftModel.from_pretrained(load_model(str(base), adapter=mol / "adapter").merge_and_unload(),
                                              str(out / "adapter"))
            ids = torch.tensor([[60, 61, 62, 63]])
            torch.testing.assert_close(model.merge_and_unload()(ids).logits, merged(ids).logits, atol=1e-4, rtol=1e-4)


def test_rerun_resumes_from_the_last_checkpoint(tmp_path, base):
    run_rl(toy_config(tmp_path, base, max_steps=2, save_steps=2))
    out = run_rl(toy_config(tmp_path, base, max_steps=3, save_steps=2))
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl") if "reward" in r] == [1, 2, 3]
    assert sorted({c["step"] for c in read_jsonl(out / "completions.jsonl")}) == [1, 2, 3]


def test_resume_never_trains_a_finished_run_again_and_save_total_limit_reaches_trl(tmp_path, base):
    from molrl.rl.run import trl_args

    cfg = toy_config(tmp_path, base, max_steps=2)
    cfg.train.save_total_limit = 5
    assert trl_args(cfg, tmp_path / "checkpoints", False).save_total_limit == 5  # no longer fixed at 2
    run_rl(cfg)
    first = (tmp_path / "adapter" / "adapter_model.safetensors").stat().st_mtime_ns
    cfg.train.resume = "never"  # the re-run rule would say finished; never starts over
    run_rl(cfg)
    assert (tmp_path / "adapter" / "adapter_model.safetensors").stat().st_mtime_ns != first
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl") if "reward" in r] == [1, 2]


def test_cli_runs_the_shipped_tiny_config(tmp_path):
    from molrl.cli import main

    config = Path(__file__).resolve().parents[1] / "configs" / "rl_tiny.yaml"
    assert main(["rl", "--config", str(config), f"output_dir={tmp_path}", "train.max_steps=1",
                 "sampling.max_new_tokens=4"]) == 0
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()


def test_a_run_saved_with_the_old_engine_keys_is_the_same_run(tmp_path, base):
    """A run directory whose config.yaml predates the engine key (``use_vllm``, ``vllm_gpu_memory_utilization``, no
    ``train.save_total_limit`` / ``train.resume``) is finished, not refused, when the same command runs again."""
    import yaml

    cfg = toy_config(tmp_path, base, max_steps=1)
    cfg.engine = "transformers"  # what use_vllm=false reads as (auto may pick another sampler: a changed key for rl)
    run_rl(cfg)
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    saved["use_vllm"] = saved.pop("engine") == "vllm"
    saved["vllm_gpu_memory_utilization"] = saved.pop("engine_gpu_memory_utilization")
    for key in ("save_total_limit", "resume"):
        saved["train"].pop(key)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    first = (tmp_path / "adapter" / "adapter_model.safetensors").stat().st_mtime_ns
    run_rl(cfg)
    assert (tmp_path / "adapter" / "adapter_model.safetensors").stat().st_mtime_ns == first  # nothing trained
