"""Math grading: the final answer of a completion, checked for equivalence with math-verify.

Where the final answer is (``extract_answer``), in order:

- the last ``\\boxed{}``, or the last list of boxes: boxes that only separators divide are one
  answer (``\\boxed{2}, \\boxed{3}`` -> ``2, 3``), graded as the set of their values, so a hedge
  is no answer (``\\boxed{2}, \\boxed{3}`` is wrong for the gold answer ``2``) while a restatement
  of one value (``\\boxed{15\\frac{39}{40}}, or \\boxed{\\frac{639}{40}}``) still equals it. Prose
  between two boxes makes the earlier one a draft: only the later one counts (``\\boxed{1} then
  \\boxed{2}`` -> ``2``). math-verify's own boxed extraction (mode "last") also joins boxes with a
  short phrase between them, and so would grade a draft and its correction as a set;
- the last ``<solution>`` block;
- the clause after the last "final answer is/:" or "the answer is/:" (the lm-eval / Minerva
  ``Final Answer: The final answer is $X$. I hope it is correct.`` included). A clause that is a
  sentence rather than an expression ("The largest $n$ is 34") is handed to math-verify's anchored
  extraction, which takes the value after "is" or the answer word.

Before parsing, numbers written with thin-space thousands (``1 000``, ``1\\,000``) are joined, and
a decimal comma (``1,22``) is read as a point when it is unambiguous: the answer is one number with
one or two digits right after its comma, and the gold answer is not a list. Three digits make a
thousands separator (``1,220`` is one thousand two hundred and twenty), and ``(1,2)``, ``1, 2``
or ``1,2`` against a gold list stay pairs.

An answer that states several values in one expression (``2\\ 3``, ``3 = 2``, ``2 \\lor 3``, a
``cases`` block) is read as the list of them (``math_forms.stated_values``), so it is wrong unless
every value equals the gold answer.

Every extraction scan costs linear time in the completion. Answers longer than
``MAX_ANSWER_CHARS``, nested deeper than ``MAX_ANSWER_DEPTH`` (math-verify's parser slows with each
level and recurses on it), or holding a literal too large to compute (a power tower of literals,
``100000000!``: ``math_forms.too_big_to_compute``) are graded wrong without being parsed.
Everything else is graded in a worker process (``math_worker``), where math-verify's alarm works
(``TIMEOUT_S`` per step) and which the caller kills, from any thread, when one answer takes longer
than ``math_worker.ROW_LIMIT_S`` or a batch of n answers runs past
``max(math_worker.BATCH_MIN_S, math_worker.BATCH_ROW_S * n)`` seconds. Any exception while grading
(RecursionError and MemoryError included) fails only that completion, as ``grader_error``.
"""

from __future__ import annotations

import bisect
import logging
import re
import threading

from molrl.graders import math_worker
from molrl.graders.grade import Grade
from molrl.graders.math_forms import stated_values, too_big_to_compute

log = logging.getLogger(__name__)

MAX_ANSWER_CHARS = 1000
"""Longer extracted answers are graded wrong without being parsed."""
MAX_ANSWER_DEPTH = 16
"""Answers with brackets nested deeper than this are graded wrong without being parsed (MATH-500's reach 2)."""
TIMEOUT_S = 2
"""math-verify's per-step time bound (its alarm), in the worker's main thread; honest answers take milliseconds."""

_ANSWER_IS = re.compile(r"(?:final answer|the answer)\s*(?:is|:)\s*:?\s*", re.I)
_CLAUSE_END = re.compile(r"\n|\.[^\S\n]")
"""A line end, or a sentence end within the line (a full stop and whitespace)."""
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOX_SEPARATOR = re.compile(
    r"(?:\s|\$|\\[,;:!]|\\q?quad\b|,|;|\band\b|\bor\b|\\text\s*+\{\s*+(?:and|or|,)?\s*+\}|(?<![A-Za-z])[A-Za-z]\s*=)*")
"""What may stand between two boxes of one answer: punctuation, and/or, spacing, ``$``, ``x =``."""
_PROSE_WORD = re.compile(r"\b[A-Za-z]{2,}\b")
"""A word, not letters multiplied by a number (``2xy``)."""
_MATH_MARKUP = re.compile(
    r"\$[^$]*\$|\\(?:begin|end|text|textbf|mathrm|mbox|operatorname)\s*\{[^{}]*\}|\\[A-Za-z]+|\b(?:and|or)\b")
_THIN_THOUSANDS = re.compile(r"-?\d{1,3}(?:(?:\s|\\[,;: ]|~|\\thinspace\s*)\d{3})+(?:\.\d+)?")
_THIN_SEPARATOR = re.compile(r"\s|\\[,;: ]|~|\\thinspace\s*")
_DECIMAL_COMMA = re.compile(r"(-?\d+)(?:,|\{,\})(\d{1,2})")
_THOUSANDS_COMMA = re.compile(r"(?<=\d)(?:,|\{,\})(?:\\!\s*)?(?=\d{3}(?!\d))")
_LIST_MARK = re.compile(r"[()\[\]]|\\\{")


def _boxes(text: str) -> list[tuple[int, int, int]]:
    """Every balanced ``\\boxed{...}`` / ``\\fbox{...}`` as (start, end, where its content starts), by start.

    Contents are sliced only for the boxes an answer uses (``_box_content``): slicing every box
    would cost quadratic time on thousands of boxes nested in one another.
    """
    starts = {m.end() - 1: m.start() for m in _BOX.finditer(text)}
    found, stack = [], []
    for m in re.finditer(r"[{}]", text):  # one pass over the braces, so many boxes cost linear time
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            open_at = stack.pop()
            if open_at in starts:
                found.append((starts[open_at], m.end(), open_at + 1))
    return sorted(found)


def _box_content(text: str, box: tuple[int, int, int]) -> str:
    return text[box[2]: box[1] - 1].strip()


def _final_boxed(text: str) -> str | None:
    """The last box's content, with the boxes before it that only separators divide from it."""
    opening = [m.start() for m in _BOX.finditer(text)]
    boxes = _boxes(text)
    if not opening or not boxes or boxes[-1][0] != opening[-1]:  # the last box never closes
        return None
    group, start = [_box_content(text, boxes[-1])], boxes[-1][0]
    for box in reversed(boxes[:-1]):
        if box[1] > start:  # encloses a later box
            continue
        if not _BOX_SEPARATOR.fullmatch(text[box[1]:start]):
            break
        group.append(_box_content(text, box))
        start = box[0]
    parts = [c for c in dict.fromkeys(reversed(group)) if c]
    return ", ".join(parts) or None


def _is_sentence(clause: str) -> bool:
    """Whether a clause has words outside its math (``The largest $n$ is 34``), not just an expression."""
    return _PROSE_WORD.search(_MATH_MARKUP.sub(" ", clause)) is not None


def _last_solution(text: str) -> str | None:
    """The content of the last closed ``<solution>...</solution>`` block (found in linear time)."""
    end = text.rfind("</solution>")
    start = text.rfind("<solution>", 0, end) if end >= 0 else -1
    content = text[start + len("<solution>"): end].strip() if start >= 0 else ""
    return content or None


def _clause(text: str, start: int, stops: list[int]) -> tuple[str, int]:
    """The clause from ``start`` to the end of its sentence or line, stripped, and where it ends.

    ``stops`` are ``_clause_stops(text)``: found once, so a text of many anchors costs linear time.
    """
    at = bisect.bisect_left(stops, start)
    end = stops[at] if at < len(stops) else len(text)
    return text[start:end].strip().removesuffix(".").strip(), end


def _clause_stops(text: str) -> list[int]:
    """Where clauses end, in order: each newline, and each full stop followed by other whitespace."""
    return [m.start() for m in _CLAUSE_END.finditer(text)]


def nesting_depth(text: str) -> int:
    """How deep brackets (``(``, ``[``, ``{``) nest in ``text``; closers without an opener are ignored."""
    depth = deepest = 0
    for char in text:
        if char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}" and depth:
            depth -= 1
    return deepest


def too_big_to_parse(text: str) -> str | None:
    """Why ``text`` is not handed to math-verify (too long or too deeply nested), else None."""
    if len(text) > MAX_ANSWER_CHARS:
        return f"answer longer than {MAX_ANSWER_CHARS} characters"
    if nesting_depth(text) > MAX_ANSWER_DEPTH:
        return f"answer nests brackets deeper than {MAX_ANSWER_DEPTH}"
    return None


def _answer_in_sentence(sentence: str) -> str | None:
    """The answer math-verify's anchored extraction finds in a sentence ("... is 34"), as text."""
    from math_verify import parse
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig

    config = [LatexExtractionConfig(boxed_match_priority=-1), ExprExtractionConfig()]
    found = parse(sentence, extraction_config=config, fallback_mode="first_match", parsing_timeout=_timeout())
    text = found[-1] if found and isinstance(found[-1], str) else None
    return text.strip() if text and text.strip() else None


def extract_answer(text: str) -> str | None:
    """The final answer: the last \\boxed{} (group), else the last <solution> block, else "The answer is X"."""
    boxed = _final_boxed(text)
    if boxed:
        return boxed
    solution = _last_solution(text)
    if solution:
        return solution
    # the last anchor, so "Final Answer: The final answer is $X$" reads from the second one
    anchors = list(_ANSWER_IS.finditer(text))
    stops = _clause_stops(text) if anchors else []
    for anchor in reversed(anchors):
        answer, end = _clause(text, anchor.end(), stops)
        if not answer:
            continue
        sentence = text[anchor.start(): end]
        if _is_sentence(answer) and too_big_to_parse(sentence) is None:
            return _answer_in_sentence(sentence)
        return answer.strip("$").strip() or None
    return None


def _gold_is_list(gold: str) -> bool:
    """Whether the gold answer holds several values (a comma that is not a thousands separator)."""
    return "," in _THOUSANDS_COMMA.sub("", gold) or _LIST_MARK.search(gold) is not None


def read_numbers(answer: str, gold: str) -> str:
    """``answer`` with thin-space thousands joined and an unambiguous decimal comma made a point."""
    if _THIN_THOUSANDS.fullmatch(answer):
        return _THIN_SEPARATOR.sub("", answer)
    decimal = _DECIMAL_COMMA.fullmatch(answer)
    if decimal and not _gold_is_list(gold):
        return f"{decimal.group(1)}.{decimal.group(2)}"
    return answer


def _timeout() -> int | None:
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _parse(text: str):
    from math_verify import parse

    return parse(f"\\boxed{{{text}}}", parsing_timeout=_timeout())


def grade_math(completion: str, answer: str) -> Grade:
    """1.0 when the completion's final answer is equivalent to ``answer``, else 0.0; never raises.

    Graded in the worker process, within ``math_worker.ROW_LIMIT_S`` on any thread.
    """
    return grade_math_batch([completion], [answer])[0]


def grade_math_batch(completions: list[str], answers: list[str]) -> list[Grade]:
    """``grade_math`` of each (completion, answer) pair, all within the batch's time budget
    (``math_worker.batch_budget_s``); never raises for one row's sake."""
    return math_worker.grade_batch(list(completions), list(answers))


def grade_here(completion: str, answer: str) -> Grade:
    """``grade_math`` in this process, bounded only by math-verify's alarm on the main thread: the worker's side."""
    try:
        return _grade(completion, answer)
    except Exception as err:  # noqa: BLE001 - a grader failure scores as wrong, with the reason
        log.warning("math grading failed: %s: %s", type(err).__name__, err)
        return Grade(0.0, False, "grader_error", None, {"error": f"{type(err).__name__}: {err}"[:1000]})


def _refusal(text: str) -> str | None:
    """Why ``text`` is not handed to math-verify (too long, too deep, or too large to compute), else None."""
    return too_big_to_parse(text) or too_big_to_compute(text)


def _grade(completion: str, answer: str) -> Grade:
    from math_verify import verify

    extracted = extract_answer(completion)
    if extracted is None:
        return Grade(0.0, False, "no_answer", None, {"reason": "no \\boxed{}, <solution> or 'the answer is'"})
    refused = _refusal(extracted)
    if refused:
        return Grade(0.0, False, "wrong", extracted[:200], {"reason": refused})
    if _refusal(answer):  # a gold answer from a model (majority voting) or a broken data file
        return Grade(0.0, False, "grader_error", extracted, {"error": f"gold answer: {_refusal(answer)}"})
    as_read = stated_values(read_numbers(extracted, answer), answer)
    try:
        gold, pred = _parse(answer), _parse(as_read)
        ok = bool(gold and pred and verify(gold, pred, timeout_seconds=_timeout()))
    except Exception as err:  # noqa: BLE001 - a grader failure scores as wrong, with the reason
        log.warning("math grading failed for answer %r: %s", extracted[:100], err)
        return Grade(0.0, False, "grader_error", extracted, {"error": f"{type(err).__name__}: {err}"})
    details = {"gold": answer, "gold_parsed": [str(g) for g in gold], "pred_parsed": [str(p) for p in pred]}
    if as_read != extracted:
        details["read_as"] = as_read
    return Grade(1.0 if ok else 0.0, ok, "correct" if ok else "wrong", extracted, details)


if __name__ == "__main__":
    math_worker.serve(grade_here)
