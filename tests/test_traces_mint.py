"""The MINT importer on the real MINT files, and stats/round-trip under the real Qwen3 template."""

from __future__ import annotations

import json
import re

import pytest

from molrl.traces import Trace, read_traces, tokenize_trace, write_traces
from molrl.tasks.index import problem_parts
from molrl.traces.importers import OpenAIOptions, import_file, mint_file_info, openai_record_to_trace
from molrl.traces.schema import TraceError
from molrl.traces.stats import file_stats

# Rows per file (wc -l): 45 HumanEval, 100 MATH, 91 MBPP tasks for each of the four runs.
ROWS = {"humaneval": 45, "math": 100, "mbpp": 91}
GPT4_HUMANEVAL = "gpt-4-0613_F_None__humaneval.jsonl"


@pytest.fixture(scope="module")
def mint_dir(shared_data):
    return shared_data / "traces" / "mint"


def test_every_mint_file_converts_without_rejects(mint_dir):
    files = sorted(mint_dir.glob("*.jsonl"))
    assert len(files) == 12
    converted = {f.name: import_file(f, "mint") for f in files}
    assert {name: len(r.rejects) for name, r in converted.items()} == {name: 0 for name in converted}
    for name, result in converted.items():
        assert len(result.traces) == ROWS[mint_file_info(name)["dataset"]], name
    assert sum(len(r.traces) for r in converted.values()) == 4 * (45 + 100 + 91)


def test_mint_roles_first_user_is_task_later_users_are_feedback(mint_dir):
    result = import_file(mint_dir / GPT4_HUMANEVAL, "mint")
    traces = [t for _, t in result.traces]
    assert all(t.messages[0]["role"] == "user" and "Task:" in t.messages[0]["content"] for t in traces)
    assert all(t.count("user") == 1 for t in traces)
    # Counted in the raw file: 144 assistant turns and 99 later user turns (all "Observation:").
    assert sum(t.count("assistant") for t in traces) == 144
    assert sum(t.count("tool") for t in traces) == 99
    tools = [m["content"] for t in traces for m in t.messages if m["role"] == "tool"]
    assert all(c.startswith("Observation:") for c in tools)


def test_mint_assistant_label_removed_and_tags_kept(mint_dir):
    traces = [t for _, t in import_file(mint_dir / GPT4_HUMANEVAL, "mint").traces]
    turns = [m["content"] for t in traces for m in t.messages if m["role"] == "assistant"]
    assert not any(c.lstrip().startswith("Assistant:") for c in turns)
    assert sum("<execute>" in c for c in turns) > 0 and sum("<solution>" in c for c in turns) > 0


def test_mint_full_width_assistant_label_is_stripped(mint_dir):
    # In the shipped files 232 assistant turns (111 GPT-4 traces) open "Assistant:\nAssistant：": MINT's
    # label, then a second one with a full-width colon. No spelling of the label may open a turn.
    label = re.compile(r"\s*assistant\s*[:\uff1a\ufe55\ufe13]", re.IGNORECASE)
    turns = [m["content"] for f in sorted(mint_dir.glob("*.jsonl")) for _, t in import_file(f, "mint").traces
             for m in t.messages if m["role"] == "assistant"]
    assert len(turns) > 3000
    assert [c[:40] for c in turns if label.match(c)] == []


def test_mint_expert_feedback_stays_in_tool_messages(mint_dir):
    name = "gpt-3.5-turbo-0613_F_gpt-4-0613_PHF_no_GT-textual__humaneval.jsonl"
    traces = [t for _, t in import_file(mint_dir / name, "mint").traces]
    tools = [m["content"] for t in traces for m in t.messages if m["role"] == "tool"]
    assert len(tools) == 134 and all("Expert feedback:" in c for c in tools)
    # 3 runs stopped on an API error right after feedback: they end with a tool message.
    assert sum(t.messages[-1]["role"] == "tool" for t in traces) == 3


def test_mint_meta(mint_dir):
    line, first = import_file(mint_dir / GPT4_HUMANEVAL, "mint").traces[0]
    raw = json.loads((mint_dir / GPT4_HUMANEVAL).open().readline())
    assert line == 1
    assert first.meta == {
        "source": "mint", "kind": "domain", "task_id": raw["task"]["task_id"], "task_name": raw["task"]["task_name"],
        "reference": raw["task"]["reference"], "success": raw["state"]["success"],
        "terminate_reason": raw["state"]["terminate_reason"],
        "model": "gpt-4-0613", "feedback_model": None, "dataset": "humaneval",
        "task_key": problem_parts(raw["task"]["prompt"]).key,  # the task's content key (molrl.tasks.index)
    }


def test_mint_file_info_with_feedback_model():
    info = mint_file_info("gpt-3.5-turbo-0613_F_gpt-4-0613_PHF_no_GT-textual__mbpp.jsonl")
    assert info == {"model": "gpt-3.5-turbo-0613", "feedback_model": "gpt-4-0613_PHF_no_GT-textual", "dataset": "mbpp"}


def test_mint_bad_rows_are_rejected_with_lines(tmp_path, mint_dir):
    good = (mint_dir / GPT4_HUMANEVAL).open().readline().strip()
    row = json.loads(good)
    row["state"]["history"] = []
    path = tmp_path / "x.jsonl"
    path.write_text("\n".join([good, json.dumps(row), "[1, 2", json.dumps({"task": {}})]) + "\n")
    result = import_file(path, "mint")
    assert [line for line, _ in result.traces] == [1]
    assert [(r.line, r.reason.split(" (")[0]) for r in result.rejects] == [
        (2, "MINT row has no state.history"),
        (3, "malformed JSON"),
        (4, "MINT row needs objects 'task' and 'state'; is this a MINT results.jsonl file?"),
    ]


def test_mint_stats_under_qwen3(mint_dir, qwen3_tokenizer, tmp_path):
    path = tmp_path / GPT4_HUMANEVAL
    write_traces(path, (t for _, t in import_file(mint_dir / GPT4_HUMANEVAL, "mint").traces))
    s = file_stats(path, qwen3_tokenizer)
    assert (s.traces, s.rejects, s.turns, s.feedback_turns, s.successes) == (45, 0, 144, 99, 33)
    assert s.tokens == s.prompt_tokens + s.decision_tokens + s.feedback_tokens + s.template_tokens
    # Golden counts under the Qwen3 template (see the traces report table); 52 decision tokens fewer
    # than when the full-width labels opening 35 of these turns were kept.
    assert (s.tokens, s.decision_tokens, s.feedback_tokens) == (70978, 22926, 4430)


def test_mint_round_trip_feedback_decodes_to_text(mint_dir, qwen3_tokenizer, tmp_path):
    # convert -> write -> read -> tokenize -> decode each tool message's feedback tokens.
    path = tmp_path / "out.jsonl"
    write_traces(path, (t for _, t in import_file(mint_dir / GPT4_HUMANEVAL, "mint").traces))
    reader = read_traces(path)
    checked = 0
    for _line, trace in reader:
        tok = tokenize_trace(trace, qwen3_tokenizer)
        for j, message in enumerate(trace.messages):
            if message["role"] != "tool":
                continue
            ids = [i for i, f, m in zip(tok.input_ids, tok.feedback_mask, tok.token_message) if f and m == j]
            assert qwen3_tokenizer.decode(ids).strip() == message["content"].strip()
            checked += 1
    assert reader.rejects == [] and checked == 99


def test_openai_roles_map_only_when_asked():
    record = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                           {"role": "function", "content": "out", "name": "py"}], "id": 7}
    with pytest.raises(TraceError, match=r"message 2 has role 'function'.*--map-role function=tool"):
        openai_record_to_trace(record)
    with pytest.raises(TraceError, match=r"message 2 \(function\) has key 'name'; drop it explicitly"):
        openai_record_to_trace(record, OpenAIOptions(role_map={"function": "tool"}))
    trace = openai_record_to_trace(record, OpenAIOptions(role_map={"function": "tool"}, drop_keys=("name",)))
    assert isinstance(trace, Trace) and [m["role"] for m in trace.messages] == ["user", "assistant", "tool"]
    assert trace.meta == {"id": 7, "source": "openai", "kind": "domain"}
