"""Batched generation: order, determinism, and equivalence of batched and single prompts."""

import pytest

from molrl.chat import render
from molrl.engines.generation import SamplingConfig, TransformersGenerator
from molrl.models import load_model_and_tokenizer


def _prompts(tok):
    return [render(tok, [{"role": "user", "content": q}], add_generation_prompt=True) for q in ("hi", "what is 2+2? " * 3)]


def test_batched_greedy_equals_one_by_one():
    model, tok = load_model_and_tokenizer("tiny:chatml")
    gen = TransformersGenerator(model, tok, batch_size=2)
    sampling = SamplingConfig(max_new_tokens=6)
    prompts = _prompts(tok)
    batched = gen.generate(prompts, sampling)
    single = [gen.generate([p], sampling)[0] for p in prompts]
    assert batched == single
    assert all(len(c) == 1 for c in batched)


def test_sampling_is_seeded_and_returns_n():
    model, tok = load_model_and_tokenizer("tiny:llama3")
    gen = TransformersGenerator(model, tok)
    sampling = SamplingConfig(n=3, temperature=1.0, max_new_tokens=8, seed=7)
    first = gen.generate(_prompts(tok), sampling)
    assert [len(c) for c in first] == [3, 3]
    assert first == gen.generate(_prompts(tok), sampling)
    assert len(set(first[0])) > 1  # a random tiny model at T=1 does not repeat itself


@pytest.mark.parametrize("batch_size", [3, 8])
def test_a_static_cache_generates_the_dynamic_caches_tokens(batch_size):
    """Greedy and seeded sampled completions of prompts of several lengths (padded to the width bucket) are the same
    with a static KV cache as with the dynamic one."""
    from molrl.engines.generation import TransformersGenerator
    from molrl.engines.sampling import SamplingConfig
    from molrl.tiny import build_tiny_pair

    model, tok = build_tiny_pair("chatml", initializer_range=0.1)
    prompts = [("word " * n).strip() for n in (1, 7, 20, 33, 2, 15, 9, 40)]
    for sampling in (SamplingConfig(n=1, temperature=0.0, max_new_tokens=12),
                     SamplingConfig(n=2, temperature=1.0, max_new_tokens=12, seed=5)):
        dynamic = TransformersGenerator(model, tok, batch_size=batch_size).generate(prompts, sampling)
        static = TransformersGenerator(model, tok, batch_size=batch_size, static_cache=True).generate(prompts, sampling)
        assert static == dynamic
