"""Where each message lies in a chat rendering, and the role of every token of it.

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

Content is text (``molrl.content``): the characters of every message's content are encoded with no
added-token matching, so forged ``<|im_end|>`` or ``<think>`` inside a tool reply, a task or a model
turn stay ordinary tokens; only the template's own text around the contents makes control ids
(``molrl.content.encode_rendering``).

``tokenize_tail`` labels only what a rendering adds after one model turn, for an agent loop that
appends it to the tokens the policy sampled (``molrl.rl.rollouts.turns``); ``encode_chat`` gives the
token ids of a conversation (a generation prompt) under the same rule.
"""

from __future__ import annotations

import bisect
import re
import uuid
from dataclasses import dataclass
from typing import Any, Literal, Sequence

from molrl.chat import ChatPrompt, render
from molrl.content import encode_rendering
from molrl.task_types import Task
from molrl.tasks.prompts import CODE_INSTRUCTION, MATH_INSTRUCTION, user_message
from molrl.traces.schema import TraceError, check_text

ROLE_OF = {"system": "prompt", "user": "prompt", "assistant": "decision", "tool": "feedback"}
TOKEN_ROLES = ("prompt", "decision", "feedback", "template")
_EMPTY_THINK_AT_END = re.compile(r"<think>\s*</think>\s*\Z")


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


@dataclass
class Rendering:
    """A conversation rendered by the chat template, with where each message's text lies in it."""

    text: str
    """The rendering."""
    spans: list[Span]
    """Each message's labelled span (an assistant span includes its think tags)."""
    content: list[tuple[int, int]]
    """Character ranges ``[start, end)`` written by message contents, in order: encoded as plain text."""
    n_empty_think: int
    """Empty think blocks found in the rendering."""


def encode_chat(
    tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool = True, enable_thinking: bool = True
) -> list[int]:
    """Token ids of ``messages`` rendered by the chat template (a generation prompt by default), contents as
    plain text: the one way a conversation becomes model input ids; raises ``TraceError``."""
    rendering = locate_spans(tokenizer, messages, enable_thinking)
    text = rendering.text
    if add_generation_prompt:
        text = render(tokenizer, messages, add_generation_prompt=True, enable_thinking=enable_thinking)
        if not text.startswith(rendering.text):
            raise TraceError("the chat template's generation prompt rewrites the conversation before it; "
                             "cannot encode the prompt exactly")
    return encode_rendering(tokenizer, text, rendering.content)[0]


def chat_prompt(tokenizer: Any, messages: list[dict[str, str]], enable_thinking: bool = True) -> ChatPrompt:
    """The generation prompt of ``messages``: its rendered text with the ids ``encode_chat`` gives it."""
    text = render(tokenizer, messages, add_generation_prompt=True, enable_thinking=enable_thinking)
    return ChatPrompt(text, encode_chat(tokenizer, messages, True, enable_thinking))


def render_prompts(
    tokenizer: Any,
    tasks: Sequence[Task],
    *,
    enable_thinking: bool,
    code_template: str = CODE_INSTRUCTION,
    math_template: str = MATH_INSTRUCTION,
) -> list[ChatPrompt]:
    """Model-ready prompt for each task: the chat template applied to its one user message, with its ids
    (the task's text never becomes control tokens)."""
    return [
        chat_prompt(tokenizer, [{"role": "user", "content": user_message(t, code_template, math_template)}],
                    enable_thinking=enable_thinking)
        for t in tasks
    ]


def locate_spans(
    tokenizer: Any, messages: list[dict[str, str]], enable_thinking: bool = True, empty_think_is_decision: bool = False
) -> Rendering:
    """The rendering, the character span each message occupies in it, its content ranges and the empty-think count."""
    check_text(messages)  # every encoder renders through here: a lone surrogate is named, not a tokenizer TypeError
    text = _render(tokenizer, messages, enable_thinking)
    tag = uuid.uuid4().hex[:8].upper()
    while tag in text:
        tag = uuid.uuid4().hex[:8].upper()
    skel_messages, pieces = _skeleton(messages, tag)
    skel = _render(tokenizer, skel_messages, enable_thinking)
    placed = _place(skel, pieces, messages, tag)
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
    spans, n_empty = _spans(text, messages, regions, empty_think_is_decision)
    content = sorted((start, end) for _, start, end in regions.values() if end > start)
    return Rendering(text, spans, content, n_empty)


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
    add_generation_prompt: bool = False, sampled_end: int | None = None,
) -> TailTokens:
    """Tokens and roles of the rendering of ``messages`` after the content of model turn ``after``.

    This is what an agent loop appends to the tokens a policy sampled for that turn: everything from the turn's
    end on (its end-of-turn token, the tool messages after it, and with ``add_generation_prompt`` the next
    turn's header and think prefill), labelled by the same spans as whole traces. Only the text after the turn is
    tokenised, so the sampled tokens are never re-tokenised and templates that rewrite earlier turns (Qwen3
    drops empty think blocks of earlier turns) cannot change them; raises ``TraceError``.

    The tail never repeats what the turn already holds: the whitespace the turn's content ends with (which a
    template that keeps it renders before its end-of-turn token), nor, when the policy ended the turn itself
    with ``sampled_end`` (its last sampled id), that same end-of-turn token.
    """
    rendering = locate_spans(tokenizer, messages, enable_thinking)
    text, spans = rendering.text, rendering.spans
    own = [span for span in spans if span.message == after]
    if not (0 <= after < len(messages)) or messages[after]["role"] != "assistant" or not own:
        raise TraceError(f"message {after}: not a model turn with content; the tail starts after an assistant turn")
    turn_end = own[-1].end
    cut = _after_trailing_space(text, turn_end, messages[after]["content"])
    if add_generation_prompt:
        full = render(tokenizer, messages, add_generation_prompt=True, enable_thinking=enable_thinking)
        if not full.startswith(text):
            raise TraceError("the chat template's generation prompt rewrites the conversation before it; "
                             "the next turn's header cannot be appended exactly")
        text = full
    tail = text[cut:]
    ids, offsets, _ = encode_rendering(tokenizer, text, rendering.content, start=cut)
    shifted = [Span(max(span.start - cut, 0), max(span.end - cut, 0), span.role, span.message) for span in spans
               if span.end >= turn_end and span.message >= after]
    roles, owner = label_tokens(offsets, shifted)
    mark_end_of_turn(tokenizer, tail, ids, offsets, shifted, roles, owner)
    if sampled_end is not None and ids and ids[0] == sampled_end and ids[0] in _special_ids(tokenizer):
        start = offsets[1][0] if len(offsets) > 1 else len(tail)  # the policy's own end-of-turn is already there
        ids, roles, tail = ids[1:], roles[1:], tail[start:]
    return TailTokens(ids, roles, tail)


def _after_trailing_space(text: str, cut: int, content: str) -> int:
    """``cut`` moved past the part of ``content``'s trailing whitespace that the rendering keeps there."""
    trailing = content[len(content.rstrip()):]
    kept = 0
    while kept < len(trailing) and text[cut + kept : cut + kept + 1] == trailing[kept]:
        kept += 1
    return cut + kept


def _special_ids(tokenizer: Any) -> set[int]:
    """Every control id of ``tokenizer``: its special tokens and its added ones."""
    return set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))


def _render(tokenizer: Any, messages: list[dict[str, str]], enable_thinking: bool) -> str:
    try:
        return render(tokenizer, messages, add_generation_prompt=False, enable_thinking=enable_thinking)
    except ValueError as err:
        raise TraceError(str(err)) from None
    except Exception as err:  # jinja2 TemplateError and raise_exception() from the template itself
        raise TraceError(f"the chat template rejected the trace: {err}") from None


def _split_think(i: int, content: str) -> tuple[str, str, str, str, str] | None:
    """(opening, reasoning, closing, answer, trailing) of an assistant message with a think block: the opening tag
    with the whitespace around it, the reasoning, the closing tag with the whitespace around it, the answer and the
    whitespace after it. Found by ``find`` and ``strip``, never a backtracking pattern, so it costs linear time."""
    if "<think>" not in content and "</think>" not in content:
        return None
    opening, closing = content.find("<think>"), content.find("</think>")
    if (content.count("<think>") != 1 or content.count("</think>") != 1 or closing < opening
            or content[:opening].strip()):
        raise TraceError(
            f"message {i} (assistant): expected at most one <think>...</think> block at the start of the turn"
        )
    after_open, after_close = opening + len("<think>"), closing + len("</think>")
    inside = content[after_open:closing]
    reasoning_start = after_open + len(inside) - len(inside.lstrip())
    reasoning_end = max(after_open + len(inside.rstrip()), reasoning_start)
    answer_start = len(content) - len(content[after_close:].lstrip())
    answer_end = max(len(content.rstrip()), answer_start)
    return (content[:reasoning_start], content[reasoning_start:reasoning_end], content[reasoning_end:answer_start],
            content[answer_start:answer_end], content[answer_end:])


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


def _place(skel: str, pieces: list[_Piece], messages: list[dict[str, str]], tag: str) -> list[tuple[int, _Piece]]:
    """Where each placeholder sits in the placeholder rendering; dropped reasoning is allowed, nothing else.

    Every placeholder is found in one pass over the rendering (any case, to tell a changed one from a dropped one),
    so a trace of many messages costs linear time."""
    exact: dict[str, list[int]] = {}  # placeholder -> where it sits
    changed: set[str] = set()  # placeholders found only in another case
    for m in re.finditer(rf"MOLRL{tag}M[0-9]+[RC]", skel, re.IGNORECASE):
        if m.group() == m.group().upper():  # a placeholder is upper case
            exact.setdefault(m.group(), []).append(m.start())
        else:
            changed.add(m.group().upper())
    placed = []
    for piece in pieces:
        role = messages[piece.message]["role"]
        at = exact.get(piece.sentinel, [])
        if len(at) > 1:
            raise TraceError(f"message {piece.message} ({role}): the chat template renders it twice")
        if not at:
            if piece.sentinel in changed:
                raise TraceError(f"message {piece.message} ({role}): the chat template changed its text beyond "
                                 "whitespace; cannot label its tokens exactly")
            if piece.part == "reasoning":
                continue  # e.g. Qwen3 drops <think> of turns before the last user query
            raise TraceError(
                f"message {piece.message} ({role}) is missing from the rendering: the chat template dropped it "
                "(templates silently drop roles they do not know; use system/user/assistant/tool)"
            )
        placed.append((at[0], piece))
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


def label_tokens(offsets: list[tuple[int, int]], spans: list[Span]) -> tuple[list[str], list[int]]:
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


def mark_end_of_turn(
    tokenizer: Any, text: str, ids: list[int], offsets: list[tuple[int, int]], spans: list[Span],
    roles: list[str], owner: list[int],
) -> None:
    """Make the special token closing each assistant turn (and whitespace before it) decision tokens."""
    special = _special_ids(tokenizer)
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
