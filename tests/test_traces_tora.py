"""The ToRA importer on real ToRA records (tests/fixtures/tora, see its SOURCE), and their tokens under Qwen3."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from molrl.cli import main
from molrl.tasks.index import content_key
from molrl.traces import read_traces, tokenize_trace, write_traces
from molrl.traces.importers import import_file
from molrl.traces.schema import TraceError
from molrl.traces.stats import file_stats
from molrl.traces.spans import ROLE_OF
from molrl.traces.tokenize import TokenizeConfig
from molrl.traces.tora import split_tool_text, tora_record_to_traces

FIXTURES = Path(__file__).parent / "fixtures" / "tora"
CORPUS = FIXTURES / "corpus.jsonl"
OUTPUTS = FIXTURES / "test_tora_gsm8k.jsonl"
OUTPUT_BLOCK = re.compile(r"```output\n(.*?)\n```", re.S)
"""The output blocks of a raw completion, read independently of the importer."""


def raw_completions(path: Path) -> list[str]:
    """Each record's ToRA completion text, straight from the file."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [r["messages"][-1]["content"] if "messages" in r else r["code"][0] for r in rows]


def tora_join(messages: list[dict[str, str]]) -> str:
    """ToRA's own concatenation: model text right-stripped, then ``\\n```output\\n{result}\\n```\\n``."""
    text = ""
    for m in messages:
        text += f"\n```output\n{m['content']}\n```\n" if m["role"] == "tool" else m["content"]
    return text


@pytest.mark.parametrize("path, rows", [(CORPUS, 4), (OUTPUTS, 4)])
def test_every_real_record_converts(path, rows):
    result = import_file(path, "tora")
    assert result.rejects == [] and [line for line, _ in result.traces] == list(range(1, rows + 1))


def test_roles_of_the_real_records():
    corpus = [[m["role"] for m in t.messages] for _, t in import_file(CORPUS, "tora").traces]
    outputs = [[m["role"] for m in t.messages] for _, t in import_file(OUTPUTS, "tora").traces]
    one_round = ["user", "assistant", "tool", "assistant"]
    assert corpus == [one_round] * 3 + [["user", "assistant"]]  # the last is a chain of thought
    assert outputs == [one_round, ["user", "assistant"], one_round, one_round]  # line 2: code, no output


@pytest.mark.parametrize("path", [CORPUS, OUTPUTS])
def test_the_split_rebuilds_each_completion(path):
    traces = [t for _, t in import_file(path, "tora").traces]
    for raw, trace in zip(raw_completions(path), traces):
        assert tora_join(trace.messages[1:]).strip() == raw.strip()


@pytest.mark.parametrize("path", [CORPUS, OUTPUTS])
def test_tool_messages_are_the_output_blocks_and_only_them(path):
    traces = [t for _, t in import_file(path, "tora").traces]
    for raw, trace in zip(raw_completions(path), traces):
        assert [m["content"] for m in trace.messages if m["role"] == "tool"] == OUTPUT_BLOCK.findall(raw)
        assert not any("```output" in m["content"] for m in trace.messages if m["role"] == "assistant")


def test_error_outputs_are_feedback():
    tools = [m["content"] for _, t in import_file(OUTPUTS, "tora").traces for m in t.messages if m["role"] == "tool"]
    assert tools == ["18", "IndexError: list index out of range", "NameError: name 'verlie_salary' is not defined"]


def test_meta_of_a_corpus_row_and_an_inference_row():
    raw_corpus = json.loads(CORPUS.read_text().splitlines()[0])
    corpus = import_file(CORPUS, "tora").traces[0][1]
    assert corpus.meta == {"source": "tora", "kind": "domain", "task_id": "math-train-1149-0", "reference": "2",
                           "dataset": "tora-corpus-math", "level": "Level 5", "gt_cot": raw_corpus["gt_cot"],
                           "task_key": content_key(raw_corpus["messages"][0]["content"])}
    raw_output = json.loads(OUTPUTS.read_text().splitlines()[0])
    output = import_file(OUTPUTS, "tora").traces[0][1]
    assert output.messages[0] == {"role": "user", "content": raw_output["question"]}
    assert output.meta == {"source": "tora", "kind": "domain", "task_id": 0, "sample": 0, "reference": "18",
                           "pred": "18", "report": None, "gt_cot": raw_output["gt_cot"],
                           "task_key": content_key(raw_output["question"])}


def test_each_completion_of_an_inference_row_is_a_trace_with_its_score():
    row = json.loads(OUTPUTS.read_text().splitlines()[0])
    row.update(code=[row["code"][0], "The answer is $\\boxed{18}$."], pred=["18", "18"], report=[None, None],
               score=[True, False])
    traces = tora_record_to_traces(row)
    assert [(t.meta["sample"], t.meta["success"], t.count("tool")) for t in traces] == [(0, True, 1), (1, False, 0)]


# --- several rounds, built by ToRA's own rule from a real record's turns ------------------------

def real_turns() -> tuple[str, str, str]:
    """The first round's model text, output, and final text of the first corpus record."""
    messages = import_file(CORPUS, "tora").traces[0][1].messages
    return messages[1]["content"], messages[2]["content"], messages[3]["content"]


def test_several_rounds_alternate_assistant_and_tool():
    code, output, final = real_turns()
    second = "Let me check the floor term separately:\n```python\nprint(floor(Rational(-29, 3)))\n```"
    text = tora_join([{"role": "assistant", "content": code}, {"role": "tool", "content": output},
                      {"role": "assistant", "content": second}, {"role": "tool", "content": "-10"},
                      {"role": "assistant", "content": final}])
    messages = split_tool_text(text)
    assert [(m["role"], m["content"]) for m in messages] == [
        ("assistant", code), ("tool", output), ("assistant", second), ("tool", "-10"), ("assistant", final)]


def test_the_round_limit_notice_is_feedback():
    code, output, _ = real_turns()
    # after the last round ToRA appends the notice and stops: the trace ends with the environment
    text = code + f"\n```output\n{output}\n```\n" + "\nReach max function call limit."
    assert split_tool_text(text) == [{"role": "assistant", "content": code},
                                     {"role": "tool", "content": output + "\n\nReach max function call limit."}]


def test_a_completion_that_kept_the_prompt_loses_it():
    row = json.loads(OUTPUTS.read_text().splitlines()[0])
    row["code"] = [f"{row['question']}\n\nSolution:\n{row['code'][0]}"]
    assert tora_join(tora_record_to_traces(row)[0].messages[1:]).strip() == json.loads(
        OUTPUTS.read_text().splitlines()[0])["code"][0].strip()


@pytest.mark.parametrize("text, error", [
    ("I guess.\n```output\n3\n```\nSo 3.", "output block 1 follows no ```python block"),
    ("```python\nx = 1\n```\n```output\n\n```\nDone.", "output block 1 is empty"),
])
def test_broken_completions_are_rejected_naming_the_block(text, error):
    with pytest.raises(TraceError, match=re.escape(error)):
        split_tool_text(text)


def test_bad_rows_are_rejected_with_their_lines(tmp_path):
    good = OUTPUTS.read_text().splitlines()[0]
    broken = json.loads(good)
    broken["code"] = ["```output\n1\n```"]
    path = tmp_path / "x.jsonl"
    path.write_text("\n".join([good, json.dumps(broken), json.dumps({"prompt": "?"})]) + "\n")
    result = import_file(path, "tora")
    assert [line for line, _ in result.traces] == [1]
    assert [(r.line, r.reason) for r in result.rejects] == [
        (2, "code[0]: output block 1 follows no ```python block; is this a ToRA-style completion?"),
        (3, "ToRA row needs 'messages' (the ToRA corpus) or 'question' and 'code' (ToRA's inference outputs)"),
    ]


def test_convert_command_from_tora(tmp_path, monkeypatch):
    monkeypatch.setattr("molrl.cli.setup_logging", lambda verbose=False: None)
    out = tmp_path / "out"
    assert main(["traces", "convert", "--from", "tora", str(FIXTURES), str(out)]) == 0
    written = {p.name: sum(1 for _ in read_traces(p)) for p in sorted(out.glob("*.jsonl"))}
    assert written == {"corpus.jsonl": 4, "test_tora_gsm8k.jsonl": 4}


# --- tokens under the real Qwen3 template ------------------------------------------------------

@pytest.mark.parametrize("path", [CORPUS, OUTPUTS])
def test_qwen3_labels_output_blocks_as_feedback_and_nothing_else(path, qwen3_tokenizer, tmp_path):
    traces = [t for _, t in import_file(path, "tora").traces]
    cfg = TokenizeConfig(require_feedback=False)
    for raw, trace in zip(raw_completions(path), traces):
        tok = tokenize_trace(trace, qwen3_tokenizer, cfg)
        roles = tok.roles()
        mismatches = sum(1 for role, m in zip(roles, tok.token_message)
                         if m >= 0 and role != ROLE_OF[trace.messages[m]["role"]])
        feedback = [i for i, f in zip(tok.input_ids, tok.feedback_mask) if f]
        decision = qwen3_tokenizer.decode([i for i, d in zip(tok.input_ids, tok.decision_mask) if d])
        blocks = OUTPUT_BLOCK.findall(raw)
        assert mismatches == 0
        # the feedback tokens spell the output blocks, in order, and no decision token does
        assert re.sub(r"\s+", "", qwen3_tokenizer.decode(feedback)) == re.sub(r"\s+", "", "".join(blocks))
        assert all(b not in decision for b in blocks if len(b) > 3)
        assert decision.count("```python") == raw.count("```python")  # the code is the model's
    out = tmp_path / path.name
    write_traces(out, traces)
    stats = file_stats(out, qwen3_tokenizer, cfg)
    assert stats.rejects == 0 and stats.feedback_turns == sum(len(OUTPUT_BLOCK.findall(r)) for r in raw_completions(path))
