r"""Where a completion's program is: its Python blocks, read by a CommonMark parser, and the one that defines the
function under test.

The rules, in the order they apply:

- **Blocks.** A fenced block (CommonMark, markdown-it-py) counts as code when its info string's first word is
  ``python``, ``py`` or ``python3`` (any case) or when it has none; a ``text``, ``bash``, ``console``, ``output``
  (any other) block is sample output or a shell line, never code. A fence closes only on a line of its own, with a
  fence at least as long as its opener, so a ```` ``` ```` inside a string on a code line (``s.split("```")``), on
  an indented line, or inside a longer fence (````` ````python `````) does not cut the block. A fence that is never
  closed does not count (the answer was cut before its code ended). Indented code blocks do not count. An
  ``<execute>`` / ``<solution>`` block counts too: its first Python fence where it holds one, else its whole text.
- **The defining block.** With ``entry_point``, the last block whose top level defines it: a top-level ``def`` or
  ``async def`` of that name, or an assignment that binds it, read from its tokens (``molrl.graders.toplevel``; model
  text is never compiled outside the sandbox). A method of that name, a nested ``def``, or a comparison (``f == f``)
  defines nothing. The last wins because models draft and then correct themselves; the definition wins over a later
  block that only uses it (``assert f(3) == 4``).
- **A block that does not tokenize.** A ```` ``` ```` line inside a multi-line string at the start of a line does
  close the fence, which leaves a block whose string never closes. A block that does not tokenize to its end with
  every string and bracket closed is joined with what follows it, up to the next fence's opening line, then through
  that fence's end; the first join that tokenizes is the block. A block that does not tokenize, even joined, defines
  the entry point when one of its unindented lines starts ``def NAME``, ``async def NAME`` or ``NAME =`` (it is the
  answer, graded a compile error).
- **Fallback.** When no block defines the entry point, or none is named, the last block (as grading 1 did): the
  completion's answer is then whatever it ran last.

Completions are written by the policy, so every step costs linear time in any text: the parser reads each line a
bounded number of times, the tag scan looks at each character once, and ``tokenize`` reads a stretch of text a
bounded number of times (as a block, and in the joins that reach over it: four at most), stopping at the first
character that is no token or at nesting past CPython's own limit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from markdown_it import MarkdownIt

from molrl.graders.toplevel import top_level_defines

PYTHON_TAGS = frozenset({"", "python", "py", "python3"})
"""First words of a fence's info string that mark Python (lowercased; empty: an untagged fence)."""
_TAGS = ("execute", "solution")


@dataclass(frozen=True)
class Block:
    """One candidate block of code in a completion."""

    start: int
    """Where it starts in the completion (a line number for fences, an offset for tag blocks, ordered together)."""
    code: str
    """Its code, blank lines around it dropped."""
    joins: tuple[str, ...] = ()
    """Longer readings of it, tried in order when it does not parse (the text through the next fences)."""


@lru_cache(maxsize=1)
def _parser() -> MarkdownIt:
    """A CommonMark block parser. HTML blocks are off: an ``<execute>`` line would open one that hides every fence up
    to the next blank line. So are the rules that cannot move a fence and cost time: inline parsing, headings and
    link references (a heading line is read as a paragraph's, which a fence interrupts all the same)."""
    return MarkdownIt("commonmark").disable(["inline", "html_block", "heading", "lheading", "reference"])


def _lines(text: str) -> list[str]:
    """``text``'s lines as the parser numbers them: line ends normalised to ``\\n``, NUL read as U+FFFD."""
    return re.sub(r"\r\n?", "\n", text).replace("\0", "\ufffd").split("\n")


def fenced_blocks(text: str) -> list[tuple[int, str, tuple[str, ...]]]:
    """(opening line, code, joins) of each closed Python fence of ``text``, in order. The joins are its text through
    the next fence's opening line, then through that fence's end (none inside a list item or a quote, or last)."""
    fences = [t for t in _parser().parse(text) if t.type == "fence"]
    closed = [_closed(t) for t in fences]
    lines = _lines(text) if len(fences) > 1 else []
    out = []
    for i, token in enumerate(fences):
        tag = token.info.split(maxsplit=1)[0].lower() if token.info.strip() else ""
        if not closed[i] or tag not in PYTHON_TAGS:
            continue
        first = token.map[0]
        joins: tuple[str, ...] = ()
        if token.level == 0 and i + 1 < len(fences) and fences[i + 1].level == 0:
            nxt_first, nxt_end = fences[i + 1].map
            through = nxt_end - 1 if closed[i + 1] else nxt_end
            joins = ("\n".join(lines[first + 1:nxt_first]), "\n".join(lines[first + 1:through]))
        out.append((first, token.content, joins))
    return out


def _closed(fence) -> bool:
    """Whether a fence token ends at a closing fence (its lines: the opener, its content, and the closer)."""
    first, end = fence.map  # the opening line, and the line after the fence's last line
    content = fence.content
    content_lines = content.count("\n") + (1 if content and not content.endswith("\n") else 0)
    return end - first == content_lines + 2


def blocks(text: str) -> list[Block]:
    """Every non-blank candidate block of ``text``, in the order they start: fences and tag blocks together."""
    line_starts = [0] + [m.end() for m in re.finditer(r"\r\n?|\n", text)]
    found = []
    for first, code, joins in fenced_blocks(text):
        found.append(Block(line_starts[first], code.strip("\n"), tuple(j.strip("\n") for j in joins)))
    for start, body in _tag_blocks(text):
        inner = fenced_blocks(body)
        found.append(Block(start, (inner[0][1] if inner else body).strip("\n")))
    return sorted((b for b in found if b.code.strip()), key=lambda b: b.start)


def _tag_blocks(text: str):
    """(start of content, content) of each closed <execute>/<solution> block, left to right.

    Each opener's search starts where the last one ended, so any text costs linear time."""
    next_open = {tag: text.find(f"<{tag}>") for tag in _TAGS}
    pos = 0
    while True:
        for tag in _TAGS:  # refresh the cached next opener of each kind that now lies behind pos
            if 0 <= next_open[tag] < pos:
                next_open[tag] = text.find(f"<{tag}>", pos)
        open_now = [(at, tag) for tag, at in next_open.items() if at >= 0]
        if not open_now:
            return
        start, tag = min(open_now)
        body = start + len(tag) + 2
        end = text.find(f"</{tag}>", body)
        if end < 0:  # this opener never closes, so no later one of its kind does
            next_open[tag] = -1
            continue
        yield body, text[body:end]
        pos = end + len(tag) + 3


def defining_code(block: Block, name: str) -> str | None:
    """The code of ``block`` (or of its first join that tokenizes) when it defines ``name`` at its top level."""
    word = re.compile(rf"\b{re.escape(name)}\b")  # a name token is a whole word: ``f_`` holds no ``f``
    if not word.search(block.joins[-1] if block.joins else block.code):  # the longest reading holds the others
        return None
    for code in (block.code, *block.joins):
        found = top_level_defines(code, name)
        if found is not None:
            return code if found else None
    unindented = re.compile(rf"^(?:async[ \t]++)?def[ \t]++{re.escape(name)}\b|^{re.escape(name)}[ \t]*+=(?!=)", re.M)
    return block.code if unindented.search(block.code) else None


def defines(code: str, name: str) -> bool:
    """Whether a piece of code defines ``name`` at its top level, by the rule that picks the defining block."""
    return defining_code(Block(0, code), name) is not None


def extract_code(text: str, entry_point: str | None = None) -> str | None:
    r"""The code the completion answers with (see the module docstring for the rules); None when it has none.

    >>> extract_code("```python\ndef f(x):\n    return x + 1\n```\nTry it:\n```python\nassert f(3) == 4\n```", "f")
    'def f(x):\n    return x + 1'
    >>> extract_code("Run:\n```bash\npython solution.py\n```\n```python\ndef f(x):\n    return 2 * x\n```", "f")
    'def f(x):\n    return 2 * x'
    """
    found = blocks(text)
    if entry_point:
        for block in reversed(found):
            code = defining_code(block, entry_point)
            if code is not None:
                return code
    return found[-1].code if found else None
