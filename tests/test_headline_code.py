"""``benchmarks/headline_code.py --quick``: the code task's headline runs every stage and writes its report."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import headline_code  # noqa: E402

VERDICT = re.compile(r"\*\*: (holds|refuted|undecided|no effect found) \(")


@pytest.mark.slow
def test_quick_code_headline_splits_the_tasks_reports_the_four_models_and_the_reward_and_reuses_runs(tmp_path,
                                                                                                   shared_data):
    out = tmp_path / "out"
    cmd = [sys.executable, str(REPO / "benchmarks" / "headline_code.py"), "--model", "tiny:chatml", "--quick",
           "--seeds", "2", "--out", str(out), "--mbpp", str(shared_data / "mbpp" / "mbpp.jsonl"),
           "--mint", str(shared_data / "traces" / "mint"),
           "--humaneval", str(shared_data / "humaneval" / "HumanEval.jsonl.gz")]
    # seed 1 alone first, as a second process would run it beside the first: no report, its own seconds only
    alone = subprocess.run([*cmd, "--seed", "1"], capture_output=True, text=True, timeout=3000)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert not (out / "headline.md").exists() and json.loads((out / "timings.json").read_text()).keys() == {"1"}
    seed_1 = {p: p.stat().st_mtime_ns for p in (out / "seed-1").glob("**/DONE")}
    # the control's tasks, written ahead: a tiny random model's code passes no shown test in its collection
    room = [json.loads(x) for x in (shared_data / "mbpp" / "mbpp.jsonl").read_text().splitlines()[:3]]
    (out / "data" / "room.jsonl").write_text("".join(json.dumps(r) + "\n" for r in room))
    cmd.append("--control")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, done.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in (out / "seed-1").glob("**/DONE")} == seed_1  # reused, not run again
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
    assert json.loads((out / "timings.json").read_text()).keys() == {"0", "1", "control"}
    control = (out / "control" / "pipeline" / "rl" / "base+grpo" / "config.yaml").read_text()
    assert str(out / "data" / "room.jsonl") in control and "code_mode: binary" in control
    assert not (out / "control" / "pipeline" / "rl" / "mol+grpo").exists()
    assert "**Control: the same GRPO where it has room.** From the base, seed 0, 2 steps on the 3 training" in report
    markers = {p: p.stat().st_mtime_ns for p in out.glob("**/DONE")}
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=3000)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in out.glob("**/DONE")} == markers  # every stage reused
    assert (out / "headline.md").read_text() == report


def test_the_controls_tasks_are_the_training_tasks_whose_shown_test_the_bases_code_passed(tmp_path):
    out = tmp_path / "out"
    (out / "data").mkdir(parents=True)
    train = out / "data" / "train.jsonl"
    train.write_text("".join(json.dumps({"task_id": t, "text": f"task {t}"}) + "\n" for t in (11, 12, 13, 14)))

    def trace(task_id, *grades):
        observations = {str(2 * i + 3): {"observation": {"grade": g}} for i, g in enumerate(grades)}
        return json.dumps({"messages": [], "meta": {"task_id": str(task_id), "observations": observations}}) + "\n"
    collect = out / "pipeline" / "collect"
    collect.mkdir(parents=True)
    (collect / "traces.jsonl").write_text(
        trace(11, {"correct": False}, {"correct": True})  # passed on its second try
        + trace(12, None, {"correct": False})  # ran code, failed
        + trace(13)  # no code at all
        + trace(14, {"correct": True}) + trace(99, {"correct": True}))  # 99 is no training task
    room = headline_code.room_split(out, train)
    assert [json.loads(x)["task_id"] for x in room.read_text().splitlines()] == [11, 14]
    (collect / "traces.jsonl").write_text(trace(12, {"correct": False}))
    assert headline_code.room_split(out, train) == room  # written once, reused as the control's input
    room.unlink()
    with pytest.raises(SystemExit, match="passed no shown test"):
        headline_code.room_split(out, train)


def test_quarter_rise_is_the_quarters_means_and_the_standard_error_of_their_difference():
    from molrl.study.metrics import quarter_rise
    first, last, se = quarter_rise([0.0, 0.5, 0.25, 0.25, 0.25, 0.25, 1.0, 0.5])
    assert (first, last) == (0.25, 0.75)
    assert se == pytest.approx(((0.125 / 2) + (0.125 / 2)) ** 0.5)  # each quarter: variance 0.125 over 2 values
    assert quarter_rise([0.3] * 3) == (0.3, 0.3, 0.0)  # under 4 values: one value a quarter
