"""The trace format: one JSON object per line, ``{"messages": [...], "meta": {...}}``.

Roles are ``system`` / ``user`` / ``assistant`` / ``tool``; ``tool`` messages are environment
feedback (interpreter output, test results, expert critique). Content is always a string;
assistant turns may carry one ``<think>...</think>`` block before the answer.

Meta conventions shared by every stage:
  ``kind``     "domain" (the MoL data mix, default) or "general" (replay data);
  ``success``  the final verdict of the episode (bool);
  ``source``   where the trace came from ("mint", "collect", ...);
  ``task_id``  the task's id in its source.

Reading never drops a bad record silently: ``read_traces`` yields the good ones and keeps every
bad one (file, line, reason) in ``reader.rejects``; with ``strict=True`` it raises at the end of the
file, listing every bad record one line each (``rejects_error``).
Writing appends one complete line with a single write plus fsync, so a killed writer leaves at
worst a truncated final line, which the reader reports instead of crashing. Files are read by
``molrl.records.jsonl``: gzip is read through, a byte-order mark skipped, a line that is not UTF-8 rejected.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from molrl.chat import ROLES
from molrl.errors import DataError, MolrlError
from molrl.records.jsonl import Line, json_line, lone_surrogate, read_lines, write_jsonl
from molrl.records.writes import resolve_output

KINDS = ("domain", "general")
RAW_FORMATS = {"mint": ("MINT", ("task", "state")), "tora": ("ToRA", ("question", "code"))}
"""Formats ``molrl traces convert`` imports whose records are no traces: name and the top-level keys they hold."""
MAX_LISTED = 20
"""Bad records an error lists one line each; the rest are counted."""


class TraceError(MolrlError):
    """A trace is invalid or cannot be tokenised; callers prefix the file and line."""


@dataclass
class Trace:
    """One multi-turn episode: the chat messages and free-form metadata."""

    messages: list[dict[str, str]]
    """Chat messages, each ``{"role": system|user|assistant|tool, "content": str}``."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Source, task id, success, kind and anything else the producer keeps."""

    @property
    def kind(self) -> str:
        """``domain`` (default) or ``general``."""
        return self.meta.get("kind", "domain")

    @property
    def success(self) -> bool | None:
        """The episode's final verdict, if recorded."""
        return self.meta.get("success")

    def count(self, role: str) -> int:
        """How many messages have ``role``."""
        return sum(m["role"] == role for m in self.messages)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready record."""
        return {"messages": [dict(m) for m in self.messages], "meta": dict(self.meta)}

    def to_json(self) -> str:
        """The record as one JSON line (no trailing newline), lone surrogates escaped (``molrl.records.jsonl.json_line``)."""
        return json_line(self.to_dict())

    @classmethod
    def from_dict(cls, record: Any) -> "Trace":
        """Validate a parsed record and build the trace; raises ``TraceError`` saying what is wrong."""
        if not isinstance(record, dict):
            raise TraceError(f"record is a JSON {type(record).__name__}; expected an object with 'messages' and 'meta'")
        raw = raw_format(record)
        if raw is not None:
            raise TraceError(f"{raw_format_note(raw)}, not a molrl trace; convert the file first: "
                             f"molrl traces convert --from {raw} IN OUT")
        unknown = sorted(set(record) - {"messages", "meta"})
        if unknown:
            raise TraceError(f"unknown top-level key {unknown[0]!r}; a trace has only 'messages' and 'meta'")
        meta = record.get("meta", {})
        if not isinstance(meta, dict):
            raise TraceError(f"'meta' is a {type(meta).__name__}; expected an object")
        trace = cls(messages=record.get("messages"), meta=meta)  # type: ignore[arg-type]
        trace.validate()
        return trace

    def validate(self) -> None:
        """Check roles, contents, order and meta conventions; raises ``TraceError`` on the first problem."""
        messages = self.messages
        if messages is None:
            raise TraceError("missing 'messages'; expected a list of {role, content} objects")
        if not isinstance(messages, list):
            raise TraceError(f"'messages' is a {type(messages).__name__}; expected a list")
        if not messages:
            raise TraceError("empty conversation: 'messages' has no messages")
        for i, msg in enumerate(messages):
            _check_message(i, msg)
        check_text(messages)
        _check_order(messages)
        _check_meta(self.meta)


def _check_message(i: int, msg: Any) -> None:
    if not isinstance(msg, dict):
        raise TraceError(f"message {i} is a {type(msg).__name__}; expected an object with 'role' and 'content'")
    role = msg.get("role")
    if role not in ROLES:
        raise TraceError(f"message {i} has role {role!r}; expected one of {'/'.join(ROLES)}")
    extra = sorted(set(msg) - {"role", "content"})
    if extra:
        raise TraceError(
            f"message {i} ({role}) has key {extra[0]!r}; messages carry only 'role' and 'content' "
            "(convert with an importer that maps it explicitly)"
        )
    content = msg.get("content")
    if not isinstance(content, str):
        raise TraceError(f"message {i} ({role}) has content of type {type(content).__name__}; expected a string")
    if not content.strip():
        raise TraceError(f"message {i} ({role}) has empty content")


def check_text(messages: Any) -> None:
    """Refuse messages that hold a lone surrogate (no tokenizer or UTF-8 file takes one), naming where, in the words
    of the file readers (``molrl.records.jsonl``): a trace built in Python is checked as a trace read from a file."""
    found = lone_surrogate(list(messages), "messages")
    if found is not None:
        raise TraceError(f"{found}; a lone surrogate is not text: remove it or write the character it was meant to be")


def _check_order(messages: list[dict[str, str]]) -> None:
    roles = [m["role"] for m in messages]
    for i, role in enumerate(roles):
        if role == "system" and i != 0:
            raise TraceError(f"message {i} is a system message; only message 0 may be the system prompt")
    first = 1 if roles[0] == "system" else 0
    if first >= len(roles) or roles[first] != "user":
        got = roles[first] if first < len(roles) else "nothing"
        raise TraceError(f"message {first} should be the user's task, got {got}")
    if "assistant" not in roles:
        raise TraceError("no assistant message: a trace needs at least one model turn")
    seen_assistant = False
    for i, role in enumerate(roles):
        if role == "tool" and not seen_assistant:
            raise TraceError(f"message {i} is tool feedback before any assistant turn")
        seen_assistant |= role == "assistant"


def _check_meta(meta: dict[str, Any]) -> None:
    if "kind" in meta and meta["kind"] not in KINDS:
        raise TraceError(f"meta.kind is {meta['kind']!r}; expected one of {'/'.join(KINDS)}")
    if "success" in meta and not isinstance(meta["success"], bool):
        raise TraceError(f"meta.success is {meta['success']!r}; expected true or false")


@dataclass
class Reject:
    """A record that could not be used: where it is, why, and its raw text."""

    path: str
    """The file it came from."""
    line: int
    """1-based line number."""
    reason: str
    """What is wrong with it."""
    raw: str = ""
    """The record's raw text (for the rejects file)."""

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form written to rejects files."""
        return {"file": self.path, "line": self.line, "error": self.reason, "raw": self.raw}


class TraceReader:
    """Iterates ``(line_no, Trace)`` over a JSONL file; bad records land in ``rejects``."""

    def __init__(self, path: str | Path, strict: bool = False):
        self.path = Path(path)
        self.strict = strict
        self.rejects: list[Reject] = []

    def reject(self, line: int, reason: str, raw: str = "") -> None:
        """Record a bad record (a strict reader raises them all, listed, once the file is read)."""
        self.rejects.append(Reject(str(self.path), line, reason, raw))

    def __iter__(self) -> Iterator[tuple[int, Trace]]:
        for line in read_lines(self.path):
            trace = self._parse(line)
            if trace is not None:
                yield line.number, trace
        if self.strict and self.rejects:
            raise rejects_error(self.rejects)

    def _parse(self, line: Line) -> Trace | None:
        try:
            return Trace.from_dict(line.json())
        except DataError as err:
            self.reject(line.number, err.message, line.text)
        except TraceError as err:
            self.reject(line.number, str(err), line.text)
        return None


def raw_format(record: Any) -> str | None:
    """The importer format (``mint``, ``tora``) of a record that is one's raw row and holds no messages, else None."""
    if not isinstance(record, dict) or "messages" in record:
        return None
    return next((fmt for fmt, (_, keys) in RAW_FORMATS.items() if all(key in record for key in keys)), None)


def raw_format_note(fmt: str) -> str:
    """``a raw MINT record (top-level keys 'task' and 'state')``: what names a record of format ``fmt``."""
    name, keys = RAW_FORMATS[fmt]
    return f"a raw {name} record (top-level keys {' and '.join(repr(k) for k in keys)})"


def read_traces(path: str | Path, strict: bool = False) -> TraceReader:
    """A reader over ``path``: iterate for ``(line_no, Trace)``, then inspect ``.rejects``."""
    return TraceReader(path, strict=strict)


def rejects_error(rejects: Sequence[Reject]) -> DataError:
    """The error to raise for bad records: one names its file and line; several are listed one line each.

    The first ``MAX_LISTED`` are listed, then a count of the rest, so one run shows everything to fix.
    """
    first = rejects[0]
    if len(rejects) == 1:
        return DataError(first.path, first.line, first.reason)
    files = ", ".join(dict.fromkeys(r.path for r in rejects))
    if len({r.reason for r in rejects}) == 1:  # one cause (a file in another format): said once
        lines = ", ".join(str(r.line) for r in rejects[:5]) + (", ..." if len(rejects) > 5 else "")
        return DataError(files, None, f"{len(rejects)} bad records (lines {lines}), each: {first.reason}")
    listed = "".join(f"\n  {r}" for r in rejects[:MAX_LISTED])
    if len(rejects) > MAX_LISTED:
        listed += f"\n  ... and {len(rejects) - MAX_LISTED} more"
    return DataError(files, None, f"{len(rejects)} bad records; fix or delete them (`molrl traces filter IN OUT` "
                                  f"keeps the good ones and writes the rest to OUT.rejects.jsonl):{listed}")


def append_trace(path: str | Path, trace: Trace) -> None:
    """Append one trace as a complete line: validate, one O_APPEND write, fsync.

    A file whose last line was torn by a killed writer gets a newline first, so the torn line
    stays separate (and reported by the reader) and the new record is intact.
    """
    trace.validate()
    data = (trace.to_json() + "\n").encode("utf-8")
    out = resolve_output(path)  # molrl.records.writes' rule for output paths: a file, or a stream written in place
    fd = os.open(out.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data  # a torn tail stays its own (reported) line; this record stays whole
        written = os.write(fd, data)
        while written < len(data):  # only on exotic filesystems; the reader flags any torn tail
            written += os.write(fd, data[written:])
        if out.kind != "stream":
            os.fsync(fd)
    finally:
        os.close(fd)


def write_traces(path: str | Path, traces: Iterable[Trace]) -> int:
    """Write a whole trace file atomically (temp file + rename); returns the number written."""
    return write_jsonl(path, (t.to_dict() for t in traces))
