"""``molrl traces`` subcommands through ``molrl.cli.main``."""

from __future__ import annotations

import json

import pytest

from molrl.cli import main
from molrl.tiny import build_tiny_tokenizer
from molrl.traces import read_traces

MINT_FILE = "gpt-4-0613_F_None__humaneval.jsonl"


def record(success: bool, n_feedback: int, kind: str = "domain") -> dict:
    messages = [{"role": "user", "content": "task"}, {"role": "assistant", "content": "try"}]
    for k in range(n_feedback):
        messages += [{"role": "tool", "content": f"Observation:\n{k}"}, {"role": "assistant", "content": "again"}]
    return {"messages": messages, "meta": {"success": success, "kind": kind}}


def write_jsonl(path, records) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))


@pytest.fixture(autouse=True)
def keep_pytest_log_capture(monkeypatch):
    """The CLI installs its own log handlers; keep pytest's so caplog sees error lines."""
    monkeypatch.setattr("molrl.cli.setup_logging", lambda verbose=False: None)


@pytest.fixture(scope="module")
def llama3_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "llama3"
    build_tiny_tokenizer("llama3").save_pretrained(path)
    return path


def test_convert_mint_file(shared_data, tmp_path):
    out = tmp_path / "mint.jsonl"
    assert main(["traces", "convert", "--from", "mint", str(shared_data / "traces/mint" / MINT_FILE), str(out)]) == 0
    reader = read_traces(out)
    assert len(list(reader)) == 45 and reader.rejects == []
    assert not (tmp_path / "mint.jsonl.rejects.jsonl").exists()


def test_convert_directory_writes_one_file_per_input(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    write_jsonl(src / "a.jsonl", [record(True, 1)])
    write_jsonl(src / "b.jsonl", [record(False, 2), record(True, 0)])
    assert main(["traces", "convert", "--from", "openai", str(src), str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.jsonl", "b.jsonl"]
    assert len(list(read_traces(tmp_path / "out" / "b.jsonl"))) == 2


def test_convert_writes_rejects_with_file_and_line(tmp_path):
    src, out, rej = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "bad.jsonl"
    bad_role = record(True, 1)
    bad_role["messages"][2]["role"] = "observation"
    write_jsonl(src, [record(True, 1), "{not json", bad_role, record(False, 1)])
    assert main(["traces", "convert", "--from", "openai", str(src), str(out), "--rejects", str(rej)]) == 0
    assert len(list(read_traces(out))) == 2
    rejects = [json.loads(line) for line in rej.read_text().splitlines()]
    assert [(r["file"], r["line"]) for r in rejects] == [(str(src), 2), (str(src), 3)]
    assert rejects[1]["error"].startswith("message 2 has role 'observation'; expected one of system/user/assistant/tool")


def test_convert_strict_fails_on_first_bad_record(tmp_path, caplog):
    src = tmp_path / "in.jsonl"
    write_jsonl(src, [record(True, 1), "{not json"])
    assert main(["traces", "convert", "--from", "openai", str(src), str(tmp_path / "out.jsonl"), "--strict"]) == 1
    assert f"{src}:2: malformed JSON" in caplog.text


def test_stats_json_counts_under_llama3(tmp_path, llama3_dir):
    src = tmp_path / "t.jsonl"
    write_jsonl(src, [record(True, 1), record(False, 0), "{oops"])
    out = tmp_path / "stats.json"
    assert main(["traces", "stats", str(src), "--tokenizer", str(llama3_dir), "--json", str(out)]) == 0
    first, tot = json.loads(out.read_text())
    # Byte-level tokenizer: decision = "try"+eot (4) + "again"+eot (6) in trace 1, "try"+eot (4) in trace 2;
    # feedback = "Observation:\n0" (14 bytes).
    assert (first["traces"], first["rejects"], first["turns"], first["feedback_turns"]) == (2, 1, 3, 1)
    assert (first["decision_tokens"], first["feedback_tokens"], first["no_feedback"]) == (14, 14, 1)
    assert first["reject_reasons"] == [f"{src}:3: malformed JSON (Expecting property name enclosed in double quotes "
                                       "at column 2); fix or delete the line"]
    assert tot["path"] == "total" and tot["traces"] == 2


def test_show_writes_html_coloured_by_role(tmp_path, llama3_dir, capsys):
    src = tmp_path / "t.jsonl"
    write_jsonl(src, [record(True, 0), record(True, 1)])
    page = tmp_path / "trace.html"
    args = ["traces", "show", str(src), "--model", str(llama3_dir), "--index", "1", "--html", str(page)]
    assert main(args) == 0
    html = page.read_text()
    assert '<span class="feedback" title="feedback · message 2 · 14 tokens">Observation:\n0</span>' in html
    assert '<span class="decision" title="decision · message 3 · 6 tokens">again&lt;|eot_id|&gt;</span>' in html
    # Hand count: 9 header + 4 "task" + 1 eot + 13 header + 4 "try"+eot + 11 header + 14 feedback + 1 eot
    # + 13 header + 6 "again"+eot = 76 tokens.
    out = " ".join(capsys.readouterr().out.split())
    assert "76 tokens = 4 prompt + 10 decision + 14 feedback + 48 template" in out


def test_show_prints_file_and_line_on_one_line_however_long_the_path(tmp_path, llama3_dir, capsys):
    src = tmp_path / ("a-folder-whose-name-is-long-" * 4) / "t.jsonl"  # longer than a console line
    src.parent.mkdir()
    write_jsonl(src, [record(True, 0)])
    assert main(["traces", "show", str(src), "--tokenizer", str(llama3_dir), "--index", "0"]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(f"{src}:1: ")]
    assert len(line) > 120 and line.endswith(" template")  # whole: the path and the counts after it


def test_show_index_out_of_range_is_an_error(tmp_path, llama3_dir, caplog):
    src = tmp_path / "t.jsonl"
    write_jsonl(src, [record(True, 1)])
    assert main(["traces", "show", str(src), "--tokenizer", str(llama3_dir), "--index", "5"]) == 1
    assert "no valid trace at index 5" in caplog.text


def test_filter_success_feedback_and_kind(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_jsonl(src, [record(True, 2), record(True, 0), record(False, 3), record(True, 1, "general"), record(True, 1)])
    args = ["traces", "filter", str(src), str(out), "--success-only", "--min-feedback-turns", "1", "--kind", "domain"]
    assert main(args) == 0
    kept = [t for _, t in read_traces(out)]
    # Kept: lines 1 and 5. Line 2 has no feedback, line 3 failed, line 4 is general data.
    assert [(t.success, t.count("tool"), t.kind) for t in kept] == [(True, 2, "domain"), (True, 1, "domain")]
