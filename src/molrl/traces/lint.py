"""What a trace holds that reads without error but trains what it should not (``molrl traces lint``).

**Model-written feedback.** A decision (assistant) turn that goes on past its action in the environment's voice: after
its first complete action (``<execute>...</execute>``, ``<solution>...</solution>`` or a closed ```` ```python ````
block, read by ``molrl.episode.actions.parse_action``) a line opens with a label the environment writes
(``Observation:``, ``Output:``, ``Error:``, ``Expert feedback:``; any case, a full-width colon too) or an
```` ```output ```` block. The environment never saw that text: the model wrote the tool's reply itself, and usually
invented it (``Observation:\\n[Executed Successfully with Output]`` before anything ran), then often the next turn. The
trace format keeps everything an assistant turn holds as decision tokens, so a MoL or CE run trains the model to
write tool output of its own. ``traces filter`` says how many traces hold such a turn and leaves them out with
``--drop-model-feedback``.

Every check reads each character a bounded number of times, so any text costs linear time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from molrl.episode.actions import parse_action
from molrl.traces.schema import Reject, read_traces

ENVIRONMENT_VOICE = re.compile(r"^[ \t]*+(?:(?:observation|output|error|expert feedback)[ \t]*+[:\uff1a]|```output\b)",
                               re.IGNORECASE | re.MULTILINE)
"""A line the environment writes, not the model: MINT's ``Observation:`` and ``Expert feedback:``, molrl's own
``Output:`` and ``Error:``, ToRA's ```` ```output ```` block."""
MAX_SHOWN = 10
"""Most turns a file's ``LintCounts.examples`` names, and most lines ``traces lint`` prints (the first turn of each
file); the rest are counted."""


@dataclass(frozen=True)
class ModelFeedback:
    """One decision turn that writes the environment's reply itself."""

    message: int
    """The turn's index in the trace's messages."""
    offset: int
    """Where, in the turn's text, the line holding the environment's label starts."""
    label: str
    """The label as the model wrote it (``Observation:``)."""


def model_feedback(text: str) -> tuple[int, str] | None:
    """(offset, label) of the first line in the environment's voice after the first complete action of a decision
    turn's ``text``; None when the turn has no action or stops after it."""
    action = parse_action(text, "code")  # the action format's own reader: what the environment would run
    if action.kind == "none":
        return None
    found = ENVIRONMENT_VOICE.search(text, action.end)
    return (found.start(), found.group().strip()) if found else None


def trace_model_feedback(messages: list[dict[str, Any]]) -> list[ModelFeedback]:
    """Every decision turn of a trace's ``messages`` that writes the environment's reply itself."""
    found = []
    for i, message in enumerate(messages):
        if message.get("role") == "assistant" and (hit := model_feedback(str(message.get("content") or ""))):
            found.append(ModelFeedback(i, *hit))
    return found


@dataclass
class LintCounts:
    """What ``lint_file`` found in one trace file."""

    path: str
    """The trace file."""
    traces: int = 0
    """Valid traces."""
    decision_turns: int = 0
    """Assistant messages."""
    model_feedback_turns: int = 0
    """Decision turns that write the environment's reply themselves."""
    model_feedback_traces: int = 0
    """Traces with at least one such turn."""
    examples: list[str] = field(default_factory=list)
    """``file:line: message i (assistant) writes 'Observation:' at character k, after its action`` for the first
    ``MAX_SHOWN`` such turns."""
    rejects: list[Reject] = field(default_factory=list)
    """Records that are no valid trace."""


def lint_file(path: str | Path) -> LintCounts:
    """Count the decision turns of every trace in ``path`` that write the environment's reply themselves."""
    counts = LintCounts(str(path))
    reader = read_traces(path)
    for line_no, trace in reader:
        counts.traces += 1
        counts.decision_turns += trace.count("assistant")
        found = trace_model_feedback(trace.messages)
        counts.model_feedback_turns += len(found)
        counts.model_feedback_traces += bool(found)
        for hit in found[:max(0, MAX_SHOWN - len(counts.examples))]:
            counts.examples.append(f"{path}:{line_no}: message {hit.message} (assistant) writes {hit.label!r} at "
                                   f"character {hit.offset + 1}, after its action")
    counts.rejects = reader.rejects
    return counts


def filter_line(held: int, total: int, dropped: bool) -> str:
    """The one line ``traces filter`` prints of the ``held`` traces of ``total`` that write feedback themselves."""
    what = (f"model-written feedback: {held} of {total} traces have a decision turn that goes on past its action with "
            "the environment's reply written by the model (Observation:, Output:, ...)")
    if dropped:
        return f"{what}; left out (--drop-model-feedback)"
    return (f"{what}; kept, as decision tokens the run trains on: --drop-model-feedback leaves them out, "
            "`molrl traces lint` lists them")
