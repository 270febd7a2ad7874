"""Importers: turn real trace formats into molrl traces.

MINT (``xingyaoww/mint-bench`` ``results.jsonl`` rows: ``{task: {task_id, task_name, prompt,
reference}, state: {history, success, terminate_reason, ...}}``):
  * the first user message is the task, kept whole as the prompt (it includes MINT's in-context
    example, which is part of what the agent saw), or without that example with ``strip_example``
    (``strip_mint_example``: 500 to 670 Qwen3 tokens less per trace);
  * every later user message is environment feedback (``Observation:`` output, ``Expert
    feedback:`` critique) and becomes a ``tool`` message;
  * assistant messages keep their ``<thought>`` / ``<execute>`` / ``<solution>`` text; MINT's
    transcript label ``Assistant:`` at the start of each one is removed, since the model did not
    write it (its generation started after that label), and so is every label stacked right after
    it in any spelling (GPT-4 often opened its turn with a second, full-width ``Assistant：``);
    a label later inside a turn is the model's own text and stays;
  * meta keeps the task id, task name, reference answer, success, termination reason, and the
    agent and feedback model names read from the file name ``<model>_F_<feedback>__<set>.jsonl``.

OpenAI-style (``{"messages": [{role, content}, ...], ...}``): roles system/user/assistant/tool
pass through; other role names are errors unless mapped explicitly (``role_map={"function":
"tool"}``); extra message keys (``name``, ``tool_call_id``) are errors unless listed in
``drop_keys``; other top-level keys go to meta.

ToRA (``microsoft/ToRA`` corpus rows and inference outputs): tool-integrated completions whose
```` ```output ```` blocks become ``tool`` messages between assistant turns; see
``molrl.traces.tora``. One inference row holds several completions and gives one trace each.

Every format: the task (the first user message) is known by its content, ``meta["task_key"]``, and by the
benchmark task it is when a ``BenchmarkIndex`` is given, ``meta["benchmark_task"]`` (``molrl.tasks.index``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from molrl.chat import ROLES
from molrl.errors import DataError
from molrl.records.jsonl import read_lines
from molrl.tasks.index import BenchmarkIndex, first_user_text, tag_meta
from molrl.traces.schema import Reject, Trace, TraceError, raw_format, raw_format_note
from molrl.traces.tora import tora_record_to_traces

FORMATS = ("mint", "openai", "tora")
_MINT_NAME = re.compile(r"^(?P<model>.+?)_F_(?P<feedback>.+?)__(?P<dataset>[^_].*)$")
_ASSISTANT_LABEL = re.compile(r"\s*assistant[ \t]*[:\uff1a\ufe55\ufe13][ \t]*\n?", re.IGNORECASE)
"""A transcript label opening an assistant turn: ``Assistant:``, ``Assistant：`` (full-width colon),
``assistant :``...; one or several in a row are removed (``without_labels``)."""
_MINT_PART = "\n\n---\n\nTask:\n"
"""What opens MINT's in-context example and, after it, the task in the first user message."""


@dataclass
class ImportResult:
    """Traces converted from one input file, with every record that could not be."""

    path: str
    """The input file."""
    traces: list[tuple[int, Trace]] = field(default_factory=list)
    """``(line_no, trace)`` for every converted trace (a ToRA inference row gives several per line)."""
    rejects: list[Reject] = field(default_factory=list)
    """Records that could not be converted, with the reason."""


def mint_file_info(path: str | Path) -> dict[str, str]:
    """Agent model, feedback model and dataset parsed from a MINT file name (empty if it does not parse)."""
    m = _MINT_NAME.match(Path(path).stem)
    if not m:
        return {}
    feedback = None if m["feedback"] == "None" else m["feedback"]
    return {"model": m["model"], "feedback_model": feedback, "dataset": m["dataset"]}


def strip_mint_example(prompt: str) -> str:
    """MINT's first user message without its in-context example: the instructions, then the task.

    MINT writes that message as ``{instructions}\n\n---\n\nTask:\n{example}\n\n---\n\nTask:\n{task}``,
    the example a whole solved episode (its ``Assistant:`` turns and ``Observation:`` replies), one fixed
    text per task set; exactly the block from the first ``---`` to the second is removed.
    """
    start = prompt.find(_MINT_PART)
    end = prompt.find(_MINT_PART, start + len(_MINT_PART)) if start >= 0 else -1
    if end < 0 or "\nAssistant:" not in prompt[start:end]:
        raise TraceError("the first user message holds no MINT in-context example (instructions, ---, Task: with a "
                         "solved example, ---, Task:); convert it without --strip-example")
    return prompt[:start] + prompt[end:]


def without_labels(content: str) -> str:
    """An assistant turn without the transcript labels stacked at its start (``Assistant:\\nAssistant：``), read one
    label at a time, so a turn of any length costs linear time; a label later in the turn stays."""
    end = 0
    while label := _ASSISTANT_LABEL.match(content, end):
        end = label.end()
    return content[end:]


def mint_record_to_trace(row: Any, file_info: dict[str, str] | None = None, strip_example: bool = False) -> Trace:
    """One MINT results row as a trace (the prompt's in-context example removed with ``strip_example``);
    raises ``TraceError`` naming what is missing."""
    if not isinstance(row, dict):
        raise TraceError(f"MINT row is a JSON {type(row).__name__}; expected an object with 'task' and 'state'")
    task, state = row.get("task"), row.get("state")
    if not isinstance(task, dict) or not isinstance(state, dict):
        raise TraceError("MINT row needs objects 'task' and 'state'; is this a MINT results.jsonl file?")
    history = state.get("history")
    if not isinstance(history, list) or not history:
        raise TraceError("MINT row has no state.history (an empty conversation)")
    messages = []
    for i, turn in enumerate(history):
        role = turn.get("role") if isinstance(turn, dict) else None
        content = turn.get("content") if isinstance(turn, dict) else None
        if role not in ("user", "assistant"):
            raise TraceError(f"state.history[{i}] has role {role!r}; MINT histories hold only user/assistant")
        if not isinstance(content, str):
            raise TraceError(f"state.history[{i}] ({role}) has content of type {type(content).__name__}; expected a string")
        if role == "assistant":
            messages.append({"role": "assistant", "content": without_labels(content)})
        else:
            messages.append({"role": "user" if not messages else "tool", "content": content})
    if messages[0]["role"] != "user":
        raise TraceError("state.history[0] should be the user's task")
    if strip_example:
        messages[0]["content"] = strip_mint_example(messages[0]["content"])
    meta = {
        "source": "mint",
        "kind": "domain",
        "task_id": task.get("task_id"),
        "task_name": task.get("task_name"),
        "reference": task.get("reference"),
        "success": state.get("success"),
        "terminate_reason": state.get("terminate_reason"),
        **(file_info or {}),
        **({"example_stripped": True} if strip_example else {}),
    }
    if not isinstance(meta["success"], bool):
        raise TraceError(f"state.success is {meta['success']!r}; expected true or false")
    trace = Trace(messages=messages, meta=meta)
    trace.validate()
    return trace


@dataclass
class OpenAIOptions:
    """Explicit mappings for OpenAI-style records; nothing is renamed or dropped unless listed."""

    role_map: dict[str, str] = field(default_factory=dict)
    """Extra role names mapped onto system/user/assistant/tool, e.g. {"function": "tool"}."""
    drop_keys: tuple[str, ...] = ()
    """Message keys to discard (e.g. "name", "tool_call_id"); any other extra key is an error."""


def openai_record_to_trace(record: Any, options: OpenAIOptions | None = None) -> Trace:
    """One ``{"messages": [...], ...}`` record as a trace; other top-level keys become meta."""
    options = options or OpenAIOptions()
    if not isinstance(record, dict) or "messages" not in record:
        raise TraceError("record needs a 'messages' list of {role, content} objects")
    raw_messages = record["messages"]
    if not isinstance(raw_messages, list):
        raise TraceError(f"'messages' is a {type(raw_messages).__name__}; expected a list")
    messages = []
    for i, msg in enumerate(raw_messages):
        if not isinstance(msg, dict):
            raise TraceError(f"message {i} is a {type(msg).__name__}; expected an object")
        role = msg.get("role")
        mapped = role if role in ROLES else options.role_map.get(role)
        if mapped not in ROLES:
            raise TraceError(
                f"message {i} has role {role!r}; expected one of {'/'.join(ROLES)} "
                f"(map it explicitly, e.g. --map-role {role}=tool)"
            )
        extra = sorted(set(msg) - {"role", "content"} - set(options.drop_keys))
        if extra:
            raise TraceError(f"message {i} ({role}) has key {extra[0]!r}; drop it explicitly with --drop-key {extra[0]}")
        messages.append({"role": mapped, "content": msg.get("content")})
    meta = dict(record.get("meta") or {})
    meta.update({k: v for k, v in record.items() if k not in ("messages", "meta")})
    meta.setdefault("source", "openai")
    meta.setdefault("kind", "domain")
    trace = Trace(messages=messages, meta=meta)
    trace.validate()
    return trace


def import_file(path: str | Path, fmt: str, options: OpenAIOptions | None = None,
                strip_example: bool = False, index: BenchmarkIndex | None = None) -> ImportResult:
    """Convert every record of one JSONL file; bad records are kept in ``rejects`` with the reason.

    ``strip_example`` (MINT only) removes MINT's in-context example from each prompt. Every trace gets its task's
    content key (``meta["task_key"]``) and, when ``index`` matches its task, ``meta["benchmark_task"]``
    (``molrl.tasks.index``)."""
    if strip_example and fmt != "mint":
        raise ValueError(f"strip_example is a MINT option; format {fmt!r} has no in-context example to strip")
    if fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; expected one of {', '.join(FORMATS)}")
    result = ImportResult(str(path))
    info = mint_file_info(path) if fmt == "mint" else {}
    for line_no, raw, record, error in _json_lines(path):
        if error:
            result.rejects.append(Reject(str(path), line_no, error, raw))
            continue
        try:
            traces = _convert(record, fmt, info, options, strip_example)
        except TraceError as err:
            result.rejects.append(Reject(str(path), line_no, str(err), raw))
            continue
        for trace in traces:
            tag_meta(trace.meta, first_user_text(trace.messages), index)
        result.traces += [(line_no, trace) for trace in traces]
    return result


def _convert(record: Any, fmt: str, mint_info: dict[str, str], options: OpenAIOptions | None,
             strip_example: bool = False) -> list[Trace]:
    """The traces of one record in format ``fmt``; raises ``TraceError`` saying what is wrong."""
    raw = raw_format(record)
    if raw is not None and raw != fmt:
        raise TraceError(f"{raw_format_note(raw)}, not --from {fmt}; convert it with --from {raw}")
    if fmt == "mint" and isinstance(record, dict) and "messages" in record:
        raise TraceError("a record with 'messages' (a trace or OpenAI-style record), not a MINT row; convert it "
                         "with --from openai, or use it as it is if it is already a molrl trace")
    if fmt == "mint":
        return [mint_record_to_trace(record, mint_info, strip_example)]
    if fmt == "tora":
        return tora_record_to_traces(record)
    return [openai_record_to_trace(record, options)]


def _json_lines(path: str | Path) -> Iterator[tuple[int, str, Any, str | None]]:
    """``(line_no, raw, parsed, error)`` for each non-blank line (read by ``molrl.records.jsonl``)."""
    for line in read_lines(path):
        try:
            yield line.number, line.text, line.json(), None
        except DataError as err:
            yield line.number, line.text, None, err.message
