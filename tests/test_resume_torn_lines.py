"""Every stage that resumes from a file it appends to survives a line torn by a kill mid-write.

MoL and GRPO read ``metrics.jsonl`` back on resume (GRPO also ``completions.jsonl``), eval reads
its ``samples.jsonl``: a torn last line is dropped with a warning and the run goes on; a torn line
in the middle is damage, and the error names the file and the line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from grpo_helpers import save_tiny_model, toy_config
from molrl.config import load_config
from molrl.errors import DataError
from molrl.eval.samples import SampleRecord, SampleStore
from molrl.mol.config import MolConfig
from molrl.records.runfiles import drop_records_after

REPO = Path(__file__).resolve().parents[1]
TORN = '{"step": 3, "loss": 0.5, "ce_fee'


def _steps(path: Path, key: str) -> list[int]:
    return [r["step"] for r in map(json.loads, path.read_text().splitlines()) if key in r]


def _mol_config(out: Path, max_steps: int) -> MolConfig:
    return load_config(MolConfig, REPO / "configs" / "mol_tiny.yaml", [
        f"output_dir={out}", f"train.max_steps={max_steps}", "train.save_steps=2", "train.report_to=[none]",
        f"data.traces=[{REPO / 'configs/data/mol_tiny_traces.jsonl'}]"])


def test_mol_resumes_past_a_torn_last_metrics_line(tmp_path, caplog):
    from molrl.mol.run import run_mol

    out = run_mol(_mol_config(tmp_path, max_steps=2))
    with (out / "metrics.jsonl").open("a") as fh:
        fh.write(TORN)  # killed while logging step 3, after the step-2 checkpoint
    run_mol(_mol_config(tmp_path, max_steps=3))
    assert _steps(out / "metrics.jsonl", "loss") == [1, 2, 3]
    assert re.search(r"metrics.jsonl:\d+: skipping the last line, cut off mid-write", caplog.text)


def test_mol_fresh_start_drops_a_killed_attempts_lines(tmp_path):
    from molrl.mol.run import run_mol

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 9.0}\n' + TORN)  # killed before any checkpoint
    out = run_mol(_mol_config(tmp_path, max_steps=1))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1] and rows[0]["loss"] != 9.0


def test_grpo_resumes_past_torn_last_lines(tmp_path, caplog):
    from molrl.rl.run import run_rl

    base = save_tiny_model(tmp_path / "base")
    out = run_rl(toy_config(tmp_path / "run", base, max_steps=2, save_steps=2))
    for name in ("metrics.jsonl", "completions.jsonl"):
        with (out / name).open("a") as fh:
            fh.write(TORN)
    run_rl(toy_config(tmp_path / "run", base, max_steps=3, save_steps=2))
    assert _steps(out / "metrics.jsonl", "reward") == [1, 2, 3]
    assert sorted(set(_steps(out / "completions.jsonl", "step"))) == [1, 2, 3]
    assert "completions.jsonl" in caplog.text and "cut off mid-write" in caplog.text


def test_grpo_fresh_start_drops_a_killed_attempts_lines(tmp_path):
    from molrl.rl.run import run_rl

    base = save_tiny_model(tmp_path / "base")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name in ("metrics.jsonl", "completions.jsonl"):  # killed before any checkpoint, torn mid-write
        (run_dir / name).write_text('{"step": 1, "reward": 9.0}\n' + TORN)
    out = run_rl(toy_config(run_dir, base, max_steps=1, save_steps=5))
    rewards = [r["reward"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "reward" in r]
    assert len(rewards) == 1 and rewards[0] != 9.0
    assert all("ce_fee" not in line for line in (out / "completions.jsonl").read_text().splitlines())


def test_torn_metrics_line_in_the_middle_names_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 1.0}\n' + TORN + '\n{"step": 2, "loss": 0.9}\n')
    with pytest.raises(DataError, match=rf"^{path}:2: malformed JSON .*; fix or delete the line$"):
        drop_records_after(path, 1)


def _sample(task_id: str) -> SampleRecord:
    return SampleRecord(id=task_id, sample=0, completion="42", extracted="42", correct=True, score=1.0,
                        stage="correct")


def test_eval_resume_after_a_torn_sample_line_appends_on_a_line_of_its_own(tmp_path):
    store = SampleStore(tmp_path / "samples.jsonl")
    store.append([_sample("a")])
    with store.path.open("a") as fh:
        fh.write('{"id": "b", "sample": 0, "compl')  # killed while writing problem b
    assert list(store.load()) == ["a"]  # b is redone
    store.append([_sample("b")])
    assert list(store.load()) == ["a", "b"]
