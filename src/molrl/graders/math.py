"""Math grading: the final answer of a completion, checked for equivalence with math-verify.

math-verify bounds its sympy work with ``signal.alarm``, which only works on the main thread; off
the main thread (e.g. inside a thread pool) it runs without that bound, so answers longer than
``MAX_ANSWER_CHARS`` are refused before parsing.
"""

from __future__ import annotations

import logging
import re
import threading

from molrl.graders.grade import Grade

log = logging.getLogger(__name__)

MAX_ANSWER_CHARS = 1000
"""Longer extracted answers are graded wrong without being parsed."""
TIMEOUT_S = 5
"""math-verify's per-step time bound on the main thread."""

_ANSWER_IS = re.compile(r"(?:final answer|the answer)\s*(?:is|:)\s*:?\s*(.+?)(?:\.\s|\.?\s*$|\n)", re.I)
_SOLUTION = re.compile(r"<solution>(.*?)</solution>", re.S)


def _last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), braces balanced."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    open_at = text.find("{", start)
    if open_at < 0:
        return None
    depth = 0
    for pos in range(open_at, len(text)):
        depth += {"{": 1, "}": -1}.get(text[pos], 0)
        if depth == 0:
            return text[open_at + 1: pos].strip()
    return None


def extract_answer(text: str) -> str | None:
    """The final answer: last \\boxed{}, else the last <solution> block, else "The answer is X"."""
    boxed = _last_boxed(text)
    if boxed:
        return boxed
    blocks = _SOLUTION.findall(text)
    if blocks and blocks[-1].strip():
        return blocks[-1].strip()
    found = _ANSWER_IS.findall(text)
    if found:
        return found[-1].strip().strip("$").strip()
    return None


def _parse(text: str):
    from math_verify import parse

    timeout = TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    return parse(f"\\boxed{{{text}}}", parsing_timeout=timeout)


def grade_math(completion: str, answer: str) -> Grade:
    """1.0 when the completion's final answer is equivalent to ``answer``, else 0.0."""
    from math_verify import verify

    extracted = extract_answer(completion)
    if extracted is None:
        return Grade(0.0, False, "no_answer", None, {"reason": "no \\boxed{}, <solution> or 'the answer is'"})
    if len(extracted) > MAX_ANSWER_CHARS:
        return Grade(0.0, False, "wrong", extracted[:200], {"reason": f"answer longer than {MAX_ANSWER_CHARS} characters"})
    try:
        gold, pred = _parse(answer), _parse(extracted)
        timeout = TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
        ok = bool(gold and pred and verify(gold, pred, timeout_seconds=timeout))
    except Exception as err:  # noqa: BLE001 - a grader failure scores as wrong, with the reason
        log.warning("math grading failed for answer %r: %s", extracted[:100], err)
        return Grade(0.0, False, "grader_error", extracted, {"error": f"{type(err).__name__}: {err}"})
    details = {"gold": answer, "gold_parsed": [str(g) for g in gold], "pred_parsed": [str(p) for p in pred]}
    return Grade(1.0 if ok else 0.0, ok, "correct" if ok else "wrong", extracted, details)
