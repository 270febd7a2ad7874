"""Tiny causal LMs and tokenizers built in-process: no downloads, seconds to make.

Used by the tests, the benchmarks and ``molrl demo``. The tokenizer is byte-level (every byte is
a token, no merges), so any text round-trips and character offsets are exact; it carries either
a Llama-3-style or a Qwen3/ChatML-style chat template.
"""

from __future__ import annotations

from typing import Literal

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

# A Llama-3-style template: header tokens per message, contents trimmed (so rendering is not a
# plain concatenation of the messages), tool feedback under the ``ipython`` header as Llama 3.1 does.
LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{- raise_exception('unknown role ' + message['role']) }}"
    "{%- endif %}"
    "{%- set role = 'ipython' if message['role'] == 'tool' else message['role'] %}"
    "{{- '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

# A compact ChatML template with Qwen3's thinking behaviour: <think> blocks of assistant turns
# before the last user message are dropped, and enable_thinking=false adds an empty think block.
CHATML_TEMPLATE = (
    "{%- set ns = namespace(last_query_index=messages|length - 1) %}"
    "{%- for message in messages %}{%- if message.role == 'user' %}{%- set ns.last_query_index = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.role in ['system', 'user'] %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set content = message.content %}{%- set reasoning = '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns.last_query_index and reasoning %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

_SPECIALS = {
    "llama3": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|pad|>"],
    "chatml": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_response>", "</tool_response>"],
}


def build_tiny_tokenizer(template: Literal["llama3", "chatml"] = "chatml") -> PreTrainedTokenizerFast:
    """A byte-level tokenizer (256 byte tokens + the template's special tokens) with a chat template."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    specials = _SPECIALS[template]
    if template == "llama3":
        tok = PreTrainedTokenizerFast(
            tokenizer_object=backend, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", pad_token="<|pad|>"
        )
        tok.add_special_tokens({"additional_special_tokens": specials[1:3]})
        tok.chat_template = LLAMA3_TEMPLATE
    else:
        tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
        tok.add_special_tokens({"additional_special_tokens": [s for s in specials if s not in ("<|im_end|>", "<|endoftext|>")]})
        tok.chat_template = CHATML_TEMPLATE
    return tok


def build_tiny_model(
    vocab_size: int,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_positions: int = 4096,
    seed: int = 0,
    **config_kwargs,
) -> Qwen3ForCausalLM:
    """A randomly initialised Qwen3 causal LM of the given size, deterministic for a seed."""
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        **config_kwargs,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    return model


def build_tiny_pair(template: Literal["llama3", "chatml"] = "chatml", seed: int = 0, **model_kwargs):
    """A (model, tokenizer) pair whose vocabularies match, with pad/eos ids wired into the config."""
    tok = build_tiny_tokenizer(template)
    model = build_tiny_model(len(tok), seed=seed, **model_kwargs)
    model.config.pad_token_id = tok.pad_token_id
    model.config.eos_token_id = tok.eos_token_id
    if model.generation_config is not None:
        model.generation_config.pad_token_id = tok.pad_token_id
        model.generation_config.eos_token_id = tok.eos_token_id
    return model, tok


def with_eos_logit(model: Qwen3ForCausalLM, eos_id: int, logit: float, seed: int = 0) -> Qwen3ForCausalLM:
    """Set the EOS row of the output embeddings so that EOS gets about ``logit`` at a typical state.

    A random tiny model almost never ends a completion by itself; with ``logit`` 2.0 (about 4% per
    token, varying by state) its completion lengths are spread and long-tailed, like real RL rollouts.
    The row points along the mean last hidden state of random token sequences.
    """
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (16, 40), generator=generator)
    with torch.no_grad():
        hidden = model.model(ids).last_hidden_state.reshape(-1, model.config.hidden_size).mean(0)
        model.lm_head.weight[eos_id] = hidden / hidden.norm() ** 2 * logit
    return model
