"""Batched text generation: one interface for collection, evaluation and the RL stage's evaluation hook.

Every engine's generator takes rendered prompts and returns ``n`` completions per prompt (``Generator``), decoded
here (``decode_completion``) so a completion's text does not depend on the engine that sampled it.
``TransformersGenerator`` (``engine: transformers``) runs ``model.generate`` on CPU or GPU with left padding, prompts
sorted by length into batches; the other engines are their own modules (``molrl.engines.registry``). A
``molrl.chat.ChatPrompt`` (what molrl's stages pass) is generated from the ids it carries, in which message content
never became control tokens; a plain string is taken as trusted template text and tokenised as it stands.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import torch

from molrl.chat import ChatPrompt
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


def open_transformers(spec: Any) -> tuple[TransformersGenerator, Any]:
    """``engine: transformers``: the model (with its adapter) loaded in this process, and its tokenizer
    (``molrl.engines.builder.GeneratorSpec``)."""
    from molrl.models import default_device, load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(spec.model, dtype=spec.dtype, device=spec.device or default_device(),
                                                adapter=spec.adapter, seed=spec.model_seed)
    return TransformersGenerator(model, tokenizer, spec.batch_size, spec.static_cache), tokenizer
