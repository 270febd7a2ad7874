"""``molrl demo --quick`` end to end (the chain world): world, base, collection, MoL, GRPO, eval, report."""

from __future__ import annotations

import re

import pytest

from molrl.cli import main


def test_quick_demo_writes_report_with_scores_and_plots(tmp_path):
    assert main(["demo", "--quick", "--out", str(tmp_path)]) == 0
    run = tmp_path / "pipeline"
    report = (run / "report.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| ") and "±" in line and not line.startswith("| model")]
    names = [row.split("|")[1].strip() for row in rows]
    assert names == ["base", "mol", "mol+grpo", "base+grpo"]
    # every cell: accuracy ± standard error (problems x samples per problem), 50 held-out problems
    cells = re.findall(r"(\d\.\d{3}) ± (\d\.\d{3}) \((\d+) × (\d+)\)", "\n".join(rows))
    assert len(cells) == 2 * len(names)
    assert all(int(problems) == 50 and int(per) == 1 for _, _, problems, per in cells)
    for png in ("mol_losses.png", "grpo_reward.png", "eval_accuracy.png"):
        assert f"plots/{png}" in report
        assert (run / "plots" / png).stat().st_size > 10_000
    assert (run / "collect" / "traces.jsonl").stat().st_size > 0
    assert "## Reproducibility" in report and "episodes carry feedback" in report
    assert "## The chain world under its base" in report
    assert all((run / stage / "DONE").is_file() for stage in ("collect", "mol/mol", "rl/mol+grpo", "eval/base"))


@pytest.mark.slow
def test_quick_demo_runs_every_rl_algorithm_of_the_shipped_config(tmp_path):
    from pathlib import Path

    config = Path(__file__).resolve().parents[1] / "configs" / "pipeline_tiny_rl.yaml"
    assert main(["demo", "--quick", "--world", "digit", "--config", str(config), "--out", str(tmp_path)]) == 0
    report = (tmp_path / "pipeline" / "report.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| ") and "±" in line and not line.startswith("| model")]
    assert [row.split("|")[1].strip() for row in rows] == [
        "base", "mol", "mol+grpo", "base+grpo", "mol+opd", "mol+exopd", "mol+ppo", "mol+ppo_fixed5", "mol+grpo_partial",
        "mol+grpo_props"]
    partial = tmp_path / "pipeline" / "rl" / "mol+grpo_partial"
    assert (partial / "rollout_buffer.json").is_file()
    assert "props/kl" in (tmp_path / "pipeline" / "rl" / "mol+grpo_props" / "metrics.jsonl").read_text()
