"""Evaluation in bfloat16 on CPU: a bf16 base with a float32 LoRA adapter (what RL and MoL save) generates.

Checked: the loaded generator holds bf16 base weights and float32 adapter weights, the adapter changes
what is generated, greedy bf16 generation picks the bf16 model's own argmax, and a whole ``run_eval``
writes finite metrics.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from grpo_helpers import save_mol_adapter, save_tiny_model
from molrl.config.blocks import ModelSource
from molrl.eval import EvalConfig, run_eval
from molrl.engines.builder import open_generator
from molrl.engines.generation import SamplingConfig
from molrl.sandbox import SandboxConfig

GREEDY = SamplingConfig(n=1, temperature=0.0, max_new_tokens=6)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bf16_eval")
    base = save_tiny_model(root / "base")
    return base, save_mol_adapter(base, root / "mol") / "adapter"


def config(out, base, adapter=None, **kw) -> EvalConfig:
    return EvalConfig(model=ModelSource(str(base), adapter=adapter, dtype="bfloat16"),
                      device="cpu", output_dir=out, sandbox=SandboxConfig(workers=1), **kw)


def load_generator(cfg: EvalConfig) -> tuple:
    """eval's generator for ``cfg``, from the builder collect and eval share."""
    return open_generator("eval", cfg, 0, batch_size=cfg.batch_size)


def test_bf16_generator_holds_a_bf16_base_and_a_float32_adapter_that_changes_the_answers(tmp_path, model_dirs):
    base, adapter = model_dirs
    with_adapter, tok = load_generator(config(tmp_path, base, adapter))
    dtypes = {("lora_" in name, p.dtype) for name, p in with_adapter.model.named_parameters()}
    assert dtypes == {(False, torch.bfloat16), (True, torch.float32)}
    plain, _ = load_generator(config(tmp_path, base))
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"What is {i} + {i}?"}], tokenize=False,
                                       add_generation_prompt=True) for i in range(4)]
    a, b = with_adapter.generate(prompts, GREEDY), plain.generate(prompts, GREEDY)
    assert all(isinstance(x[0], str) for x in a + b)
    assert a != b  # the float32 adapter really enters the bf16 forward


def test_greedy_bf16_generation_takes_the_bf16_forwards_argmax(tmp_path, model_dirs):
    base, adapter = model_dirs
    generator, tok = load_generator(config(tmp_path, base, adapter))
    prompt = tok.apply_chat_template([{"role": "user", "content": "Name a colour."}], tokenize=False,
                                     add_generation_prompt=True)
    ids = tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]  # [1, L]
    with torch.no_grad():
        logits = generator.model(input_ids=ids).logits[0, -1]  # [V] bf16
    first = generator.generate([prompt], SamplingConfig(n=1, temperature=0.0, max_new_tokens=1))[0][0]
    top = logits.float().topk(2)
    assert top.values[0] > top.values[1]  # no tie at this state: the argmax is well defined in bf16
    assert first == tok.decode([top.indices[0].item()])


def test_run_eval_in_bf16_writes_finite_metrics(shared_data, tmp_path, model_dirs):
    base, adapter = model_dirs
    cfg = config(tmp_path / "run", base, adapter, benchmarks=["math500", "mbpp"], limit=2, ks=[1, 2],
                 data={"math500": str(shared_data / "math500/test.jsonl"), "mbpp": str(shared_data / "mbpp/mbpp.jsonl")},
                 sampling=SamplingConfig(n=2, temperature=0.7, top_p=0.8, top_k=20, max_new_tokens=6))
    out = run_eval(cfg)
    results = json.loads((out / "results.json").read_text())
    for name, m in results["benchmarks"].items():
        assert (m["problems"], m["samples"]) == (2, 4), name
        assert math.isfinite(m["pass@1"]) and math.isfinite(m["pass@2"]), name
