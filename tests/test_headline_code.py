"""``benchmarks/headline_code.py --quick``: the code task's headline runs every stage and writes its report."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from conftest import REPO

VERDICT = re.compile(r"\*\*: (holds|refuted|undecided)")


@pytest.mark.slow
def test_quick_code_headline_splits_the_tasks_reports_the_four_models_and_the_reward_and_reuses_runs(tmp_path,
                                                                                                   shared_data):
    out = tmp_path / "out"
    cmd = [sys.executable, str(REPO / "benchmarks" / "headline_code.py"), "--model", "tiny:chatml", "--quick",
           "--seeds", "2", "--out", str(out), "--mbpp", str(shared_data / "mbpp" / "mbpp.jsonl"),
           "--mint", str(shared_data / "traces" / "mint"),
           "--humaneval", str(shared_data / "humaneval" / "HumanEval.jsonl.gz")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, done.stderr[-3000:]
    report = (out / "headline.md").read_text()
    rows = [line.split("|")[1].strip() for line in report.splitlines() if line.startswith("| `")]
    assert rows == ["`base`", "`base+grpo`", "`mol`", "`mol+grpo`", "`base+grpo`", "`mol+grpo`"]  # models, rewards
    assert len(re.findall(VERDICT, report)) == 7 + 2 and "nan" not in report
    assert "easy MBPP (2 seeds)" in report and "n = 10 a seed" in report and "n = 5 a seed" in report
    # the held-out tasks are not trained on, and the seeds differ only in their seeds
    train = {json.loads(x)["task_id"] for x in (out / "data" / "train.jsonl").read_text().splitlines()}
    held = {json.loads(x)["task_id"] for x in (out / "data" / "held_out.jsonl").read_text().splitlines()}
    assert len(train) == 20 and len(held) == 10 and not train & held
    rl = (out / "seed-1" / "pipeline" / "rl" / "mol+grpo" / "config.yaml").read_text()
    assert "code_mode: binary" in rl and re.search(r"\n  seed: 1\n", rl)
    assert json.loads((out / "timings.json").read_text()).keys() == {"0", "1"}
    markers = {p: p.stat().st_mtime_ns for p in out.glob("**/DONE")}
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=3000)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in out.glob("**/DONE")} == markers  # every stage reused
    assert (out / "headline.md").read_text() == report
