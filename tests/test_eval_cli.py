"""``molrl eval`` on the command line: predictions mode, error lines, and ``eval compare``."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image

from molrl.cli import main
from molrl.eval.report import compare_table


def _aime_preds(shared_data: Path, path: Path, right: int) -> Path:
    """Predictions for AIME24 with the first ``right`` problems answered correctly, the rest wrong."""
    rows = [json.loads(line) for line in (shared_data / "aime24/test.jsonl").read_text().splitlines()]
    lines = [{"id": r["id"], "completion": f"\\boxed{{{r['answer'] if i < right else 1000}}}"} for i, r in enumerate(rows)]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _eval(shared_data: Path, preds: Path, out: Path) -> int:
    return main(["eval", "--benchmarks", "aime24", "--data", f"aime24={shared_data / 'aime24/test.jsonl'}",
                 "--predictions", str(preds), "--out", str(out)])


def test_predictions_cli_writes_outputs(shared_data, tmp_path):
    assert _eval(shared_data, _aime_preds(shared_data, tmp_path / "p.jsonl", right=12), tmp_path / "run") == 0
    results = json.loads((tmp_path / "run/results.json").read_text())
    assert results["mode"] == "predictions"
    assert results["benchmarks"]["aime24"]["pass@1"] == 12 / 30
    assert (tmp_path / "run/config.yaml").is_file() and (tmp_path / "run/results.md").is_file()


def test_bad_prediction_line_is_one_error(shared_data, tmp_path, caplog, monkeypatch):
    monkeypatch.setattr("molrl.cli.setup_logging", lambda verbose: None)  # keep pytest's log capture
    preds = _aime_preds(shared_data, tmp_path / "p.jsonl", right=30)
    preds.write_text(preds.read_text() + "{not json\n")
    assert _eval(shared_data, preds, tmp_path / "run") == 1
    assert "p.jsonl:31: malformed JSON" in caplog.text


def test_compare_writes_table_and_png(shared_data, tmp_path, capsys):
    for name, right in (("base", 6), ("tuned", 15)):
        assert _eval(shared_data, _aime_preds(shared_data, tmp_path / f"{name}.jsonl", right), tmp_path / name) == 0
    capsys.readouterr()
    assert main(["eval", "compare", str(tmp_path / "base"), str(tmp_path / "tuned"), "--out", str(tmp_path / "cmp")]) == 0
    printed = capsys.readouterr().out
    assert "| aime24 | 0.200 | 0.500 |" in printed  # fractions, like every other table
    assert (tmp_path / "cmp/compare.md").read_text() in printed
    image = matplotlib.image.imread(tmp_path / "cmp/compare.png")
    assert image.shape[0] > 300 and image.shape[1] > 500


def test_compare_table_marks_missing_benchmarks():
    runs = [("a", {"benchmarks": {"x": {"pass@1": 0.5}}}), ("b", {"benchmarks": {"y": {"pass@1": 0.25}}})]
    assert compare_table(runs) == "| benchmark | a | b |\n|---|---:|---:|\n| x | 0.500 | - |\n| y | - | 0.250 |\n"


def test_malformed_data_flag_is_one_error(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr("molrl.cli.setup_logging", lambda verbose: None)
    assert main(["eval", "--benchmarks", "aime24", "--data", "aime24.jsonl", "--out", str(tmp_path / "run")]) == 1
    assert "--data 'aime24.jsonl': expected NAME=PATH" in caplog.text


def _eval_flags(*argv: str):
    import argparse

    from molrl.commands.eval import flag_overrides, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return flag_overrides(parser.parse_args(["eval", *argv]))


def test_turns_flag_runs_the_collection_loop_with_that_many_turns():
    from molrl.config import load_config
    from molrl.eval import EvalConfig

    cfg = load_config(EvalConfig, None, _eval_flags("--model", "tiny:chatml", "--turns", "3"))
    assert (cfg.mode, cfg.episode.max_turns) == ("interactive", 3)
    assert load_config(EvalConfig, None, _eval_flags("--turns", "1")).mode == "single"


def test_turns_flag_refuses_several_turns_in_single_mode():
    import pytest

    from molrl.errors import MolrlError

    with pytest.raises(MolrlError, match="--turns 2 with --mode single"):
        _eval_flags("--turns", "2", "--mode", "single")
    with pytest.raises(MolrlError, match="--turns 0"):
        _eval_flags("--turns", "0")
