"""Batched text generation: one interface for collection, evaluation and the GRPO eval hook.

``TransformersGenerator`` runs ``model.generate`` on CPU or GPU with left padding, prompts sorted
by length into batches; ``VLLMGenerator`` uses vLLM when it is installed. Both take rendered
prompts and return ``n`` completions per prompt. A ``molrl.chat.ChatPrompt`` (what molrl's stages
pass) is generated from the ids it carries, in which message content never became control tokens;
a plain string is taken as trusted template text and tokenised as it stands.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import torch

from molrl.chat import ChatPrompt
from molrl.sampling import SamplingConfig  # kept importable from here; defined torch-free for configs


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


class TransformersGenerator:
    """Generation with ``transformers`` ``model.generate``, batched by prompt length."""

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 16):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size

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
        out = self.model.generate(
            input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), **kwargs
        )  # [B * n, L + new]
        new_tokens = out[:, width:].tolist()
        texts = [self._decode(ids, sampling) for ids in new_tokens]
        return [texts[i * sampling.n : (i + 1) * sampling.n] for i in range(len(batch_ids))]

    def _decode(self, ids: list[int], sampling: SamplingConfig) -> Completion:
        """Text of the generated tokens, up to and without the first end-of-sequence token; truncated when all
        ``max_new_tokens`` were generated and neither an end-of-sequence token nor a stop string ended them (a row
        that stopped early is padded)."""
        eos = self.tokenizer.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos]) | {self.tokenizer.pad_token_id}
        truncated = len(ids) >= sampling.max_new_tokens
        for cut, token in enumerate(ids):
            if token in eos_ids:
                ids, truncated = ids[:cut], False
                break
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        return Completion(text, truncated and not any(text.endswith(stop) for stop in sampling.stop))


class VLLMGenerator:
    """Generation with vLLM (``pip install molrl[gpu]``) for a model directory."""

    def __init__(self, model_path: str, tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.85, **llm_kwargs: Any):
        try:
            from vllm import LLM
        except ImportError as err:
            raise ImportError("vLLM is not installed; install molrl[gpu] or use the transformers backend") from err
        self.llm = LLM(
            model=model_path,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            **llm_kwargs,
        )

    def generate(self, prompts: Sequence[str], sampling: SamplingConfig) -> list[list[str]]:
        """``n`` completions for each prompt, in prompt order."""
        from vllm import SamplingParams

        params = SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            max_tokens=sampling.max_new_tokens,
            seed=sampling.seed,
            stop=list(sampling.stop) or None,
            include_stop_str_in_output=True,
        )
        inputs = [{"prompt_token_ids": list(p.ids)} if isinstance(p, ChatPrompt) else p for p in prompts]
        outputs = self.llm.generate(inputs, params)
        return [[Completion(c.text, c.finish_reason == "length") for c in o.outputs] for o in outputs]
