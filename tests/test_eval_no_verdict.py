"""A sample whose grading failed is no verdict: evaluation leaves it out of every metric, counts it, says so when
nothing could be judged, and stops a run whose sandbox fails past sandbox.max_error_rate."""

from __future__ import annotations

import doctest
import gzip
import json
from pathlib import Path

import pytest

from failing_sandbox import fail_every
from molrl.errors import MolrlError
from molrl.eval import EvalConfig, run_eval
from molrl.eval.samples import SampleRecord
from molrl.eval.single import summarise
from molrl.sandbox import SandboxConfig
from molrl.tasks import Task


def _sample(task: str, i: int, stage: str, correct: bool = False) -> SampleRecord:
    return SampleRecord(id=task, sample=i, completion="", extracted=None, correct=correct, score=float(correct),
                        stage=stage)


def test_a_failed_sample_is_left_out_of_the_accuracy_and_counted():
    # problem a: correct, sandbox error, wrong -> pass@1 over its two judged samples = 1/2, and pass@2 = 1 (the two
    # hold a correct one); problem b: no judged sample, so it is left out: pass@1 = 0.5 (failures counted as wrong
    # would say (1/3 + 0) / 2 = 1/6)
    tasks = [Task(id="a", prompt="p", kind="code"), Task(id="b", prompt="p", kind="code")]
    records = [[_sample("a", 0, "all_pass", True), _sample("a", 1, "sandbox_error"), _sample("a", 2, "partial")],
               [_sample("b", 0, "sandbox_error"), _sample("b", 1, "grader_error")]]
    m = summarise(tasks, records, [1, 2])
    assert m["pass@1"] == 0.5 and m["pass@2"] == 1.0 and m["score"] == 0.5
    assert (m["problems"], m["samples"]) == (1, 2)
    assert (m["sandbox_errors"], m["grader_errors"], m["problems_without_verdict"]) == (2, 1, 1)
    assert m["stages"] == {"sandbox_error": 2, "all_pass": 1, "partial": 1, "grader_error": 1}


def test_a_benchmark_with_no_judged_sample_has_no_accuracy_never_zero():
    tasks = [Task(id="a", prompt="p", kind="code")]
    m = summarise(tasks, [[_sample("a", 0, "sandbox_error"), _sample("a", 1, "sandbox_error")]], [1])
    assert "pass@1" not in m and (m["problems"], m["samples"], m["sandbox_errors"]) == (0, 0, 2)


def test_the_notes_of_a_results_table_run_as_written():
    import molrl.eval.report

    result = doctest.testmod(molrl.eval.report)
    assert result.attempted >= 7 and result.failed == 0


def _gold_humaneval(shared_data: Path, tmp_path: Path, limit: int) -> tuple[Path, Path]:
    data = shared_data / "humaneval/HumanEval.jsonl.gz"
    with gzip.open(data, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()][:limit]
    preds = tmp_path / "preds.jsonl"
    preds.write_text("".join(json.dumps({"id": r["task_id"], "completion": "```python\n" + r["prompt"]
                                         + r["canonical_solution"] + "\n```\n"}) + "\n" for r in rows))
    return data, preds


def _run(data: Path, preds: Path, out: Path, limit: int) -> Path:
    return run_eval(EvalConfig(benchmarks=["humaneval"], data={"humaneval": str(data)},
                               predictions={"humaneval": str(preds)}, limit=limit, output_dir=out,
                               sandbox=SandboxConfig(workers=2)))


def test_gold_code_scores_100_over_the_samples_the_sandbox_could_judge(shared_data, tmp_path, monkeypatch):
    fail_every(monkeypatch, 2)  # one job per problem: two of the four come back sandbox errors
    data, preds = _gold_humaneval(shared_data, tmp_path, 4)
    out = _run(data, preds, tmp_path / "run", 4)
    m = json.loads((out / "results.json").read_text())["benchmarks"]["humaneval"]
    assert m["pass@1"] == 1.0 and m["sandbox_errors"] == 2 and (m["problems"], m["samples"]) == (2, 2)
    assert m["problems_without_verdict"] == 2
    assert ("- humaneval: 2 samples could not be judged (2 sandbox errors, 0 grader errors) and are left out of "
            "every metric, with the 2 problems that had no judged sample.") in (out / "results.md").read_text()


def test_a_sample_the_sandbox_could_not_judge_is_judged_again_on_the_next_run(shared_data, tmp_path, monkeypatch):
    data, preds = _gold_humaneval(shared_data, tmp_path, 4)
    with monkeypatch.context() as mp:
        fail_every(mp, 2)
        _run(data, preds, tmp_path / "run", 4)
    out = _run(data, preds, tmp_path / "run", 4)  # the sandbox works again: nothing is left unjudged
    m = json.loads((out / "results.json").read_text())["benchmarks"]["humaneval"]
    assert (m["pass@1"], m["sandbox_errors"], m["problems"], m["samples"]) == (1.0, 0, 4, 4)


def test_a_benchmark_the_sandbox_judged_nothing_of_says_so(shared_data, tmp_path, monkeypatch):
    fail_every(monkeypatch, 1)
    data, preds = _gold_humaneval(shared_data, tmp_path, 4)
    out = _run(data, preds, tmp_path / "run", 4)  # 4 samples: under the 32 the stop rule waits for
    m = json.loads((out / "results.json").read_text())["benchmarks"]["humaneval"]
    assert "pass@1" not in m and m["sandbox_errors"] == 4
    table = (out / "results.md").read_text()
    assert "| humaneval | 0 | 0 | - |" in table
    assert "- **Warning**: humaneval: no sample could be judged (4 sandbox errors, 0 grader errors)" in table


def test_an_eval_whose_sandbox_fails_past_the_limit_stops_after_the_chunk(shared_data, tmp_path, monkeypatch):
    fail_every(monkeypatch, 1)
    data, preds = _gold_humaneval(shared_data, tmp_path, 32)
    with pytest.raises(MolrlError, match=r"^eval: 32 of 32 graded rows \(100.0%\) were sandbox errors"):
        _run(data, preds, tmp_path / "run", 32)  # two chunks of 16: the second reaches 32 rows
    stored = (tmp_path / "run" / "humaneval" / "samples.jsonl").read_text().splitlines()
    assert len(stored) == 32 and all(json.loads(line)["stage"] == "sandbox_error" for line in stored)
