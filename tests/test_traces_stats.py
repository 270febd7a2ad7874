"""``molrl traces stats`` on files that read without error but are not what the user meant to pass."""

from __future__ import annotations

import json

import pytest

from molrl.cli import main
from molrl.tiny import build_tiny_tokenizer

pytestmark = pytest.mark.usefixtures("cli_logs")


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "chatml"
    build_tiny_tokenizer("chatml").save_pretrained(path)
    return path


def _stats(path, tok_dir, *flags) -> dict:
    out = path.with_suffix(".stats.json")
    assert main(["traces", "stats", str(path), "--tokenizer", str(tok_dir), "--json", str(out), *flags]) == 0
    return json.loads(out.read_text())[0]


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def test_empty_file_is_a_warning_naming_it(tmp_path, tok_dir, caplog):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    assert _stats(path, tok_dir)["traces"] == 0
    assert _warnings(caplog) == [f"{path}: no trace records (the file is empty or blank); check the path, or re-run "
                                 "the step that writes it"]


def test_file_without_feedback_tokens_is_a_warning_with_cause_and_fix(tmp_path, tok_dir, caplog):
    whole = "Compute.\n```python\nprint(1 + 1)\n```\n```output\n2\n```\nSo 2."
    record = {"messages": [{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": whole}]}
    general = {"messages": record["messages"], "meta": {"kind": "general"}}
    path = tmp_path / "tora.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (record, record, general)))
    assert _stats(path, tok_dir)["feedback_tokens"] == 0
    (warning,) = _warnings(caplog)
    assert warning.startswith(f"{path}: none of its 2 domain traces has a feedback token. MoL learns from tool "
                              "messages")
    assert "molrl traces convert --from tora" in warning and "--min-feedback-turns 1" in warning


def test_general_only_file_without_feedback_is_not_warned(tmp_path, tok_dir, caplog):
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    path = tmp_path / "general.jsonl"
    path.write_text(json.dumps({"messages": chat, "meta": {"kind": "general"}}) + "\n")
    assert _stats(path, tok_dir)["traces"] == 1
    assert _warnings(caplog) == []


def test_multi_megabyte_line_is_counted_up_to_max_length(tmp_path, tok_dir, caplog):
    messages = [{"role": "user", "content": "Run it."}, {"role": "assistant", "content": "run()"},
                {"role": "tool", "content": "Traceback (most recent call last):\n" * 150_000},  # 5 MB
                {"role": "assistant", "content": "It failed."}]
    path = tmp_path / "huge.jsonl"
    path.write_text(json.dumps({"messages": messages}) + "\n")
    counts = _stats(path, tok_dir, "--max-length", "300", "--truncation", "truncate")
    assert (counts["traces"], counts["tokens"]) == (1, 300)
    assert f"{path}:1: truncated at 300 tokens inside feedback message 2 (tool)" in caplog.text
