"""Batched text generation: one interface for collection, evaluation and the GRPO eval hook.

``TransformersGenerator`` runs ``model.generate`` on CPU or GPU with left padding, prompts sorted
by length into batches; ``VLLMGenerator`` uses vLLM when it is installed. Both take rendered
prompts and return ``n`` completions per prompt. A ``molrl.chat.ChatPrompt`` (what molrl's stages
pass) is generated from the ids it carries, in which message content never became control tokens;
a plain string is taken as trusted template text and tokenised as it stands.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Protocol, Sequence

import torch

from molrl.chat import ChatPrompt
from molrl.errors import MolrlError
from molrl.engines.sampling import SamplingConfig  # kept importable from here; defined torch-free for configs


class Completion(str):
    """A generated text that knows whether generation stopped at ``max_new_tokens`` before the model ended it."""

    truncated: bool
    """The token limit cut it: no end-of-sequence token or stop string came within ``max_new_tokens``."""

    def __new__(cls, text: str, truncated: bool = False) -> "Completion":
        completion = super().__new__(cls, text)
        completion.truncated = truncated
        return completion

    def __reduce__(self) -> Any:
        return (Completion, (str(self), self.truncated))


class Generator(Protocol):
    """Anything that turns rendered prompts into completions."""

    def generate(self, prompts: Sequence[str], sampling: SamplingConfig) -> list[list[str]]:
        """``n`` completions for each prompt, in prompt order."""
        ...


def prompt_ids(tokenizer: Any, prompt: str) -> list[int]:
    """The token ids generation starts from: a ``ChatPrompt``'s own, or a plain string's tokenisation."""
    if isinstance(prompt, ChatPrompt):
        return list(prompt.ids)
    return tokenizer(prompt, add_special_tokens=False)["input_ids"]


STATIC_WIDTH_BUCKET = 64
"""With a static cache, prompts are left-padded to a multiple of this many tokens, so that a run compiles its
decoding step for a few widths, not one per batch."""


class TransformersGenerator:
    """Generation with ``transformers`` ``model.generate``, batched by prompt length.

    ``static_cache``: a static KV cache, with which ``generate`` compiles its decoding step on a GPU (on an H100 at
    0.6B shape, batch 8: 5.95 ms a step against 36.9 eager; benchmarks/RESULTS.md). Each new (batch, width) shape
    compiles once, about a minute, so it pays on long runs of same-shaped batches; the outputs are the dynamic
    cache's."""

    engine = "transformers"
    """The engine's name, as ``engine`` names it and as records of what made a sample keep it."""

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 16, static_cache: bool = False):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.static_cache = static_cache

    @torch.no_grad()
    def generate(self, prompts: Sequence[str], sampling: SamplingConfig) -> list[list[str]]:
        """``n`` completions for each prompt, in prompt order."""
        encoded = [prompt_ids(self.tokenizer, p) for p in prompts]
        order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))
        results: list[list[str]] = [[] for _ in prompts]
        was_training = self.model.training
        self.model.eval()
        torch.manual_seed(sampling.seed)
        try:
            for start in range(0, len(order), self.batch_size):
                batch = order[start : start + self.batch_size]
                for i, texts in zip(batch, self._generate_batch([encoded[i] for i in batch], sampling)):
                    results[i] = texts
        finally:
            self.model.train(was_training)
        return results

    def _generate_batch(self, batch_ids: list[list[int]], sampling: SamplingConfig) -> list[list[str]]:
        tok = self.tokenizer
        width = max(len(ids) for ids in batch_ids)
        if self.static_cache:  # a few widths, each compiled once
            width = -(-width // STATIC_WIDTH_BUCKET) * STATIC_WIDTH_BUCKET
        pad = tok.pad_token_id
        input_ids = torch.full((len(batch_ids), width), pad, dtype=torch.long)  # [B, L] left-padded
        attention_mask = torch.zeros_like(input_ids)
        for row, ids in enumerate(batch_ids):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            attention_mask[row, width - len(ids) :] = 1
        device = next(self.model.parameters()).device
        kwargs: dict[str, Any] = dict(
            max_new_tokens=sampling.max_new_tokens,
            num_return_sequences=sampling.n,
            pad_token_id=pad,
            eos_token_id=tok.eos_token_id,
        )
        if sampling.temperature > 0:
            kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=tok)
        if self.static_cache:
            kwargs["cache_implementation"] = "static"
        out = self.model.generate(
            input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), **kwargs
        )  # [B * n, L + new]
        new_tokens = out[:, width:].tolist()
        texts = [decode_completion(self.tokenizer, ids, sampling) for ids in new_tokens]
        return [texts[i * sampling.n : (i + 1) * sampling.n] for i in range(len(batch_ids))]


def end_ids(tokenizer: Any) -> set[int]:
    """The token ids that end a completion: the tokenizer's end-of-sequence token(s) and its pad token."""
    eos = tokenizer.eos_token_id
    return set(eos if isinstance(eos, list) else [eos]) | {tokenizer.pad_token_id}


def decode_completion(tokenizer: Any, ids: Sequence[int], sampling: SamplingConfig) -> Completion:
    """Text of the generated tokens, up to and without the first end token (``end_ids``); truncated when all
    ``max_new_tokens`` were generated and neither an end token nor a stop string ended them. Both engines decode
    through here, so a completion's text does not depend on the engine that sampled it."""
    ends = end_ids(tokenizer)
    ids = list(ids)
    truncated = len(ids) >= sampling.max_new_tokens
    for cut, token in enumerate(ids):
        if token in ends:
            ids, truncated = ids[:cut], False
            break
    text = tokenizer.decode(ids, skip_special_tokens=False)
    return Completion(text, truncated and not any(text.endswith(stop) for stop in sampling.stop))


VLLM_LORA_MODULES = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
"""Adapted modules vLLM serves as a LoRA adapter; an adapter on others (the head, the embeddings) is merged into a
copy of the model instead."""
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM accepts."""


def vllm_serves_lora(rank: int, modules: Any) -> bool:
    """Whether vLLM can serve a LoRA adapter of this rank on these modules (else it is merged into a copy)."""
    return frozenset(modules) <= VLLM_LORA_MODULES and rank <= VLLM_LORA_RANKS[-1]


def check_policy_lora(engine: str, rank: int, modules: Any) -> None:
    """Refuse, in one line with the fix, a trained adapter the RL engine ``engine`` cannot serve as vLLM LoRA."""
    if not vllm_serves_lora(rank, modules):
        raise MolrlError(f"engine={engine} serves the trained adapter as vLLM LoRA, which takes ranks up to "
                         f"{VLLM_LORA_RANKS[-1]} on {', '.join(sorted(VLLM_LORA_MODULES))}; this one has rank {rank} "
                         f"on {', '.join(sorted(modules))}: set lora.target_modules to those modules, or "
                         "engine=transformers")


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
        from molrl.engines.choice import install_hint

        raise ImportError(f"vLLM is not installed: {install_hint()}; or use engine=transformers") from err
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
            from molrl.engines.export import adapter_shape

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


def merge_adapter_copy(model_path: str, adapter: str, out: str) -> None:
    """Save ``model_path`` with ``adapter`` merged into it (``molrl.engines.export.merged_model``), and its tokenizer,
    to ``out``."""
    from molrl.models import load_tokenizer
    from molrl.engines.export import merged_model

    merged_model(model_path, adapter).save_pretrained(out)
    load_tokenizer(model_path).save_pretrained(out)
