"""Tokenise a trace with the model's own chat template and label every token with its role.

Roles: ``prompt`` (system and user text), ``decision`` (what the model wrote: assistant turns),
``feedback`` (what the environment wrote: tool messages), ``template`` (role headers, special
tokens and anything else the chat template adds).

Where each message lies in the rendering and which role each token gets is ``molrl.traces.spans``.

Truncation (``max_length``): ``drop`` rejects a longer trace; ``truncate`` keeps the first
``max_length`` tokens and records in ``notes`` which message the cut fell inside (a cut inside a
feedback span is always reported there, never silent). Only a prefix of the rendering long enough
for ``max_length`` tokens is tokenised (``molrl.content.encode_rendering``), so a huge record
costs no more than a long one. Message contents are encoded as plain text: a forged ``<|im_end|>``
inside a tool reply or a model turn is ordinary tokens, never a control id (``molrl.content``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from molrl.errors import DataError
from molrl.traces.schema import Reject, Trace, TraceError, read_traces
from molrl.content import encode_rendering
from molrl.traces.spans import label_tokens, locate_spans, mark_end_of_turn

log = logging.getLogger("molrl.traces")

IGNORE_INDEX = -100
UNLIMITED_CHARS = 4_000_000
"""Longest rendering tokenised whole when there is no max_length (~1M tokens, seconds)."""


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


def tokenize_trace(trace: Trace, tokenizer: Any, cfg: TokenizeConfig | None = None) -> TokenizedTrace:
    """Render ``trace`` with the tokenizer's chat template and label each token; raises ``TraceError``."""
    cfg = cfg or TokenizeConfig()
    if not getattr(tokenizer, "is_fast", False):
        raise TraceError("tokenisation needs a fast (Rust) tokenizer for character offsets")
    rendering = locate_spans(tokenizer, trace.messages, cfg.enable_thinking, cfg.empty_think_is_decision)
    text, spans, n_empty = rendering.text, rendering.spans, rendering.n_empty_think
    if cfg.max_length is None and len(text) > UNLIMITED_CHARS:
        raise TraceError(
            f"trace renders to {len(text):,} characters, more than the {UNLIMITED_CHARS:,} tokenised whole when "
            "there is no max_length; set max_length with truncation=truncate (traces stats: --max-length N "
            "--truncation truncate) to use its first N tokens, or cut the trace"
        )
    ids, offsets, whole = encode_rendering(tokenizer, text, rendering.content, max_tokens=cfg.max_length)
    roles, owner = label_tokens(offsets, spans)
    mark_end_of_turn(tokenizer, text, ids, offsets, spans, roles, owner)
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
