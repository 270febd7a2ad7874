"""Grading predictions files on the real benchmark files: gold scores 100%, shuffled scores ~0.

Predictions are built from the raw data files (not from the loaders), so a loader that mangled
ids, answers or tests would show up here as a score below 100%.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from molrl.errors import DataError, MolrlError
from molrl.eval import EvalConfig, run_eval
from molrl.sandbox import SandboxConfig

MATH_FILES = {"math500": ("math500/test.jsonl", "unique_id"), "aime24": ("aime24/test.jsonl", "id"),
              "aime25": ("aime25/test.jsonl", "id")}
CODE_SAMPLE = 12  # problems per code benchmark given shuffled solutions


def _rows(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def _write(path: Path, preds: list[tuple[object, str]]) -> Path:
    path.write_text("".join(json.dumps({"id": i, "completion": c}) + "\n" for i, c in preds))
    return path


def _grade(tmp_path: Path, name: str, data: Path, preds: Path, **kw) -> dict:
    cfg = EvalConfig(benchmarks=[name], data={name: str(data)}, predictions={name: str(preds)},
                     output_dir=tmp_path / "run", sandbox=SandboxConfig(workers=2), **kw)
    out = run_eval(cfg)
    return json.loads((out / "results.json").read_text())["benchmarks"][name]


def _math_preds(shared_data: Path, name: str, shuffle: bool) -> tuple[Path, list[tuple[object, str]]]:
    rel, key = MATH_FILES[name]
    rows = _rows(shared_data / rel)
    answers = [r["answer"] for r in rows]
    if shuffle:  # each problem gets the next problem's answer
        answers = answers[1:] + answers[:1]
    return shared_data / rel, [(r[key], f"So the answer is $\\boxed{{{a}}}$.") for r, a in zip(rows, answers)]


@pytest.mark.parametrize("name", ["math500", "aime24", "aime25"])
def test_gold_math_answers_score_100(shared_data, tmp_path, name):
    data, preds = _math_preds(shared_data, name, shuffle=False)
    m = _grade(tmp_path, name, data, _write(tmp_path / "p.jsonl", preds))
    assert m["problems"] == len(preds)
    assert m["pass@1"] == 1.0 and m["maj@1"] == 1.0


@pytest.mark.parametrize("name", ["math500", "aime24", "aime25"])
def test_shuffled_math_answers_score_near_zero(shared_data, tmp_path, name):
    data, preds = _math_preds(shared_data, name, shuffle=True)
    m = _grade(tmp_path, name, data, _write(tmp_path / "p.jsonl", preds))
    # MATH-500 repeats a few short answers (e.g. "2"), so a neighbour's answer is right by chance
    assert m["pass@1"] < 0.05


def _code_preds(shared_data: Path, name: str, limit: int | None, shuffle: bool = False):
    if name == "humaneval":
        rows = _rows(shared_data / "humaneval/HumanEval.jsonl.gz")
        data = shared_data / "humaneval/HumanEval.jsonl.gz"
        code = [r["prompt"] + r["canonical_solution"] for r in rows]
        ids = [r["task_id"] for r in rows]
    else:
        data = shared_data / "mbpp/mbpp.jsonl"
        rows = [r for r in _rows(data) if 11 <= r["task_id"] <= 510]  # the standard test split
        code = [r["code"] for r in rows]
        ids = [r["task_id"] for r in rows]
    if limit is not None:
        picked = sorted(random.Random(0).sample(range(len(rows)), limit))
        code, ids = [code[i] for i in picked], [ids[i] for i in picked]
    if shuffle:
        code = code[1:] + code[:1]
    return data, [(i, f"Here it is:\n```python\n{c}\n```\n") for i, c in zip(ids, code)]


@pytest.mark.parametrize("name,problems", [("humaneval", 164), ("mbpp", 500)])
def test_canonical_code_scores_100(shared_data, tmp_path, name, problems):
    # every problem of the benchmark (MBPP: the test split 11-510 out of Google's full file)
    data, preds = _code_preds(shared_data, name, None)
    m = _grade(tmp_path, name, data, _write(tmp_path / "p.jsonl", preds))
    assert m["problems"] == problems
    assert m["pass@1"] == 1.0, m["stages"]


@pytest.mark.parametrize("name", ["humaneval", "mbpp"])
def test_shuffled_code_scores_zero(shared_data, tmp_path, name):
    data, preds = _code_preds(shared_data, name, CODE_SAMPLE, shuffle=True)
    m = _grade(tmp_path, name, data, _write(tmp_path / "p.jsonl", preds), partial_predictions=True)
    assert m["pass@1"] == 0.0


def test_samples_record_why(shared_data, tmp_path):
    data, preds = _math_preds(shared_data, "aime24", shuffle=False)
    preds = preds[:2] + [(preds[2][0], "I could not solve it.")] + preds[3:]
    _grade(tmp_path, "aime24", data, _write(tmp_path / "p.jsonl", preds))
    records = [json.loads(line) for line in (tmp_path / "run/aime24/samples.jsonl").read_text().splitlines()]
    assert len(records) == 30
    assert records[0]["correct"] and records[0]["extracted"] is not None and records[0]["details"]
    assert not records[2]["correct"] and records[2]["extracted"] is None and records[2]["stage"] != records[0]["stage"]


def test_a_lone_surrogate_returned_by_a_solution_is_written_not_fatal(shared_data, tmp_path):
    # chr(0xD800) cannot be encoded as UTF-8; before, the samples writer raised UnicodeEncodeError mid-run
    data = shared_data / "humaneval/HumanEval.jsonl.gz"
    code = "```python\ndef has_close_elements(numbers, threshold):\n    return chr(0xD800)\n```"
    m = _grade(tmp_path, "humaneval", data, _write(tmp_path / "p.jsonl", [("HumanEval/0", code)]), partial_predictions=True)
    assert m["problems"] == 1 and m["pass@1"] == 0.0
    (record,) = [json.loads(line) for line in (tmp_path / "run/humaneval/samples.jsonl").read_text().splitlines()]
    # written as the visible text \ud800, which every reader takes (a raw lone surrogate is a rejected line)
    assert {t["got"]["v"] for t in record["details"]["tests"] if t["got"]} == {"\\ud800"}


def test_several_lines_per_id_are_samples(shared_data, tmp_path):
    data, preds = _math_preds(shared_data, "aime24", shuffle=False)
    # problem 0: 3 samples, the first wrong; the rest: 3 copies of the gold answer
    lines = [(i, c) for i, c in preds for _ in range(3)]
    lines[0] = (preds[0][0], "\\boxed{1}")
    m = _grade(tmp_path, "aime24", data, _write(tmp_path / "p.jsonl", lines), ks=[1, 2])
    assert m["samples"] == 90
    assert m["pass@1"] == pytest.approx((29 + 2 / 3) / 30)
    # pass@2 of problem 0 = 1 - C(1,2)/C(3,2) = 1 (any pair holds a gold sample)
    assert m["pass@2"] == 1.0
    assert m["maj@3"] == 1.0  # two gold votes beat one wrong one


def test_unknown_id_names_the_line(shared_data, tmp_path):
    data, preds = _math_preds(shared_data, "aime24", shuffle=False)
    path = _write(tmp_path / "p.jsonl", preds[:3] + [("no-such-id", "\\boxed{1}")] + preds[3:])
    with pytest.raises(DataError, match=r"p\.jsonl:4: id 'no-such-id' is not a problem of aime24"):
        _grade(tmp_path, "aime24", data, path)


def test_missing_predictions_are_an_error(shared_data, tmp_path):
    data, preds = _math_preds(shared_data, "aime24", shuffle=False)
    with pytest.raises(MolrlError, match="1 of 30 aime24 problems have no prediction"):
        _grade(tmp_path, "aime24", data, _write(tmp_path / "p.jsonl", preds[1:]))


def test_edited_predictions_are_regraded(shared_data, tmp_path):
    data, preds = _math_preds(shared_data, "aime24", shuffle=False)
    wrong_first = [(preds[0][0], "\\boxed{1}")] + preds[1:]
    assert _grade(tmp_path, "aime24", data, _write(tmp_path / "p.jsonl", wrong_first))["pass@1"] == 29 / 30
    # same run directory, first answer fixed: that problem is graded again, the rest are read back
    assert _grade(tmp_path, "aime24", data, _write(tmp_path / "p.jsonl", preds))["pass@1"] == 1.0
