"""Forms of a math answer read before math-verify sees it: several values stated in one answer,
and literals too large to compute.

Both are pure string functions on an answer already known to be short (``MAX_ANSWER_CHARS``), so
their cost is bounded.

- ``stated_values``: math-verify reads ``2\\ 3`` as 5, ``3 = 2`` and ``2 \\approx 3`` as 2, and
  ``2 \\lor 3``, ``2 \\mid 3`` or a ``cases`` block of 2 and 3 as 3: it picks one number from an
  answer that gives several. Such an answer is rewritten as the list of the values it states
  (``2, 3``), which the grader compares as a set, so a hedge is wrong while a restatement of one
  value (``\\frac{1}{2} = 0.5``) still equals it.
- ``too_big_to_compute``: sympy evaluates integer literals exactly, so ``9^{9^{9^{9}}}`` or
  ``100000000!`` costs the whole time limit (or, in a C routine, more). A power tower of
  literals, a power whose exponent has more than ``MAX_EXPONENT_DIGITS`` digits, and a factorial
  or binomial whose operand has more than ``MAX_OPERAND_DIGITS`` digits (or is itself a literal
  power or factorial) are graded wrong unparsed. No MATH-500 or AIME answer has any of these.
"""

from __future__ import annotations

import re

MAX_OPERAND_DIGITS = 4
"""Factorials and binomials of literals with more digits (10000! and up) are refused unparsed."""
MAX_EXPONENT_DIGITS = 7
"""Powers whose exponent has a literal with more digits (2^{100000000} and up) are refused unparsed."""

_HEDGE = re.compile(r"\\(?:lor|vee|land|wedge|mid)(?![A-Za-z])")
"""Connectives between alternatives (``2 \\lor 3``): every side is a stated value."""
_RELATION = re.compile(
    r"\\(?:approx|neq|ne|leq|le|geq|ge|leqslant|geqslant|lt|gt|simeq|sim|equiv|cong)(?![A-Za-z])|[=<>≈≠≤≥]")
"""Relations; between two constants (no variable) each side is a stated value (``3 = 2``)."""
_SPACED_NUMBERS = re.compile(r"(?<=\d)(?:\s|\\[ ,;:]|\\q?quad(?![A-Za-z])|~)+(?=\d)(?!\d{3}(?!\d))")
"""Spacing between two numbers (``2\\ 3``), except a thin-space thousands group (``1\\,000``)."""
_CASES = re.compile(r"\\begin\s*\{cases\}(.*)\\end\s*\{cases\}", re.S)
_COMMAND = re.compile(r"\\[A-Za-z]+")
_LETTER = re.compile(r"[A-Za-z]")
_DIGITS = re.compile(r"\d+")
_POWER = re.compile(r"\^|\*\*")
_FACTORIAL = re.compile(r"(?<!\\)!(?!=)")
_BINOMIAL = re.compile(r"\\[dt]?binom(?![A-Za-z])")


def _has_variable(text: str) -> bool:
    """Whether ``text`` names a variable: a letter outside LaTeX commands (``\\pi`` and ``\\frac`` are none)."""
    return _LETTER.search(_COMMAND.sub(" ", text)) is not None


def stated_values(answer: str, gold: str) -> str:
    """``answer`` as the list of values it states (``2, 3``) when it states several, else unchanged."""
    parts = [answer]
    cases = _CASES.fullmatch(answer.strip())
    if cases and "cases" not in gold:
        parts = [row.split("&")[0] for row in cases.group(1).split("\\\\")]
    parts = [side for part in parts for side in _HEDGE.split(part)]
    parts = [side for part in parts
             for side in (_RELATION.split(part) if not _has_variable(part) else [part])]
    parts = [value for part in parts for value in _SPACED_NUMBERS.split(part)]
    parts = [p.strip() for p in parts if p.strip()]
    if len(parts) <= 1 and cases is None:
        return answer
    return ", ".join(parts)


def _group_after(text: str, at: int) -> tuple[str, int]:
    """The operand that starts at ``at`` (after spaces): a balanced ``{...}`` / ``(...)``, a number,
    a command or one character; returned with where it ends."""
    while at < len(text) and text[at].isspace():
        at += 1
    if at >= len(text):
        return "", at
    if text[at] in "{(":
        opener, closer, depth = text[at], "})"["{(".index(text[at])], 0
        for end in range(at, len(text)):
            depth += (text[end] == opener) - (text[end] == closer)
            if depth == 0:
                return text[at + 1: end], end + 1
        return text[at + 1:], len(text)
    for pattern in (_DIGITS, _COMMAND):
        m = pattern.match(text, at)
        if m:
            return m.group(), m.end()
    return text[at], at + 1


def _group_before(text: str, end: int) -> str:
    """The operand that ends just before ``end`` (before spaces): a balanced group or a number."""
    while end > 0 and text[end - 1].isspace():
        end -= 1
    if end == 0:
        return ""
    if text[end - 1] in "})":
        closer = text[end - 1]
        opener, depth = "{("["})".index(closer)], 0
        for start in range(end - 1, -1, -1):
            depth += (text[start] == closer) - (text[start] == opener)
            if depth == 0:
                return text[start + 1: end - 1]
        return text[: end - 1]
    start = end
    while start > 0 and text[start - 1].isdigit():
        start -= 1
    return text[start:end]


def _literal_growth(operand: str) -> bool:
    """Whether an operand is a constant that itself grows fast (a power, factorial or binomial of literals)."""
    grows = _POWER.search(operand) or _FACTORIAL.search(operand) or _BINOMIAL.search(operand)
    return bool(grows) and not _has_variable(operand)


def _longest_number(operand: str) -> int:
    return max((len(m.group()) for m in _DIGITS.finditer(operand)), default=0)


def too_big_to_compute(text: str) -> str | None:
    """Why ``text`` is refused unparsed as a literal too large to compute, else None."""
    for m in _POWER.finditer(text):
        exponent, end = _group_after(text, m.end())
        if _POWER.match(text[end:].lstrip()):  # a^b^c: the exponent is b^c
            exponent += "^"
        if _longest_number(exponent) > MAX_EXPONENT_DIGITS:
            return f"answer raises to a power of more than {MAX_EXPONENT_DIGITS} digits"
        if _literal_growth(exponent):
            return "answer is a power tower of literals"
    for m in _FACTORIAL.finditer(text):
        operand = _group_before(text, m.start())
        if _longest_number(operand) > MAX_OPERAND_DIGITS or _literal_growth(operand):
            return f"answer takes the factorial of a literal of more than {MAX_OPERAND_DIGITS} digits or of a power"
    for m in _BINOMIAL.finditer(text):
        top, end = _group_after(text, m.end())
        bottom, _ = _group_after(text, end)
        if any(_longest_number(x) > MAX_OPERAND_DIGITS or _literal_growth(x) for x in (top, bottom)):
            return f"answer takes a binomial of a literal of more than {MAX_OPERAND_DIGITS} digits or of a power"
    return None
