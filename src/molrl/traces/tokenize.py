"""Tokenise a trace with the model's own chat template and label every token with its role.

Roles: ``prompt`` (system and user text), ``decision`` (what the model wrote: assistant turns),
``feedback`` (what the environment wrote: tool messages), ``template`` (role headers, special
tokens and anything else the chat template adds).

How the labels are found. The trace is rendered ONCE with ``molrl.chat.render`` and tokenised
with character offsets. Templates are not prefix-preserving (Qwen3 drops ``<think>`` from
assistant turns before the last user query, inserts empty think blocks, Llama trims contents), so
per-turn renderings cannot be concatenated. Instead the same messages are rendered a second time
with each content replaced by a unique placeholder (keeping its leading/trailing whitespace and
its think structure, so the template takes the same branches). The placeholder rendering gives
the template text around every content exactly; walking both renderings side by side locates
each message's (template-transformed) content in the real text. A token belongs to a message if
its characters overlap that message's content span. A message the template dropped (e.g. an
unknown role), reordered, repeated or rewrote is an error, never a silent loss.

Decision-token rule for assistant turns:
  * the turn's text as rendered, including its ``<think>`` ... ``</think>`` block when the
    template keeps a non-empty one (the model writes those tags when thinking);
  * an EMPTY think block (``<think>\\n\\n</think>``, written by the template or the trace) is
    template, unless ``empty_think_is_decision`` (training on empty think blocks teaches a model
    to stop thinking);
  * the end-of-turn token right after every assistant turn (``<|im_end|>``, ``<|eot_id|>``,
    ``</s>``: the first non-whitespace token after the turn's text, when it is a special/added
    token) is decision, with any whitespace tokens before it, so the model learns to stop. Every
    turn, not only the last: in an agent loop each turn is a generation the model ends itself.

Truncation (``max_length``): ``drop`` rejects a longer trace; ``truncate`` keeps the first
``max_length`` tokens and records in ``notes`` which message the cut fell inside (a cut inside a
feedback span is always reported there, never silent). Only a prefix of the rendering long enough
for ``max_length`` tokens is tokenised (``encode_prefix``), so a huge record costs no more than a
long one.
"""

from __future__ import annotations

import bisect
import logging
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from molrl.chat import render
from molrl.errors import DataError
from molrl.traces.schema import Reject, Trace, TraceError, read_traces

log = logging.getLogger("molrl.traces")

ROLE_OF = {"system": "prompt", "user": "prompt", "assistant": "decision", "tool": "feedback"}
TOKEN_ROLES = ("prompt", "decision", "feedback", "template")
IGNORE_INDEX = -100
_THINK = re.compile(r"(\s*<think>\s*)(.*?)(\s*</think>\s*)(.*?)(\s*)\Z", re.S)
_EMPTY_THINK_AT_END = re.compile(r"<think>\s*</think>\s*\Z")
UNLIMITED_CHARS = 4_000_000
"""Longest rendering tokenised whole when there is no max_length (~1M tokens, seconds)."""
_CHARS_PER_TOKEN_GUESS = 8  # first prefix tried under a max_length; doubled until it holds
_CUT_MARGIN = 1024  # characters kept between token max_length and the end of the tokenised prefix


@dataclass
class TokenizeConfig:
    """How traces become training tokens."""

    max_length: int | None = 8192
    """Longest tokenised trace kept; None for no limit."""
    truncation: Literal["drop", "truncate"] = "drop"
    """Over max_length: drop the trace (an error naming it) or keep the first max_length tokens (cut reported)."""
    enable_thinking: bool = True
    """Passed to the chat template (Qwen3 adds an empty think block when false)."""
    empty_think_is_decision: bool = False
    """Count empty <think></think> blocks as decision tokens (default no: it teaches the model to stop thinking)."""
    require_feedback: bool = True
    """A trace without feedback tokens is an error (MoL learns from feedback); false allows it."""
    require_decision: bool = True
    """A trace without decision tokens is an error; false allows it (it still carries feedback CE)."""


@dataclass
class TokenizedTrace:
    """One trace as token ids with per-token role masks (all lists have the same length)."""

    input_ids: list[int]
    """Token ids of the full rendering."""
    decision_mask: list[bool]
    """Tokens the model wrote (assistant turns, their end-of-turn tokens)."""
    feedback_mask: list[bool]
    """Tokens the environment wrote (tool messages)."""
    prompt_mask: list[bool]
    """System and user text."""
    template_mask: list[bool]
    """Role headers, special tokens and other template text."""
    labels: list[int]
    """input id where decision or feedback, else -100 (for plain next-token CE)."""
    token_message: list[int]
    """Index of the message each token belongs to (-1 for template tokens)."""
    kind: str = "domain"
    """The trace's data kind (meta.kind): domain or general."""
    n_empty_think: int = 0
    """Empty think blocks found in the rendering."""
    truncated: bool = False
    """Whether tokens were cut at max_length."""
    notes: list[str] = field(default_factory=list)
    """Things the caller should report (e.g. a cut inside a feedback span)."""

    @property
    def n_tokens(self) -> int:
        """Total tokens."""
        return len(self.input_ids)

    @property
    def n_decision(self) -> int:
        """Decision tokens."""
        return sum(self.decision_mask)

    @property
    def n_feedback(self) -> int:
        """Feedback tokens."""
        return sum(self.feedback_mask)

    @property
    def n_prompt(self) -> int:
        """Prompt tokens."""
        return sum(self.prompt_mask)

    @property
    def n_template(self) -> int:
        """Template tokens."""
        return sum(self.template_mask)

    def roles(self) -> list[str]:
        """The role name of every token."""
        return [
            "decision" if d else "feedback" if f else "prompt" if p else "template"
            for d, f, p in zip(self.decision_mask, self.feedback_mask, self.prompt_mask)
        ]


@dataclass
class Span:
    """Characters ``[start, end)`` of the rendering written by one message, with its role."""

    start: int
    """First character."""
    end: int
    """One past the last character."""
    role: str
    """prompt, decision or feedback."""
    message: int
    """Index of the message in the trace."""


@dataclass
class _Piece:
    message: int
    part: Literal["reasoning", "content"]
    core: str
    sentinel: str


def tokenize_trace(trace: Trace, tokenizer: Any, cfg: TokenizeConfig | None = None) -> TokenizedTrace:
    """Render ``trace`` with the tokenizer's chat template and label each token; raises ``TraceError``."""
    cfg = cfg or TokenizeConfig()
    if not getattr(tokenizer, "is_fast", False):
        raise TraceError("tokenisation needs a fast (Rust) tokenizer for character offsets")
    text, spans, n_empty = locate_spans(tokenizer, trace.messages, cfg.enable_thinking, cfg.empty_think_is_decision)
    ids, offsets, whole = encode_prefix(tokenizer, text, cfg.max_length)
    roles, owner = _label_tokens(offsets, spans)
    _mark_end_of_turn(tokenizer, text, ids, offsets, spans, roles, owner)
    notes: list[str] = []
    truncated = False
    if cfg.max_length is not None and len(ids) > cfg.max_length:
        if cfg.truncation == "drop":
            count = f"{len(ids)} tokens" if whole else f"more than {len(ids)} tokens ({len(text):,} characters)"
            raise TraceError(
                f"trace has {count}, over max_length {cfg.max_length}; raise max_length or set truncation=truncate"
            )
        notes += _describe_cut(trace, roles, owner, cfg.max_length, whole)
        ids, offsets = ids[: cfg.max_length], offsets[: cfg.max_length]
        roles, owner = roles[: cfg.max_length], owner[: cfg.max_length]
        truncated = True
    result = _build(ids, roles, owner, trace.kind, n_empty, truncated, notes)
    if cfg.require_decision and result.n_decision == 0:
        raise TraceError("no decision tokens: no assistant text survives tokenisation (or truncation)")
    if cfg.require_feedback and result.n_feedback == 0:
        raise TraceError(
            "no feedback tokens: the trace has no tool messages (or truncation cut them); "
            "MoL learns from environment feedback; filter with --min-feedback-turns 1"
        )
    verify_feedback(trace, result, tokenizer)
    return result


def encode_prefix(
    tokenizer: Any, text: str, max_length: int | None
) -> tuple[list[int], list[tuple[int, int]], bool]:
    """Token ids and character offsets of ``text``, or of a prefix that holds its first ``max_length`` tokens.

    With a ``max_length``, a prefix of ``max_length * 8`` characters is tokenised first and doubled
    until token ``max_length`` ends ``_CUT_MARGIN`` characters before the cut (only the words the
    cut falls in can tokenise differently), so a 50 MB trace costs what its first tokens cost.
    The flag is True when the whole text was tokenised. Without a ``max_length``, a text over
    ``UNLIMITED_CHARS`` is refused: counting all its tokens would take minutes and gigabytes.
    """
    if max_length is None and len(text) > UNLIMITED_CHARS:
        raise TraceError(
            f"trace renders to {len(text):,} characters, more than the {UNLIMITED_CHARS:,} tokenised whole when "
            "there is no max_length; set max_length with truncation=truncate (traces stats: --max-length N "
            "--truncation truncate) to use its first N tokens, or cut the trace"
        )
    cut = len(text) if max_length is None else max_length * _CHARS_PER_TOKEN_GUESS + _CUT_MARGIN
    while cut < len(text):
        ids, offsets = _encode(tokenizer, text[:cut])
        if len(ids) > max_length and offsets[max_length][1] <= cut - _CUT_MARGIN:  # type: ignore[operator]
            return ids, offsets, False
        cut *= 2
    return (*_encode(tokenizer, text), True)


def _encode(tokenizer: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def tokenize_file(
    path: str | Path, tokenizer: Any, cfg: TokenizeConfig | None = None, strict: bool = False
) -> tuple[list[tuple[int, TokenizedTrace]], list[Reject]]:
    """Tokenise every trace in a file: ``[(line_no, tokenized)]`` and the rejects (file, line, reason).

    Invalid records and traces that cannot be tokenised (no feedback, no decision tokens, too
    long) become rejects; ``strict`` raises ``DataError`` on the first instead. Truncation notes
    are logged with file and line.
    """
    reader = read_traces(path, strict=strict)
    done, failed = [], []
    for line_no, trace in reader:
        try:
            tokenized = tokenize_trace(trace, tokenizer, cfg)
        except TraceError as err:
            if strict:
                raise DataError(str(path), line_no, str(err)) from None
            failed.append(Reject(str(path), line_no, str(err), trace.to_json()))
            continue
        for note in tokenized.notes:
            log.warning("%s:%d: %s", path, line_no, note)
        done.append((line_no, tokenized))
    return done, sorted(reader.rejects + failed, key=lambda r: r.line)


def locate_spans(
    tokenizer: Any, messages: list[dict[str, str]], enable_thinking: bool = True, empty_think_is_decision: bool = False
) -> tuple[str, list[Span], int]:
    """The rendering, the character span each message's content occupies in it, and the empty-think count."""
    text = _render(tokenizer, messages, enable_thinking)
    tag = uuid.uuid4().hex[:8].upper()
    while tag in text:
        tag = uuid.uuid4().hex[:8].upper()
    skel_messages, pieces = _skeleton(messages, tag)
    skel = _render(tokenizer, skel_messages, enable_thinking)
    placed = _place(skel, pieces, messages)
    regions: dict[tuple[int, str], tuple[int, int, int]] = {}  # (message, part) -> (literal start, start, end)
    cursor = skel_cursor = 0
    for pos, piece in placed:
        literal = skel[skel_cursor:pos]
        if not text.startswith(literal, cursor):
            raise _mismatch(piece.message, messages, literal, text[cursor : cursor + len(literal)])
        lit_start, cursor = cursor, cursor + len(literal)
        if not text.startswith(piece.core, cursor):
            raise TraceError(
                f"message {piece.message} ({messages[piece.message]['role']}): the chat template changed its text "
                "beyond whitespace; cannot label its tokens exactly"
            )
        regions[(piece.message, piece.part)] = (lit_start, cursor, cursor + len(piece.core))
        cursor += len(piece.core)
        skel_cursor = pos + len(piece.sentinel)
    if text[cursor:] != skel[skel_cursor:]:
        raise _mismatch(len(messages) - 1, messages, skel[skel_cursor:], text[cursor:])
    return text, *_spans(text, messages, regions, empty_think_is_decision)


@dataclass
class TailTokens:
    """What a rendering adds after one model turn, tokenised on its own: template text and the environment's reply."""

    input_ids: list[int]
    """Token ids of the rendering after the turn's content (and the next turn's generation prompt when asked)."""
    roles: list[str]
    """Per token: feedback (tool text), decision (the end-of-turn token closing the model's turn) or template."""
    text: str
    """The text those tokens encode."""


def tokenize_tail(
    tokenizer: Any, messages: list[dict[str, str]], after: int, enable_thinking: bool = True,
    add_generation_prompt: bool = False,
) -> TailTokens:
    """Tokens and roles of the rendering of ``messages`` after the content of model turn ``after``.

    This is what an agent loop appends to the tokens a policy sampled for that turn: everything from the turn's
    end on (its end-of-turn token, the tool messages after it, and with ``add_generation_prompt`` the next
    turn's header and think prefill), labelled by the same spans as whole traces. Only the text after the turn is
    tokenised, so the sampled tokens are never re-tokenised and templates that rewrite earlier turns (Qwen3
    drops empty think blocks of earlier turns) cannot change them; raises ``TraceError``.
    """
    text, spans, _ = locate_spans(tokenizer, messages, enable_thinking)
    own = [span for span in spans if span.message == after]
    if not (0 <= after < len(messages)) or messages[after]["role"] != "assistant" or not own:
        raise TraceError(f"message {after}: not a model turn with content; the tail starts after an assistant turn")
    cut = own[-1].end
    if add_generation_prompt:
        full = render(tokenizer, messages, add_generation_prompt=True, enable_thinking=enable_thinking)
        if not full.startswith(text):
            raise TraceError("the chat template's generation prompt rewrites the conversation before it; "
                             "the next turn's header cannot be appended exactly")
        text = full
    tail = text[cut:]
    ids, offsets = _encode(tokenizer, tail)
    shifted = [Span(max(span.start - cut, 0), span.end - cut, span.role, span.message) for span in spans
               if span.end >= cut and span.message >= after]
    roles, owner = _label_tokens(offsets, shifted)
    _mark_end_of_turn(tokenizer, tail, ids, offsets, shifted, roles, owner)
    return TailTokens(ids, roles, tail)


def verify_feedback(trace: Trace, tokenized: TokenizedTrace, tokenizer: Any) -> None:
    """Check that each tool message's decoded feedback tokens reproduce its text; raises ``TraceError``."""
    by_message: dict[int, list[int]] = {}
    for tok, msg, is_feedback in zip(tokenized.input_ids, tokenized.token_message, tokenized.feedback_mask):
        if is_feedback:
            by_message.setdefault(msg, []).append(tok)
    last_kept = max(tokenized.token_message, default=-1)
    for i, message in enumerate(trace.messages):
        if message["role"] != "tool" or (tokenized.truncated and i > last_kept):
            continue  # a message wholly past the cut has nothing to verify
        want = message["content"].strip()
        got = tokenizer.decode(by_message.get(i, []), skip_special_tokens=False).strip()
        if got == want:
            continue
        if tokenized.truncated and i == last_kept and got and want.startswith(got.rstrip("\ufffd")):
            continue  # the message the cut fell inside keeps a prefix of its text
        raise TraceError(
            f"message {i} (tool): decoded feedback tokens do not reproduce its text "
            f"(expected {want[:60]!r}..., decoded {got[:60]!r}...)"
        )


def _render(tokenizer: Any, messages: list[dict[str, str]], enable_thinking: bool) -> str:
    try:
        return render(tokenizer, messages, add_generation_prompt=False, enable_thinking=enable_thinking)
    except ValueError as err:
        raise TraceError(str(err)) from None
    except Exception as err:  # jinja2 TemplateError and raise_exception() from the template itself
        raise TraceError(f"the chat template rejected the trace: {err}") from None


def _split_think(i: int, content: str) -> tuple[str, str, str, str, str] | None:
    """(opening, reasoning, closing, answer, trailing) of an assistant message with a think block."""
    if "<think>" not in content and "</think>" not in content:
        return None
    m = _THINK.match(content)
    if content.count("<think>") != 1 or content.count("</think>") != 1 or not m:
        raise TraceError(
            f"message {i} (assistant): expected at most one <think>...</think> block at the start of the turn"
        )
    return m.group(1), m.group(2), m.group(3), m.group(4), m.group(5)


def _skeleton(messages: list[dict[str, str]], tag: str) -> tuple[list[dict[str, str]], list[_Piece]]:
    """The messages with every content replaced by a placeholder, and the placeholders in order."""
    skel, pieces = [], []
    for i, message in enumerate(messages):
        content = message["content"]
        answer = _Piece(i, "content", content.strip(), f"MOLRL{tag}M{i}C")
        think = _split_think(i, content) if message["role"] == "assistant" else None
        if think:
            opening, reasoning, closing, answer.core, trailing = think
            middle = ""
            if reasoning:
                pieces.append(_Piece(i, "reasoning", reasoning, f"MOLRL{tag}M{i}R"))
                middle = pieces[-1].sentinel
            skel_content = opening + middle + closing + answer.sentinel + trailing
        else:
            lead = content[: len(content) - len(content.lstrip())]
            trail = content[len(content.rstrip()) :]
            skel_content = lead + answer.sentinel + trail
        pieces.append(answer)
        skel.append({"role": message["role"], "content": skel_content})
    return skel, pieces


def _place(skel: str, pieces: list[_Piece], messages: list[dict[str, str]]) -> list[tuple[int, _Piece]]:
    """Where each placeholder sits in the placeholder rendering; dropped reasoning is allowed, nothing else."""
    placed = []
    for piece in pieces:
        role = messages[piece.message]["role"]
        count = skel.count(piece.sentinel)
        if count > 1:
            raise TraceError(f"message {piece.message} ({role}): the chat template renders it twice")
        if count == 0:
            if piece.sentinel.lower() in skel.lower():
                raise TraceError(f"message {piece.message} ({role}): the chat template changed its text beyond "
                                 "whitespace; cannot label its tokens exactly")
            if piece.part == "reasoning":
                continue  # e.g. Qwen3 drops <think> of turns before the last user query
            raise TraceError(
                f"message {piece.message} ({role}) is missing from the rendering: the chat template dropped it "
                "(templates silently drop roles they do not know; use system/user/assistant/tool)"
            )
        placed.append((skel.index(piece.sentinel), piece))
    if any(a[0] >= b[0] for a, b in zip(placed, placed[1:])):
        raise TraceError("the chat template reorders messages; cannot label tokens")
    return placed


def _mismatch(i: int, messages: list[dict[str, str]], want: str, got: str) -> TraceError:
    return TraceError(
        f"message {i} ({messages[i]['role']}): the chat template's text around it depends on the content "
        f"(expected {want[-40:]!r}, found {got[-40:]!r}); cannot label its tokens exactly"
    )


def _spans(
    text: str, messages: list[dict[str, str]], regions: dict[tuple[int, str], tuple[int, int, int]], empty_think: bool
) -> tuple[list[Span], int]:
    spans, n_empty = [], 0
    for i, message in enumerate(messages):
        lit_start, start, end = regions[(i, "content")]
        if message["role"] == "assistant":
            if (i, "reasoning") in regions:
                r_lit, r_start, _ = regions[(i, "reasoning")]
                opening = text.rfind("<think>", r_lit, r_start)
                start = opening if opening >= 0 else r_start
            else:
                m = _EMPTY_THINK_AT_END.search(text, lit_start, start)
                if m:
                    n_empty += 1
                    start = m.start() if empty_think else start
        if end > start:
            spans.append(Span(start, end, ROLE_OF[message["role"]], i))
    return spans, n_empty


def _label_tokens(offsets: list[tuple[int, int]], spans: list[Span]) -> tuple[list[str], list[int]]:
    """Role and owning message of every token: a token overlapping a content span belongs to it."""
    roles, owner = ["template"] * len(offsets), [-1] * len(offsets)
    j = 0
    for t, (s, e) in enumerate(offsets):
        if e <= s:
            continue
        while j < len(spans) and spans[j].end <= s:
            j += 1
        hits = []
        k = j
        while k < len(spans) and spans[k].start < e:
            hits.append(spans[k])
            k += 1
        if len(hits) > 1:
            raise TraceError(f"token {t} spans messages {hits[0].message} and {hits[1].message}; cannot label it")
        if hits:
            roles[t], owner[t] = hits[0].role, hits[0].message
    return roles, owner


def _mark_end_of_turn(
    tokenizer: Any, text: str, ids: list[int], offsets: list[tuple[int, int]], spans: list[Span],
    roles: list[str], owner: list[int],
) -> None:
    """Make the special token closing each assistant turn (and whitespace before it) decision tokens."""
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
    starts = [s for s, _ in offsets]
    for span in spans:
        if span.role != "decision":
            continue
        first = t = bisect.bisect_left(starts, span.end)
        while t < len(ids) and roles[t] == "template" and not text[offsets[t][0] : offsets[t][1]].strip():
            t += 1  # whitespace the model writes before ending its turn
        if t < len(ids) and roles[t] == "template" and ids[t] in special:
            for k in range(first, t + 1):
                roles[k], owner[k] = "decision", span.message


def _describe_cut(trace: Trace, roles: list[str], owner: list[int], max_length: int, whole: bool) -> list[str]:
    """A note when the cut at ``max_length`` falls inside a message's span (``whole``: all tokens are known)."""
    msg = owner[max_length - 1]
    if msg < 0 or owner[max_length] != msg:
        return [f"truncated at {max_length} tokens between messages"]
    kept = sum(1 for o in owner[:max_length] if o == msg)
    total = sum(1 for o in owner if o == msg)
    more = "" if whole or owner[-1] != msg else " (and more: only the trace's start was tokenised)"
    return [f"truncated at {max_length} tokens inside {roles[max_length - 1]} message {msg} "
            f"({trace.messages[msg]['role']}): kept {kept} of its {total} tokens{more}"]


def _build(
    ids: list[int], roles: list[str], owner: list[int], kind: str, n_empty: int, truncated: bool, notes: list[str]
) -> TokenizedTrace:
    decision = [r == "decision" for r in roles]
    feedback = [r == "feedback" for r in roles]
    return TokenizedTrace(
        input_ids=ids,
        decision_mask=decision,
        feedback_mask=feedback,
        prompt_mask=[r == "prompt" for r in roles],
        template_mask=[r == "template" for r in roles],
        labels=[i if d or f else IGNORE_INDEX for i, d, f in zip(ids, decision, feedback)],
        token_message=[o if r != "template" else -1 for o, r in zip(owner, roles)],
        kind=kind,
        n_empty_think=n_empty,
        truncated=truncated,
        notes=notes,
    )
