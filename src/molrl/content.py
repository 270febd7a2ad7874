"""Content is text: message content is encoded without control tokens.

A tokenizer called on a string matches every added token inside it (``<|im_end|>``, ``<think>``,
``<tool_response>``), whether or not the token is marked special, and ``split_special_tokens``
splits only the special ones. So a program that prints ``<|im_end|>\\n<|im_start|>assistant``, or a
model turn that writes it as characters, would become real turn boundaries. Here content goes
through the tokenizer's own normaliser, pre-tokeniser and model with the added-token table left
out, so ``<|im_end|>`` in content is the ordinary tokens ``<``, ``|``, ``im`` ... and decodes back to
the same characters. Control ids come only from the chat template's own text
(``molrl.traces.spans.encode_rendering``).

Every added token counts as control, special or not (``control_ids``). Should a vocabulary's plain
model still produce one (a tokenizer whose BPE merges spell an added token), that token's
characters are encoded one by one instead, so the guarantee holds for any vocabulary.
"""

from __future__ import annotations

import json
import weakref
from typing import Any

_PLAIN: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def control_ids(tokenizer: Any) -> frozenset[int]:
    """Every id that is a control token: the special ids and every added token, special or not."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return frozenset(tokenizer.all_special_ids) | frozenset(int(i) for i in added)


def plain_backend(tokenizer: Any) -> Any:
    """The tokenizer's Rust backend without its added-token table (cached per tokenizer)."""
    cached = _PLAIN.get(tokenizer)
    if cached is not None:
        return cached
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} is not a fast (Rust) tokenizer; molrl encodes "
            "message content without control tokens through the fast backend: load it with use_fast=True"
        )
    from tokenizers import Tokenizer  # the Rust library transformers' fast tokenizers are built on

    spec = json.loads(backend.to_str())
    spec["added_tokens"] = []
    spec["post_processor"] = None  # no BOS/EOS added around content
    spec["truncation"] = spec["padding"] = None
    plain = Tokenizer.from_str(json.dumps(spec))
    _PLAIN[tokenizer] = plain
    return plain


def encode_content(tokenizer: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids of message content ``text`` with no control id among them, and each token's character offsets."""
    if not text:
        return [], []
    encoding = plain_backend(tokenizer).encode(text, add_special_tokens=False)
    ids, offsets = list(encoding.ids), [tuple(o) for o in encoding.offsets]
    control = control_ids(tokenizer)
    if not control.intersection(ids):
        return ids, offsets  # type: ignore[return-value]
    return _split_control(tokenizer, text, ids, offsets, control)


def _split_control(tokenizer: Any, text: str, ids: list[int], offsets: list[tuple[int, int]],
                   control: frozenset[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """Re-encode, character by character, each token the plain model still mapped to a control id."""
    plain = plain_backend(tokenizer)
    out_ids: list[int] = []
    out_offsets: list[tuple[int, int]] = []
    for token, (start, end) in zip(ids, offsets):
        if token not in control:
            out_ids.append(token)
            out_offsets.append((start, end))
            continue
        for pos in range(start, end):
            piece = plain.encode(text[pos], add_special_tokens=False)
            if control.intersection(piece.ids):
                raise ValueError(f"character {text[pos]!r} encodes to a control token in this vocabulary; "
                                 "it cannot be written as content")
            out_ids += piece.ids
            out_offsets += [(pos + s, pos + e) for s, e in piece.offsets]
    return out_ids, out_offsets
