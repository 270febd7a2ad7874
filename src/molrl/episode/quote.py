"""Quoting program text in feedback: hidden characters made visible, length cut in tokens.

Feedback quotes what a program printed or raised, which can be anything. Two things keep a quote
safe to put in front of a model and into a trace:
  * ``visible``: characters that act rather than show (C0 and C1 controls other than newline and
    tab, DEL, the bidirectional overrides and isolates U+202A-U+202E and U+2066-U+2069) and lone
    surrogates (no tokenizer or UTF-8 file takes them) become escapes such as ``\\x00``, ``\\x1b``,
    ``\\u202e``; a backslash is left as it is, so escaping twice changes nothing;
  * ``clip``: a quote longer than its budget in tokens keeps its head (or tail) and says how many
    tokens it left out. 2,000 characters of a rare script are up to ~8,000 Qwen3 tokens, so a
    budget in characters does not bound what the model reads.
Both are pure functions; the tokenizer enters only as ``spans``, a function from a text to the
character span of each of its tokens (``token_spans``).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

Spans = Callable[[str], Sequence[tuple[int, int]]]
"""A text's tokens as ``(start, end)`` character spans, in order."""

_SURROGATE = re.compile("[\ud800-\udfff]")
_HIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def visible(text: str) -> str:
    """``text`` with control characters (not newline or tab), bidi overrides and lone surrogates escaped."""
    return _HIDDEN.sub(_escape, text)


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def byte_spans(text: str) -> list[tuple[int, int]]:
    """One span per UTF-8 byte (a character of n bytes gives n spans over it): more than any byte-level BPE makes."""
    return [(i, i + 1) for i, char in enumerate(text) for _ in range(len(char.encode("utf-8", "surrogatepass")))]


def token_spans(tokenizer: Any) -> Spans:
    """The spans of the tokens ``tokenizer`` makes of a text encoded as message content."""
    from molrl.content import encode_content

    # a tokenizer refuses lone surrogates; U+FFFD, one character too, keeps every span in place
    return lambda text: encode_content(tokenizer, _SURROGATE.sub("\ufffd", text))[1]


def clip(text: str, limit: int, keep: str = "head", spans: Spans | None = None) -> str:
    """``text`` cut to at most ``limit`` tokens, marker included, keeping its head or tail; the marker
    says how many tokens were left out.

    Without ``spans`` every UTF-8 byte counts as a token (the marker then counts bytes), a bound no
    byte-level BPE vocabulary exceeds. A character split over several tokens is kept whole or left out.
    """
    count = spans or byte_spans
    unit = "tokens" if spans else "bytes"
    tokens = count(text)
    if len(tokens) <= limit:
        return text
    budget = limit - len(count(_marker(len(tokens), unit, keep)))
    while True:
        kept = _cut(text, tokens, max(budget, 0), keep)
        marker = _marker(len(tokens) - len(count(kept)), unit, keep)
        out = kept + marker if keep == "head" else marker + kept
        excess = len(count(out)) - limit  # tokens can merge across the seam: measure the result
        if excess <= 0 or budget <= 0:
            return out
        budget -= excess


def _marker(omitted: int, unit: str, keep: str) -> str:
    if keep == "tail":
        return f"[... {omitted} earlier {unit} not shown]\n"
    return f"\n[... {omitted} more {unit} not shown]"


def _cut(text: str, tokens: Sequence[tuple[int, int]], n: int, keep: str) -> str:
    """The first (``keep='head'``) or last ``n`` tokens of ``text``, less any character they hold only part of."""
    if keep == "tail":
        if n == 0:
            return ""
        first = len(tokens) - n
        return text[tokens[first - 1][1]:] if first > 0 else text
    return text[: tokens[n][0]] if n < len(tokens) else text
