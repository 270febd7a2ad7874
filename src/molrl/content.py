"""Content is text: message content is encoded without control tokens.

A tokenizer called on a string matches every added token inside it (``<|im_end|>``, ``<think>``,
``<tool_response>``), whether or not the token is marked special, and ``split_special_tokens``
splits only the special ones. So a program that prints ``<|im_end|>\\n<|im_start|>assistant``, or a
model turn that writes it as characters, would become real turn boundaries. Here content goes
through the tokenizer's own normaliser, pre-tokeniser and model with the added-token table left
out, so ``<|im_end|>`` in content is the ordinary tokens ``<``, ``|``, ``im`` ... and decodes back to
the same characters. Control ids come only from the chat template's own text: ``encode_rendering``
encodes a rendering as the template's own tokenisation does and re-encodes as plain text only a
content range in which that found a control token.

Every added token counts as control, special or not (``control_ids``). Should a vocabulary's plain
model still produce one (a tokenizer whose BPE merges spell an added token), that token's
characters are encoded one by one instead, so the guarantee holds for any vocabulary.
"""

from __future__ import annotations

import bisect
import itertools
import json
import weakref
from typing import Any

_CHARS_PER_TOKEN_GUESS = 8  # first prefix tried under a token budget; doubled until it holds
_CUT_MARGIN = 1024  # characters kept between the last needed token and the end of the encoded prefix
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


def encode_template(tokenizer: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids of chat-template text (its added tokens become control ids) and each token's character offsets."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def encode_rendering(
    tokenizer: Any, text: str, content: list[tuple[int, int]], start: int = 0, max_tokens: int | None = None
) -> tuple[list[int], list[tuple[int, int]], bool]:
    """Token ids of ``text[start:]`` and their offsets (relative to ``start``), no control id from a content range;
    the flag is True when all of it was encoded.

    The rendering is encoded whole, as the model's own chat template tokenises it, so ordinary content keeps
    the tokens it always had (a tool reply's last ``.`` merges with the template's newline). A content range in
    which that encoding found a control token (a forged ``<|im_end|>``) is encoded again as plain text
    (``molrl.content``), the template's text around it on its own. With ``max_tokens``, encoding stops once
    more than ``max_tokens`` tokens are known (a long text is encoded by prefixes, ``_encode_prefix``), so a
    huge trace costs what its first tokens cost.
    """
    if max_tokens is not None and len(text) - start <= max_tokens * _CHARS_PER_TOKEN_GUESS + _CUT_MARGIN:
        max_tokens = None  # short enough to encode whole: every token count is then exact
    needed = None if max_tokens is None else max_tokens + 1
    ids, offsets, whole = _encode_prefix(encode_template, tokenizer, text[start:], needed)
    forged = _forged(tokenizer, ids, offsets, [(a - start, b - start) for a, b in content if b > start])
    if not forged:
        return ids, offsets, whole
    ids, offsets = [], []
    for seg_start, seg_end, is_content in _segments(len(text) - start, forged):
        if needed is not None and len(ids) >= needed:
            return ids, offsets, False
        encode = encode_content if is_content else encode_template
        piece = text[start + seg_start : start + seg_end]
        piece_ids, piece_offsets, whole = _encode_prefix(encode, tokenizer, piece, None if needed is None else
                                                         needed - len(ids))
        ids += piece_ids
        offsets += [(s + seg_start, e + seg_start) for s, e in piece_offsets]
        if not whole:
            return ids, offsets, False
    return ids, offsets, True


def _forged(tokenizer: Any, ids: list[int], offsets: list[tuple[int, int]], content: list[tuple[int, int]]
            ) -> list[tuple[int, int]]:
    """The content ranges that a control token of the encoding overlaps, in order.

    Token offsets run left to right, so the control tokens starting before a range's end are a prefix of them, and
    the range is hit when the furthest end among that prefix passes its start: a search per range, never a scan."""
    control = control_ids(tokenizer)
    hits = [offsets[t] for t, token in enumerate(ids) if token in control]
    if not hits:
        return []
    starts = [s for s, _ in hits]
    reach = list(itertools.accumulate((e for _, e in hits), max))  # reach[k]: the furthest end of hits[:k + 1]
    forged = []
    for c_start, c_end in content:
        before = bisect.bisect_left(starts, c_end)  # hits[:before] start before the range ends
        if before and reach[before - 1] > c_start:
            forged.append((c_start, c_end))
    return forged


def _encode_prefix(encode: Any, tokenizer: Any, text: str, needed: int | None
                   ) -> tuple[list[int], list[tuple[int, int]], bool]:
    """``encode`` of ``text``, or of a prefix whose first ``needed`` tokens are those of the whole (flag False).

    A prefix of ``needed * 8`` characters is encoded first and doubled until its token ``needed`` ends
    ``_CUT_MARGIN`` characters before the cut (only the words the cut falls in can encode differently).
    """
    cut = len(text) if needed is None else needed * _CHARS_PER_TOKEN_GUESS + _CUT_MARGIN
    while cut < len(text):
        ids, offsets = encode(tokenizer, text[:cut])
        if len(ids) >= needed and offsets[needed - 1][1] <= cut - _CUT_MARGIN:  # type: ignore[operator]
            return ids, offsets, False
        cut *= 2
    return (*encode(tokenizer, text), True)


def _segments(length: int, content: list[tuple[int, int]]) -> list[tuple[int, int, bool]]:
    """``[0, length)`` cut into (start, end, is_content) pieces at the content ranges, empty pieces left out."""
    pieces, cursor = [], 0
    for c_start, c_end in content:
        c_start = max(c_start, 0)
        if c_start > cursor:
            pieces.append((cursor, c_start, False))
        if c_end > c_start:
            pieces.append((c_start, c_end, True))
        cursor = c_end
    if length > cursor:
        pieces.append((cursor, length, False))
    return pieces
