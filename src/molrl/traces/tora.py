"""ToRA-style tool-integrated completions as traces: output blocks become ``tool`` messages.

A ToRA (``microsoft/ToRA``) completion is one text in which the model writes reasoning and a
```` ```python ```` block, the interpreter's result is spliced in as an ```` ```output ```` block,
and the model goes on writing, for up to four rounds. ToRA's inference loop makes the split
exact: generation stops where the model would write ```` ```output ````, the model's text is
right-stripped, and the environment appends ``"\\n```output\\n{result}\\n```\\n"`` (plus
``"\\nReach max function call limit."`` after the last allowed round). So each output block's
content, and that notice, is what the environment wrote (a ``tool`` message, fences dropped, since
the chat template wraps tool messages its own way); everything between two output blocks is one
assistant turn (its text and code).

Two record shapes (one JSON object per line):

* the ToRA corpus (``data/tora/examples.jsonl``): ``{"messages": [{role, content}, ...], "id",
  "gt", ...}``; each assistant message is split into turns, other messages pass through; ``id``
  becomes ``meta.task_id``, ``gt`` ``meta.reference``, other keys stay in meta under their names;
* ToRA's inference outputs (``outputs/<model>/<data>/test_tora_*.jsonl``): ``{"idx", "question",
  "gt", "code": [completion, ...], "pred": [...], "report": [...], "score": [...]?}``: one trace per
  completion, the question as the user message; ``meta.sample`` is the completion's index and
  ``meta.success`` its ``score`` when the file has been through ToRA's evaluation. A completion
  that still begins with the few-shot prompt's ``{question}\\n\\nSolution:`` has it removed.

A completion without output blocks (a plain chain of thought) is one assistant turn: a valid trace
without feedback, which ``molrl traces filter --min-feedback-turns 1`` removes.
"""

from __future__ import annotations

import re
from typing import Any, Iterator

from molrl.traces.schema import Trace, TraceError

_OUTPUT_OPEN = "```output\n"
"""What opens the block the environment appends after a run: ToRA writes ``\\n```output\\n{result}\\n```\\n``."""
_FENCE_END = re.compile(r"\n```[ \t]*(?:\n|\Z)")
"""What closes it: a fence on a line of its own."""
_LIMIT_NOTICE = "Reach max function call limit."
"""The environment's line after the last round ToRA allows."""
_PYTHON_BLOCK = re.compile(r"```python\n.*?```", re.S)


def split_tool_text(text: str) -> list[dict[str, str]]:
    """An assistant text with ```output blocks as alternating assistant / tool messages.

    Raises ``TraceError`` naming the block when an output block follows no ```python block or is
    empty (ToRA prints the run's report when there is no output, so empty means a broken record).
    """
    messages: list[dict[str, str]] = []
    cursor = 0
    for n, (start, content, end) in enumerate(_output_blocks(text), start=1):
        before = text[cursor:start].strip()
        if not _PYTHON_BLOCK.search(before):
            raise TraceError(f"output block {n} follows no ```python block; is this a ToRA-style completion?")
        if not content.strip():
            raise TraceError(f"output block {n} is empty; ToRA writes the run's report there when a program prints nothing")
        messages += [{"role": "assistant", "content": before}, {"role": "tool", "content": content}]
        cursor = end
    rest = text[cursor:].strip()
    if messages and rest.startswith(_LIMIT_NOTICE):
        messages[-1]["content"] += "\n\n" + _LIMIT_NOTICE
        rest = rest[len(_LIMIT_NOTICE):].strip()
    if rest:
        messages.append({"role": "assistant", "content": rest})
    if not messages:
        raise TraceError("the completion is empty")
    return messages


def _output_blocks(text: str) -> Iterator[tuple[int, str, int]]:
    """(start, content, end) of each closed output block of ``text``, left to right, the newline before its opening
    fence included in it; its content ends at the first fence line after it.

    Each search starts where the last one stopped, so any text costs linear time: once an opening fence has no
    closing fence after it, no later one has either."""
    pos = 0
    while (opening := text.find(_OUTPUT_OPEN, pos)) >= 0:
        body = opening + len(_OUTPUT_OPEN)
        close = _FENCE_END.search(text, body)
        if close is None:
            return
        start = opening - 1 if opening > pos and text[opening - 1] == "\n" else opening
        yield start, text[body:close.start()], close.end()
        pos = close.end()


def tora_record_to_traces(record: Any) -> list[Trace]:
    """The traces of one ToRA record (a corpus row, or every completion of an inference row)."""
    if not isinstance(record, dict):
        raise TraceError(f"ToRA row is a JSON {type(record).__name__}; expected an object")
    if "messages" in record:
        return [_corpus_trace(record)]
    if "question" in record and "code" in record:
        return _inference_traces(record)
    raise TraceError("ToRA row needs 'messages' (the ToRA corpus) or 'question' and 'code' (ToRA's inference outputs)")


def _corpus_trace(record: dict[str, Any]) -> Trace:
    raw = record["messages"]
    if not isinstance(raw, list) or not raw:
        raise TraceError("'messages' should be a non-empty list of {role, content} objects")
    messages = []
    for i, msg in enumerate(raw):
        if not isinstance(msg, dict) or not isinstance(msg.get("content"), str):
            raise TraceError(f"message {i} should be an object with a string 'content'")
        if msg.get("role") == "assistant":
            messages += _split(msg["content"], f"message {i}")
        else:
            messages.append({"role": msg.get("role"), "content": msg["content"]})
    meta = {k: v for k, v in record.items() if k not in ("messages", "id", "gt")}
    meta.update(source="tora", kind="domain", task_id=record.get("id"), reference=record.get("gt"))
    return _valid(Trace(messages=messages, meta=meta))


def _inference_traces(record: dict[str, Any]) -> list[Trace]:
    question, completions = record["question"], record["code"]
    if not isinstance(question, str) or not isinstance(completions, list):
        raise TraceError("'question' should be a string and 'code' a list of completions")
    per_sample = {key: record.get(key) for key in ("pred", "report", "score")}
    for key, values in per_sample.items():
        if values is not None and (not isinstance(values, list) or len(values) != len(completions)):
            raise TraceError(f"'{key}' should be a list with one entry per completion ({len(completions)})")
    shared = {k: v for k, v in record.items() if k not in ("question", "code", "idx", "gt", *per_sample)}
    traces = []
    for j, completion in enumerate(completions):
        if not isinstance(completion, str):
            raise TraceError(f"code[{j}] is a {type(completion).__name__}; expected the completion's text")
        body = _without_prompt(completion, question)
        meta = {**shared, "source": "tora", "kind": "domain", "task_id": record.get("idx"), "sample": j,
                "reference": record.get("gt")}
        meta.update({key: values[j] for key, values in per_sample.items() if values is not None and key != "score"})
        if per_sample["score"] is not None:
            meta["success"] = per_sample["score"][j]
        messages = [{"role": "user", "content": question}, *_split(body, f"code[{j}]")]
        traces.append(_valid(Trace(messages=messages, meta=meta)))
    return traces


def _without_prompt(completion: str, question: str) -> str:
    """The completion without the ``{question}\\n\\nSolution:`` that ToRA's prompt split can leave."""
    head = f"{question.strip()}\n\nSolution:"
    text = completion.lstrip()
    return text[len(head):] if text.startswith(head) else completion


def _split(text: str, where: str) -> list[dict[str, str]]:
    try:
        return split_tool_text(text)
    except TraceError as err:
        raise TraceError(f"{where}: {err}") from None


def _valid(trace: Trace) -> Trace:
    trace.validate()
    return trace
