"""Per-file trace statistics under a chat template: traces, turns and tokens by role."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from molrl.traces.schema import Reject, read_traces
from molrl.traces.tokenize import TokenizeConfig, tokenize_file

log = logging.getLogger("molrl.traces")

NO_FEEDBACK_CAUSE = (
    "MoL learns from tool messages (environment feedback). A common cause: whole tool-integrated completions "
    "imported as one assistant message each; import them with `molrl traces convert --from tora` (tool output "
    "becomes tool messages), or keep the traces that have feedback (`molrl traces filter --min-feedback-turns 1`)"
)


@dataclass
class FileStats:
    """Counts for one trace file (token counts cover the traces that tokenised)."""

    path: str
    """The trace file."""
    traces: int = 0
    """Valid trace records."""
    general: int = 0
    """Valid traces tagged general (replay data, which needs no feedback)."""
    rejects: int = 0
    """Records that are invalid or failed to tokenise (see ``reject_reasons``)."""
    turns: int = 0
    """Assistant turns."""
    feedback_turns: int = 0
    """Tool (environment feedback) messages."""
    no_feedback: int = 0
    """Traces without any tool message."""
    successes: int = 0
    """Traces whose meta.success is true."""
    tokens: int = 0
    """All tokens."""
    prompt_tokens: int = 0
    """System and user tokens."""
    decision_tokens: int = 0
    """Assistant-written tokens."""
    feedback_tokens: int = 0
    """Environment-written tokens."""
    template_tokens: int = 0
    """Role headers and other template tokens."""
    max_tokens: int = 0
    """Longest trace in tokens."""
    reject_reasons: list[Reject] = field(default_factory=list)
    """Every rejected record with its reason."""

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (rejects as ``file:line: reason`` strings)."""
        data = asdict(self)
        data["reject_reasons"] = [str(r) for r in self.reject_reasons]
        return data


def file_stats(path: str | Path, tokenizer: Any, cfg: TokenizeConfig | None = None) -> FileStats:
    """Read and tokenise every trace in ``path``; counts by role, rejects with file and line."""
    cfg = replace(cfg or TokenizeConfig(), require_feedback=False)  # traces without feedback are counted, not rejected
    stats = FileStats(str(path))
    done, stats.reject_reasons = tokenize_file(path, tokenizer, cfg)
    traces = dict(read_traces(path))  # line -> trace, for turn counts and meta
    for line_no, tok in done:
        trace = traces[line_no]
        stats.traces += 1
        stats.general += trace.kind == "general"
        stats.turns += trace.count("assistant")
        stats.feedback_turns += trace.count("tool")
        stats.no_feedback += trace.count("tool") == 0
        stats.successes += trace.success is True
        stats.tokens += tok.n_tokens
        stats.prompt_tokens += tok.n_prompt
        stats.decision_tokens += tok.n_decision
        stats.feedback_tokens += tok.n_feedback
        stats.template_tokens += tok.n_template
        stats.max_tokens = max(stats.max_tokens, tok.n_tokens)
    stats.rejects = len(stats.reject_reasons)
    for warning in file_warnings(path, stats.traces + stats.rejects, stats.traces - stats.general, stats.feedback_tokens):
        log.warning("%s", warning)
    return stats


def file_warnings(path: str | Path, records: int, domain: int, feedback_tokens: int) -> list[str]:
    """What makes a trace file useless for MoL though it reads without error: no records, no feedback."""
    if records == 0:
        return [f"{path}: no trace records (the file is empty or blank); check the path, or re-run the step that writes it"]
    if domain and not feedback_tokens:
        return [f"{path}: none of its {domain} domain traces has a feedback token. {NO_FEEDBACK_CAUSE}"]
    return []


def total(stats: list[FileStats]) -> FileStats:
    """The column sums of several files (max for ``max_tokens``)."""
    out = FileStats("total")
    for s in stats:
        for name in ("traces", "general", "rejects", "turns", "feedback_turns", "no_feedback", "successes", "tokens",
                     "prompt_tokens", "decision_tokens", "feedback_tokens", "template_tokens"):
            setattr(out, name, getattr(out, name) + getattr(s, name))
        out.max_tokens = max(out.max_tokens, s.max_tokens)
        out.reject_reasons += s.reject_reasons
    return out


@dataclass
class BenchmarkOverlap:
    """How many traces of one file are tasks of each benchmark split (``molrl.tasks.index``)."""

    path: str
    """The trace file."""
    total: int = 0
    """Valid trace records."""
    traces: dict[str, int] = field(default_factory=dict)
    """Per ``benchmark/split``: traces whose task is one of its tasks."""
    tasks: dict[str, set[str]] = field(default_factory=dict)
    """Per ``benchmark/split``: the distinct task ids those traces are on."""


def benchmark_overlap(path: str | Path, index: Any) -> BenchmarkOverlap:
    """The traces of ``path`` per benchmark split of ``index`` (a ``BenchmarkIndex``), matched by content."""
    out = BenchmarkOverlap(str(path))
    for _line, trace in read_traces(path):
        out.total += 1
        match = index.match_trace(trace.messages, trace.meta)
        if match is not None:
            label = f"{match.benchmark}/{match.split}"
            out.traces[label] = out.traces.get(label, 0) + 1
            out.tasks.setdefault(label, set()).add(match.id)
    return out


def overlap_total(overlaps: list[BenchmarkOverlap]) -> BenchmarkOverlap:
    """The sums of several files' overlaps (distinct tasks over all of them)."""
    out = BenchmarkOverlap("total")
    for o in overlaps:
        out.total += o.total
        for label, n in o.traces.items():
            out.traces[label] = out.traces.get(label, 0) + n
            out.tasks.setdefault(label, set()).update(o.tasks[label])
    return out
