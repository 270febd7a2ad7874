"""Awkward input files through the three commands that read user JSON lines.

For each of ``molrl traces stats``, ``molrl mol`` and ``molrl eval --predictions``: a gzip file
named ``.jsonl`` and a file starting with a UTF-8 byte-order mark are read as if plain; a line
that is not UTF-8 is one error line naming the file, the line and the fix, never a traceback.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from molrl.cli import main
from molrl.tiny import build_tiny_tokenizer

REPO = Path(__file__).resolve().parents[1]
INPUTS = ["gzip", "bom", "latin1"]

pytestmark = pytest.mark.usefixtures("cli_logs")


def write_variant(path: Path, lines: list[str], variant: str) -> Path:
    """``lines`` as a gzip file, a file with a BOM, or with line 2 re-encoded as latin-1 (one é)."""
    data = [line.encode("utf-8") + b"\n" for line in lines]
    if variant == "gzip":
        path.write_bytes(gzip.compress(b"".join(data)))
    elif variant == "bom":
        path.write_bytes(b"\xef\xbb\xbf" + b"".join(data))
    else:
        record = json.loads(lines[1])
        data[1] = (json.dumps(record, ensure_ascii=False)[:-1] + ', "note": "caf\u00e9"}\n').encode("latin-1")
        path.write_bytes(b"".join(data))
    return path


def assert_outcome(variant: str, code: int, path: Path, caplog) -> None:
    if variant == "latin1":
        assert code == 1 or "rejected" in caplog.text
        assert f"{path}:2: not UTF-8 text (byte 0xe9 at column" in caplog.text
        assert "save the file as UTF-8" in caplog.text
    else:
        assert code == 0


@pytest.mark.parametrize("variant", INPUTS)
def test_traces_stats(tmp_path, variant, caplog):
    tok_dir = tmp_path / "tok"
    build_tiny_tokenizer("chatml").save_pretrained(tok_dir)
    lines = (REPO / "configs/data/mol_tiny_traces.jsonl").read_text().splitlines()
    path = write_variant(tmp_path / "traces.jsonl", lines, variant)
    out = tmp_path / "stats.json"
    code = main(["traces", "stats", str(path), "--tokenizer", str(tok_dir), "--json", str(out)])
    assert_outcome(variant, code, path, caplog)
    counts = json.loads(out.read_text())[0]
    assert (counts["traces"], counts["rejects"]) == ((7, 1) if variant == "latin1" else (8, 0))


@pytest.mark.parametrize("variant", INPUTS)
def test_mol(tmp_path, variant, caplog):
    lines = (REPO / "configs/data/mol_tiny_traces.jsonl").read_text().splitlines()
    path = write_variant(tmp_path / "traces.jsonl", lines, variant)
    code = main(["mol", "--config", str(REPO / "configs/mol_tiny.yaml"), f"output_dir={tmp_path / 'run'}",
                 f"data.traces=[{path}]", "train.max_steps=1", "train.report_to=[none]"])
    assert_outcome(variant, code, path, caplog)
    if code == 0:
        stats = json.loads((tmp_path / "run/data_stats.json").read_text())
        assert stats["traces"] == 8 and (tmp_path / "run/adapter").is_dir()


@pytest.mark.parametrize("variant", INPUTS)
def test_eval_predictions(shared_data, tmp_path, variant, caplog):
    data = shared_data / "aime24/test.jsonl"
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    lines = [json.dumps({"id": r["id"], "completion": f"\\boxed{{{r['answer']}}}"}) for r in rows]
    path = write_variant(tmp_path / "preds.jsonl", lines, variant)
    code = main(["eval", "--benchmarks", "aime24", "--data", f"aime24={data}", "--predictions", str(path),
                 "--out", str(tmp_path / "run")])
    assert_outcome(variant, code, path, caplog)
    if code == 0:
        results = json.loads((tmp_path / "run/results.json").read_text())
        assert results["benchmarks"]["aime24"]["pass@1"] == 1.0


@pytest.mark.parametrize("variant", INPUTS)
def test_traces_convert(tmp_path, variant, caplog):
    lines = (REPO / "configs/data/mol_tiny_traces.jsonl").read_text().splitlines()
    path = write_variant(tmp_path / "in.jsonl", lines, variant)
    code = main(["traces", "convert", "--from", "openai", str(path), str(tmp_path / "out.jsonl")])
    assert_outcome(variant, code, path, caplog)
    converted = (tmp_path / "out.jsonl").read_text().splitlines()
    assert len(converted) == (7 if variant == "latin1" else 8)
