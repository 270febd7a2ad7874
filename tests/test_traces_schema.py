"""Trace records: validation messages name file and line; appends are whole lines; nothing is dropped silently."""

from __future__ import annotations

import json

import pytest

from molrl.errors import DataError
from molrl.tiny import build_tiny_tokenizer
from molrl.traces import Trace, TraceError, append_trace, read_traces
from molrl.traces.tokenize import TokenizeConfig, tokenize_file

GOOD = {
    "messages": [
        {"role": "user", "content": "Add 2 and 3."},
        {"role": "assistant", "content": "<execute>print(2+3)</execute>"},
        {"role": "tool", "content": "Observation:\n5"},
        {"role": "assistant", "content": "<solution>5</solution>"},
    ],
    "meta": {"source": "test", "task_id": 1, "success": True},
}


def with_message(i: int, **changes) -> dict:
    record = json.loads(json.dumps(GOOD))
    record["messages"][i].update(changes)
    return record


def write_lines(path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines))


def read_all(path, strict=False):
    reader = read_traces(path, strict=strict)
    return list(reader), [str(r) for r in reader.rejects]


def test_good_record_reads_with_line_number(tmp_path):
    path = tmp_path / "traces.jsonl"
    write_lines(path, [json.dumps(GOOD), "", json.dumps(GOOD)])
    traces, rejects = read_all(path)
    assert [line for line, _ in traces] == [1, 3] and rejects == []
    assert traces[0][1].messages == GOOD["messages"] and traces[0][1].success is True
    assert traces[0][1].kind == "domain"


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (with_message(3, role="observation"),
         "message 3 has role 'observation'; expected one of system/user/assistant/tool"),
        ({"messages": [], "meta": {}}, "empty conversation: 'messages' has no messages"),
        (with_message(2, content=["a", "b"]), "message 2 (tool) has content of type list; expected a string"),
        (with_message(1, content="  \n"), "message 1 (assistant) has empty content"),
        (with_message(2, name="python"), "message 2 (tool) has key 'name'"),
        ({"messages": GOOD["messages"], "meta": {"kind": "replay"}}, "meta.kind is 'replay'; expected one of domain/general"),
        ({"messages": GOOD["messages"][:1]}, "no assistant message"),
        ({"messages": [GOOD["messages"][0], GOOD["messages"][2], GOOD["messages"][1]]},
         "message 1 is tool feedback before any assistant turn"),
        ({"conversation": []}, "unknown top-level key 'conversation'"),
    ],
)
def test_bad_record_names_file_line_and_reason(tmp_path, record, reason):
    path = tmp_path / "traces.jsonl"
    write_lines(path, [json.dumps(GOOD), json.dumps(record)])
    traces, rejects = read_all(path)
    assert len(traces) == 1
    assert len(rejects) == 1 and rejects[0].startswith(f"{path}:2: {reason}")


def test_malformed_json_is_rejected_with_line(tmp_path):
    path = tmp_path / "traces.jsonl"
    write_lines(path, [json.dumps(GOOD), '{"messages": [', json.dumps(GOOD)])
    traces, rejects = read_all(path)
    assert len(traces) == 2
    assert rejects == [f"{path}:2: malformed JSON (Expecting value at column 15); fix or delete the line"]


def test_strict_raises_on_first_bad_record(tmp_path):
    path = tmp_path / "traces.jsonl"
    write_lines(path, [json.dumps(GOOD), json.dumps(with_message(3, role="observation"))])
    with pytest.raises(DataError, match=r"traces.jsonl:2: message 3 has role 'observation'"):
        read_all(path, strict=True)


def test_append_writes_complete_lines(tmp_path):
    path = tmp_path / "out.jsonl"
    trace = Trace.from_dict(GOOD)
    for _ in range(3):
        append_trace(path, trace)
    raw = path.read_bytes()
    assert raw.count(b"\n") == 3 and raw.endswith(b"\n")
    traces, rejects = read_all(path)
    assert [t.to_dict() for _, t in traces] == [GOOD] * 3 and rejects == []


def test_torn_final_line_is_reported_not_fatal(tmp_path):
    # What a writer killed mid-line would leave: a prefix of a record without its newline.
    path = tmp_path / "out.jsonl"
    append_trace(path, Trace.from_dict(GOOD))
    with open(path, "ab") as f:
        f.write(json.dumps(GOOD).encode()[:40])
    traces, rejects = read_all(path)
    assert len(traces) == 1
    assert len(rejects) == 1 and rejects[0].startswith(f"{path}:2: truncated final line (no newline)")

def test_append_after_torn_line_keeps_new_record_whole(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_bytes(json.dumps(GOOD).encode()[:40])
    append_trace(path, Trace.from_dict(GOOD))
    traces, rejects = read_all(path)
    assert [line for line, _ in traces] == [2]
    assert len(rejects) == 1 and rejects[0].startswith(f"{path}:1: malformed JSON")


def test_append_refuses_an_invalid_trace(tmp_path):
    path = tmp_path / "out.jsonl"
    with pytest.raises(TraceError, match="empty conversation"):
        append_trace(path, Trace(messages=[]))
    assert not path.exists()


def test_tokenize_file_reports_no_feedback_and_too_long_with_lines(tmp_path):
    path = tmp_path / "traces.jsonl"
    no_feedback = {"messages": [GOOD["messages"][0], GOOD["messages"][1]]}
    long_one = with_message(2, content="Observation:\n" + "5" * 300)
    write_lines(path, [json.dumps(GOOD), json.dumps(no_feedback), "{oops", json.dumps(long_one)])
    done, rejects = tokenize_file(path, build_tiny_tokenizer("llama3"), TokenizeConfig(max_length=256))
    assert [line for line, _ in done] == [1]
    reasons = [str(r) for r in rejects]
    assert [r.split(": ")[0] for r in reasons] == [f"{path}:2", f"{path}:3", f"{path}:4"]
    assert "no feedback tokens" in reasons[0]
    assert "malformed JSON" in reasons[1]
    assert "over max_length 256" in reasons[2]


def test_tokenize_file_strict_names_file_and_line(tmp_path):
    path = tmp_path / "traces.jsonl"
    write_lines(path, [json.dumps(GOOD), json.dumps({"messages": [GOOD["messages"][0], GOOD["messages"][1]]})])
    with pytest.raises(DataError, match=r"traces.jsonl:2: no feedback tokens"):
        tokenize_file(path, build_tiny_tokenizer("llama3"), strict=True)
