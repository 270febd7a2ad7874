r"""What a piece of model-written Python defines at its top level, read by tokens and never compiled.

Completions are written by the policy, and the trainer and evaluator never hand them to Python's own compiler: a
hostile text can drive CPython's C parser into deep recursion or huge memory (model text is only compiled inside
the sandbox). The standard library's ``tokenize`` only lexes: it is pure Python on 3.11 (CPython's own tokenizer,
a flat lexer, from 3.12), linear in its input, and already knows strings (a ```` ``` ```` inside one), comments,
line continuations and brackets; the rest is read here.

A piece of code defines ``name`` at its top level when one of its logical lines at indentation depth 0 is

- ``def name`` or ``async def name`` (decorators above it allowed); a ``class name`` is not a function and
  defines nothing, nor does a ``def`` of it inside a class, a function or any other compound statement;
- an assignment, one of ``;``-separated statements, whose target list binds ``name``: the targets are what comes
  before each ``=`` (never ``==``, ``<=``, ``>=``, ``!=``, ``:=``, an augmented ``+=``, nor an ``=`` inside
  brackets, so ``g(name=1)`` binds nothing), read as Python reads them: ``name``, ``a, name``, ``(a, [*name])``,
  ``name: T = value`` (annotated, with a value) bind it; ``x[name]``, ``x.name``, ``(name, a)[0]`` and
  ``name == name`` do not.

Code "tokenizes" when ``tokenize`` reads it to its end with every string and bracket closed, every bracket matched
by its own kind, at most 200 deep (CPython's limit), every dedent to an enclosing indentation, and no character
that is no token (``$``, a lone quote, a NUL). That is the test a block must pass before its top level is read;
it is weaker than compiling (``def f(x)`` without its colon tokenizes), which the sandbox does with the tests.
"""

from __future__ import annotations

import io
import keyword
import re
import tokenize
import unicodedata
from token import EXACT_TOKEN_TYPES

MAX_NESTING = 200
"""Most brackets open at once, as CPython allows (``too many nested parentheses`` past it)."""
_PAIRS = {"(": ")", "[": "]", "{": "}"}
_COMPOUND = frozenset({"async", "class", "def", "elif", "else", "except", "finally", "for", "if", "try", "while",
                       "with"})
"""Keywords that open a compound statement: the rest of its line is its body, never the top level."""
_ATOM_END = frozenset("FN)]Tx")
"""Shapes after which ``(``, ``[`` or ``.`` is a trailer (a call, a subscript, an attribute) rather than a display."""


def top_level_defines(code: str, name: str) -> bool | None:
    """Whether ``code``'s top level defines ``name`` (see the module docstring); None when it does not tokenize."""
    readline = io.StringIO(re.sub(r"\r\n?", "\n", code)).readline
    found, shape, depth, brackets = False, [], 0, []
    trailer = -1  # the nesting of the trailer being skipped (its contents bind nothing), or -1
    after_dot = False  # the last shape was an attribute's dot: its name binds nothing
    try:
        for kind, text, *_ in tokenize.generate_tokens(readline):
            if kind == tokenize.OP and text in _PAIRS:
                if len(brackets) == MAX_NESTING:
                    return None
                brackets.append(_PAIRS[text])
                if depth == 0 and trailer < 0:
                    if text != "{" and shape and shape[-1] in _ATOM_END:
                        shape.append("T")
                        trailer = len(brackets) - 1
                    else:
                        shape.append("x" if text == "{" else text)
                continue
            if kind == tokenize.OP and text in ")]}":
                if not brackets or brackets.pop() != text:
                    return None
                if trailer == len(brackets):
                    trailer = -1
                elif depth == 0 and trailer < 0:
                    shape.append("x" if text == "}" else text)
                continue
            if kind == tokenize.ERRORTOKEN or kind == tokenize.OP and text not in EXACT_TOKEN_TYPES:
                return None  # no token (3.11 says ERRORTOKEN; 3.12 says OP for ``$``, ``?`` and a backtick)
            if kind == tokenize.INDENT or kind == tokenize.DEDENT:
                depth += 1 if kind == tokenize.INDENT else -1
            elif kind == tokenize.NEWLINE or kind == tokenize.ENDMARKER:
                found = found or _line_defines("".join(shape))
                shape = []
            elif depth == 0 and trailer < 0 and kind != tokenize.NL and kind != tokenize.COMMENT:
                if after_dot:
                    after_dot = False
                    if kind == tokenize.NAME:
                        continue
                symbol = _symbol(kind, text, name, bool(brackets))
                if symbol == "." and shape and shape[-1] in _ATOM_END:
                    symbol, after_dot = "T", True
                if symbol != "x" or not shape or shape[-1] != "x":  # a run of non-target tokens is one shape
                    shape.append(symbol)
    except (tokenize.TokenError, SyntaxError):  # an unclosed string or bracket at the end; a dedent to nowhere
        return None
    return found


def _symbol(kind: int, text: str, name: str, in_brackets: bool) -> str:
    """A top-level token's shape: ``F`` the name, ``N`` another, ``d``/``a``/``k``/``s`` ``def``/``async``/another
    compound/any other keyword, the punctuation a target list is made of, and ``x`` anything else."""
    if kind == tokenize.NAME:
        if keyword.iskeyword(text):
            return "d" if text == "def" else "a" if text == "async" else "k" if text in _COMPOUND else "s"
        identifier = text if text.isascii() else unicodedata.normalize("NFKC", text)  # as Python reads it
        return "F" if identifier == name else "N"
    if kind != tokenize.OP:
        return "x"
    if text in ("=", ":", ";"):
        return "x" if in_brackets else text
    return text if text in (",", "*", ".") else "x"


def _line_defines(shape: str) -> bool:
    """Whether a top-level logical line, as shapes, defines the name: ``def``, or a target list that binds it."""
    for statement in shape.split(";"):
        if statement[:1] in ("d", "a", "k"):  # a compound statement: its line's rest is its body
            return statement.startswith(("dF", "adF"))
        if statement[:1] == "s" or "=" not in statement:
            continue
        parts = statement.split("=")
        target, annotated, _ = parts[0].partition(":")
        if annotated:  # one target, with a value: ``name: T = value``, ``(name): T = value``
            opened = len(target) - len(target.lstrip("("))
            if target == "(" * opened + "F" + ")" * opened:
                return True
            continue
        for part in parts[:-1]:  # every part before an ``=`` is a target list, up to one that is none (a lambda's)
            bound = _binds(part)
            if bound is None:
                break
            if bound:
                return True
    return False


def _binds(shape: str) -> bool | None:
    """Whether a target list's shape binds the name (``F`` untrailed, in any tuple, list or star); None when the
    shape is not a target list. Groups are kept on a stack, never in recursion (they nest up to ``MAX_NESTING``)."""
    groups: list[tuple[bool, str]] = []  # per open group: what the level around it binds so far, and its closer
    bound, expect, i = False, True, 0
    while i < len(shape):
        char = shape[i]
        if expect and char == "*" and shape[i + 1:i + 2] in ("F", "N", "(", "["):
            i += 1
            continue
        if expect and char in "FN":
            atom, i = char == "F", i + 1
        elif expect and char in "([":
            groups.append((bound, ")" if char == "(" else "]"))
            bound, i = False, i + 1
            continue
        elif groups and char == groups[-1][1]:  # after a target, a trailing comma, or its opener (``()``)
            atom, (bound, _) = bound, groups.pop()
            i += 1
        elif not expect and char == ",":
            expect, i = True, i + 1
            continue
        else:
            return None
        trailed = False  # an atom ends here: a trailer after it (``.x``, ``[0]``, a call) makes it bind nothing
        while i < len(shape) and shape[i] == "T":
            trailed, i = True, i + 1
        bound, expect = bound or (atom and not trailed), False
    return None if groups or not shape else bound
