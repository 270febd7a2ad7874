"""vLLM in this process (``engine: vllm``): the engine started and stopped, and the text generator on it.

The engine runs in the stage's own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as TRL's colocate mode): no spawned
workers, no ``__main__`` guard needed. An adapter is served as vLLM LoRA, or, where vLLM cannot serve it, merged into
a temporary copy of the model (``molrl.engines.adapters``). Prompts go in as token ids and completions are decoded as
every engine's are (``molrl.engines.generation.decode_completion``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

import torch

from molrl.engines.adapters import VLLM_LORA_RANKS, adapter_shape, merge_adapter_copy, vllm_serves_lora
from molrl.engines.generation import decode_completion, end_ids, prompt_ids
from molrl.engines.sampling import SamplingConfig


def start_llm(model_path: str, *, dtype: str = "auto", seed: int = 0, lora_rank: int | None = None,
              tensor_parallel_size: int = 1, gpu_memory_utilization: float | None = None,
              max_model_len: int | None = None, **llm_kwargs: Any) -> Any:
    """A vLLM ``LLM`` for ``model_path`` in this process, serving LoRA adapters up to ``lora_rank`` (one at a time)
    when given; on a CPU it starts under the stage's thread count (``molrl.cpu.engine_environment``), and the
    process's thread setting and environment are kept (``process_settings_kept``)."""
    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    on_gpu = torch.cuda.is_available()
    threads: dict[str, str] = {}
    if not on_gpu:
        from molrl.cpu import engine_environment

        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        threads = engine_environment(torch.get_num_threads(), os.environ)  # the stage's thread policy
    try:
        from vllm import LLM
    except ImportError as err:
        from molrl.engines.registry import vllm_install_hint

        raise ImportError(f"vLLM is not installed: {vllm_install_hint()}; or use engine=transformers") from err
    from molrl.models import DTYPES

    if dtype in DTYPES:  # molrl's dtype names (bf16, fp32, ...) as vLLM spells them
        dtype = str(DTYPES[dtype]).removeprefix("torch.")
    kwargs: dict[str, Any] = dict(llm_kwargs)
    # On a CPU the compiled model starts in 77 s and the eager one in 10, at the same tokens per second
    # (benchmarks/RESULTS.md, "Generation engines on this machine").
    kwargs.setdefault("enforce_eager", not on_gpu)
    if lora_rank is not None:
        kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=next(r for r in VLLM_LORA_RANKS if r >= lora_rank))
    with process_settings_kept():
        os.environ.update(threads)  # OMP_NUM_THREADS is put back once the engine has started
        return LLM(model=model_path, dtype=dtype, seed=seed, tensor_parallel_size=tensor_parallel_size,
                   gpu_memory_utilization=gpu_memory_utilization or (0.85 if on_gpu else 0.3),
                   max_model_len=max_model_len, **kwargs)


def stop_llm(llm: Any) -> None:
    """Shut an in-process vLLM ``LLM`` down and give its memory back. vLLM freezes the objects it makes at start
    (weights, KV cache) out of the garbage collector's sight, and only its engine core's shutdown thaws them, so an
    engine merely dropped stays in memory: a process that starts one engine after another (the pipeline's evaluations,
    a test suite) grew by about a gigabyte an engine on a CPU."""
    import gc

    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None:
        core.shutdown()
    del llm, core
    gc.collect()


class VLLMGenerator:
    """Generation with vLLM for a model directory, with a PEFT adapter served as vLLM LoRA (or, where vLLM cannot
    serve it, merged into a temporary copy of the model that the generator removes when closed).

    The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as TRL's colocate mode): no spawned
    workers, no ``__main__`` guard needed. On a CPU its KV cache takes ``VLLM_CPU_KVCACHE_SPACE`` GiB (default 1).
    """

    engine = "vllm"
    """The engine's name, as ``engine`` names it and as records of what made a sample keep it."""

    def __init__(self, model_path: str, tokenizer: Any, adapter: str | None = None, dtype: str = "auto", seed: int = 0,
                 tensor_parallel_size: int = 1, gpu_memory_utilization: float | None = None,
                 max_model_len: int | None = None, **llm_kwargs: Any):
        import tempfile

        self.tokenizer, self.lora, self._merged_dir = tokenizer, None, None
        lora_rank = None
        if adapter is not None:
            rank, modules = adapter_shape(adapter)
            if vllm_serves_lora(rank, modules):
                from vllm.lora.request import LoRARequest

                lora_rank = rank
                self.lora = LoRARequest("adapter", 1, str(adapter))
            else:  # the head or embeddings adapted: generate from a merged copy
                self._merged_dir = tempfile.TemporaryDirectory(prefix="molrl-merged-")
                merge_adapter_copy(model_path, adapter, self._merged_dir.name)
                model_path = self._merged_dir.name
        self.llm = start_llm(model_path, dtype=dtype, seed=seed, lora_rank=lora_rank,
                             tensor_parallel_size=tensor_parallel_size,
                             gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len, **llm_kwargs)

    def generate(self, prompts: Sequence[str], sampling: SamplingConfig) -> list[list[str]]:
        """``n`` completions for each prompt, in prompt order."""
        return vllm_generate(self.llm, self.tokenizer, prompts, sampling, self.lora)

    def close(self) -> None:
        """Shut the engine down (its memory given back) and remove the merged copy of the model, if one was made;
        the generator generates no more."""
        llm, self.llm = self.llm, None
        if llm is not None:
            stop_llm(llm)
        if self._merged_dir is not None:
            self._merged_dir.cleanup()
            self._merged_dir = None


def open_vllm(spec: Any) -> tuple[VLLMGenerator, Any]:
    """``engine: vllm``: the engine started on the model (its adapter as LoRA, or merged into a copy), and the
    model's tokenizer (``molrl.engines.builder.GeneratorSpec``)."""
    from molrl.models import load_tokenizer

    tokenizer = load_tokenizer(spec.model)
    return VLLMGenerator(spec.model, tokenizer, adapter=spec.adapter, dtype=spec.dtype, seed=spec.seed), tokenizer


def vllm_generate(llm: Any, tokenizer: Any, prompts: Sequence[str], sampling: SamplingConfig,
                  lora: Any = None) -> list[list[str]]:
    """``n`` completions for each prompt from a vLLM ``llm`` (with the LoRA adapter ``lora``), in prompt order,
    decoded as transformers' are (``decode_completion``)."""
    from vllm import SamplingParams

    params = SamplingParams(
        n=sampling.n,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k if sampling.top_k > 0 else -1,
        max_tokens=sampling.max_new_tokens,
        # a seed per request on a GPU; on a CPU vLLM 0.30 fails on one ("CPU Generator does not use offset") once a
        # batch's prefill is split, so there the engine's own seed (``start_llm``'s) makes runs repeat
        seed=sampling.seed if torch.cuda.is_available() else None,
        stop=list(sampling.stop) or None,
        include_stop_str_in_output=True,
        stop_token_ids=sorted(end_ids(tokenizer)),  # the pad token ends a completion too, as in transformers
    )
    inputs = [{"prompt_token_ids": prompt_ids(tokenizer, p)} for p in prompts]  # ids in: nothing re-tokenised
    outputs = llm.generate(inputs, params, lora_request=lora, use_tqdm=False)
    return [[decode_completion(tokenizer, c.token_ids, sampling) for c in o.outputs] for o in outputs]


HOST_ENVIRONMENT = ("LD_PRELOAD", "LD_LIBRARY_PATH", "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS")
"""Variables vLLM's CPU worker sets for the whole process that the stage around the engine reads (the sandbox's
child processes, molrl.cpu's share of the cores): put back as they were once the engine has started."""


@contextlib.contextmanager
def process_settings_kept() -> Iterator[None]:
    """Start an in-process engine without it changing the process for the stage around it: vLLM's CPU worker
    replaces ``torch.set_num_threads`` with a no-op for the whole process (the stage's thread policy would stop
    working) and sets ``HOST_ENVIRONMENT`` variables; both are put back."""
    import os

    set_threads, saved = torch.set_num_threads, {k: os.environ.get(k) for k in HOST_ENVIRONMENT}
    try:
        yield
    finally:
        torch.set_num_threads = set_threads
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
