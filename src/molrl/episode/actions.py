"""The action format: what a model writes to run code or submit a solution, and how it is read.

A turn may think first (``<think>...</think>`` or free text), then does exactly one thing:

- run Python: ``<execute>code</execute>`` or a fenced block `````python ... `````;
- submit: ``<solution>...</solution>`` (code tasks: the complete function; math tasks: the final
  answer), or, for math tasks, a ``\\boxed{...}`` answer.

The first action in the turn (after any complete think block) is the one taken; text after it is
cut from the recorded turn, as if generation had stopped there (the stop strings
``</execute>`` / ``</solution>`` usually make it so already). An unterminated block is no action:
code cut off by the token limit is not run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

SYSTEM_PROMPT = """\
You solve the task by working with a Python environment over several turns.
In each turn, reason step by step, then end the turn with exactly one action:
1) Run Python code and see its output (printed output, errors, tracebacks):
<execute>
print(1 + 1)
</execute>
Each block runs in a fresh Python process, so include every definition and import it needs.
2) Submit your final solution:
<solution>
...
</solution>
For a coding task the solution is the complete code of the requested function; for a math task it \
is the final answer only, e.g. <solution>42</solution> (\\boxed{42} also counts as a submission).
You have {max_turns} turns and can submit a solution {max_solutions} times."""
"""The default instructions; the loop fills in ``{max_turns}`` and ``{max_solutions}``."""

STOP_STRINGS = ["</execute>", "</solution>"]
"""Stop strings that end a turn right after its action."""

ActionKind = Literal["code", "solution", "none"]

_THINK_END = "</think>"
_TAGS = {"code": ("<execute>", "</execute>"), "solution": ("<solution>", "</solution>")}
_CODE_FENCE = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_CODE_FENCE_OPEN = re.compile(r"```(?:python|py)[ \t]*\n", re.IGNORECASE)


@dataclass
class Action:
    """What one model turn asks the environment to do."""

    kind: ActionKind
    """``code`` to run, ``solution`` to grade, ``none`` when no complete action was found."""
    content: str
    """The code to run or the submitted solution text (empty for ``none``)."""
    raw: str
    """The action as written, tags or fence included (what the graders read)."""
    end: int
    """Character offset in the turn where the action ends; the recorded turn is cut there."""
    problem: str = ""
    """For ``none``: why no action was taken (no block, or an unterminated one)."""


def parse_action(text: str, task_kind: Literal["code", "math"]) -> Action:
    """The first complete action in a model turn (see the module docstring for the format)."""
    start = _after_thinking(text)
    candidates: list[tuple[int, Action]] = []
    for kind, (open_tag, close_tag) in _TAGS.items():
        i = text.find(open_tag, start)
        if i < 0:
            continue
        j = text.find(close_tag, i + len(open_tag))
        if j < 0:
            candidates.append((i, Action("none", "", "", len(text), f"the {open_tag} block is not closed with {close_tag}")))
        else:
            end = j + len(close_tag)
            body = text[i + len(open_tag) : j].strip("\n")
            candidates.append((i, Action(kind, body, text[i:end], end)))  # type: ignore[arg-type]
    fence = _CODE_FENCE.search(text, start)
    if fence:
        candidates.append((fence.start(), Action("code", fence.group(1).strip("\n"), fence.group(0), fence.end())))
    else:
        open_fence = _CODE_FENCE_OPEN.search(text, start)
        if open_fence:
            candidates.append((open_fence.start(), Action("none", "", "", len(text), "the ```python block is not closed with ```")))
    if task_kind == "math":
        boxed = _find_boxed(text, start)
        if boxed is not None:
            raw = text[boxed[0] : boxed[1]]
            candidates.append((boxed[0], Action("solution", raw[len("\\boxed{") : -1], raw, boxed[1])))
    if not candidates:
        return Action("none", "", "", len(text), "no <execute> or <solution> block")
    return min(candidates, key=lambda c: c[0])[1]


def think_well_formed(text: str) -> bool:
    """Whether a turn has no think tags, or one ``<think>...</think>`` block at its start (what trainers accept)."""
    opens, closes = text.count("<think>"), text.count(_THINK_END)
    if opens == closes == 0:
        return True
    return opens == closes == 1 and text.lstrip().startswith("<think>")


def _after_thinking(text: str) -> int:
    """Offset after the last complete think block (0 when there is none)."""
    i = text.rfind(_THINK_END)
    return 0 if i < 0 else i + len(_THINK_END)


def _find_boxed(text: str, start: int) -> tuple[int, int] | None:
    r"""Span of the first complete ``\boxed{...}`` (braces balanced) at or after ``start``.

    One scan pairs every brace: a box is complete where the brace it opens is closed. The first box to start among
    the complete ones is returned as soon as no earlier box is still open, so any text costs linear time."""
    opens: list[int] = []  # per brace still open: where its box starts, or -1 for a plain brace
    boxes_open = 0
    found: tuple[int, int] | None = None
    i = j = text.find("\\boxed{", start)  # braces before the first box close none
    while 0 <= j < len(text):
        if j == i:
            opens.append(j)
            boxes_open += 1
            j += len("\\boxed{")
            i = text.find("\\boxed{", j)
            continue
        char = text[j]
        if char == "{":
            opens.append(-1)
        elif char == "}" and opens:
            box = opens.pop()
            if box >= 0:
                boxes_open -= 1
                found = (box, j + 1) if found is None or box < found[0] else found
        if found is not None and not boxes_open:
            return found
        j += 1
    return found
