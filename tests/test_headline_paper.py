"""``benchmarks/headline_paper.py``: the pretrained headline at the paper's settings, and its measures."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import code_pass_rate  # noqa: E402
import headline_paper  # noqa: E402

VERDICT = r"\*\*: (holds|refuted|undecided|no effect found) \("


def write_samples(path, rows):
    """An evaluation's samples.jsonl of greedy answers: (problem id, completion) rows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": i, "sample": 0, "completion": c}) + "\n" for i, c in rows))


def test_step_accuracy_counts_each_chain_step_by_its_rank_and_leaves_out_public_rules(tmp_path):
    from molrl.study.headline import step_accuracy

    key = "1032547698"  # f(2) = 3, f(3) = 2, f(9) = 8, f(0) = 1
    write_samples(tmp_path / "eval" / "mol" / "heldout" / "samples.jsonl", [
        ("f/472/3", "Output:\n3: f(472) = 3\n2: f(3) = 2\n1: f(2) = 3\n\\boxed{3}"),  # every step right
        ("f/479/2", "Output:\n2: f(479) = 7\n1: f(7) = 6\n\\boxed{6}"),  # f(9) is 8: first wrong, second right
        ("f/120/1", "\\boxed{1}"),  # no step written
        ("s/460/2", "Output:\n2: s(460) = 1\n1: s(1) = 2\n\\boxed{2}")])  # a public rule: not counted
    assert step_accuracy(tmp_path, "mol", key) == {1: (1, 3), 2: (2, 2), 3: (1, 1)}


def test_stage_seconds_are_read_from_every_finished_stage_and_skip_unfinished_ones(tmp_path):
    for stage, seconds in (("collect", 30), ("mol/mol", 600.5), ("rl/base+grpo", 900), ("eval/base", 120)):
        (tmp_path / stage).mkdir(parents=True)
        (tmp_path / stage / "DONE").write_text(json.dumps({"seconds": seconds, "config": {}}))
    (tmp_path / "mol" / "mol_short").mkdir()  # running: no marker yet
    assert headline_paper.stage_seconds(tmp_path) == {"collect": 30.0, "eval/base": 120.0, "mol/mol": 600.5,
                                                      "rl/base+grpo": 900.0}


def test_the_primary_verdict_is_read_from_the_reports_one_primary_line():
    text = ("- **MoL absorbs the feedback**: holds (held-out, mol − base: +0.2 ± 0.01, per seed ...).\n"
            "- **Primary: MoL + GRPO reaches more than GRPO alone (the headline)**: undecided (held-out, ...).\n")
    assert headline_paper.primary_verdict(text) == "undecided"
    assert headline_paper.primary_verdict(text.replace(": undecided (", ": holds (")) == "holds"
    with pytest.raises(SystemExit, match="names 0 primary claims"):
        headline_paper.primary_verdict(text.replace("Primary: ", ""))


def test_the_code_pass_rate_counts_held_back_passes_no_code_and_groups_that_differ(tmp_path):
    rows = [("1", True, "correct"), ("1", False, "test_failed"), ("1", False, "no_code"), ("1", False, "no_code"),
            ("2", False, "no_code"), ("2", False, "test_failed"), ("2", False, "test_failed"), ("2", False, "no_code")]
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps({"id": i, "held_back_pass": p, "stage": s}) + "\n" for i, p, s in rows))
    found = code_pass_rate.summary(samples)
    assert found["pass_rate"] == 0.125 and found["no_code"] == 0.5 and found["tasks_ever_passed"] == 0.5
    assert found["informative_groups_measured"] == 0.5  # task 1's four samples differ, task 2's do not
    # task 1 at p = 1/4: 1 - (1/4)^8 - (3/4)^8 = 0.89987; task 2 at p = 0: 0
    assert found["informative_groups_of_8"] == pytest.approx((1 - 0.25 ** 8 - 0.75 ** 8) / 2)


@pytest.mark.slow
def test_quick_paper_headline_runs_every_stage_reports_every_measure_and_reuses_runs(tmp_path):
    from molrl.demo.run import prepare_seed

    # a small model that already writes text (a random one ends every turn at once): the chain demo's quick base
    prepare_seed(tmp_path / "made", "study_quick", [], 0)
    out = tmp_path / "out"
    cmd = [sys.executable, str(REPO / "benchmarks" / "headline_paper.py"), "--model", str(tmp_path / "made" / "base"),
           "--quick", "--out", str(out)]
    # seed 1's primary arms alone first, as a second process would run them: no report, no mol_short
    alone = subprocess.run([*cmd, "--seed", "1", "--primary-only"], capture_output=True, text=True, timeout=3000)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert not (out / "headline.md").exists() and not (out / "seed-1" / "pipeline" / "mol" / "mol_short").exists()
    assert json.loads((out / "seed-1" / "pipeline" / "rule_probe.json").read_text()).keys() == {
        "base", "mol", "mol+grpo", "base+grpo"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, done.stderr[-3000:]
    report = (out / "headline.md").read_text()
    rows = [line.split("|")[1].strip() for line in report.splitlines() if line.startswith("| `")]
    assert rows == ["`base`", "`base+grpo`", "`mol`", "`mol+grpo`",  # the headline's models
                    "`base`", "`base+grpo`", "`mol_short`", "`mol`", "`mol+grpo`"]  # accuracy per chain step
    assert len(re.findall(VERDICT, report)) == 7 + 1 + 3 and "nan" not in report
    assert report.count("**Primary: ") == 1 and "(2 seeds)" in report
    assert "`mol_short`, 32 steps" in report and "Seed 1:" in report and "Machine time: warm-up" in report
    rl = (out / "seed-1" / "pipeline" / "rl" / "mol+grpo" / "config.yaml").read_text()
    assert re.search(r"\n  n: 8\n", rl) and re.search(r"\n  temperature: 0.9\n", rl) and "learning_rate: 0.0001" in rl
    assert "prompts_per_step: 2" in rl
    short = (out / "pipeline" / "mol" / "mol_short" / "config.yaml").read_text()
    assert re.search(r"\n  max_steps: 1\n", short)
    timings = json.loads((out / "timings.json").read_text())
    assert {"collect", "mol/mol", "mol/mol_short", "rl/mol+grpo", "eval/mol_short"} <= timings["0"].keys()
    assert {"rule probe/base,mol,mol+grpo,base+grpo", "rule probe/mol_short"} <= timings["0"].keys()
    markers = {p: p.stat().st_mtime_ns for p in out.glob("**/DONE")}
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=3000)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in out.glob("**/DONE")} == markers  # every stage reused


def test_a_seeds_timings_keep_the_stages_an_earlier_invocation_reported_and_the_longest_seconds(tmp_path):
    from headline_code import record_seconds

    timings = tmp_path / "timings.json"
    record_seconds(timings, "0", {"mol/mol": 600.0, "rule probe/base,mol": 40.0})  # the primary arms
    record_seconds(timings, "0", {"mol/mol": 0.4, "mol/mol_short": 300.0})  # then mol_short, mol reused
    assert json.loads(timings.read_text()) == {"0": {"mol/mol": 600.0, "rule probe/base,mol": 40.0,
                                                     "mol/mol_short": 300.0}}


def test_a_seeds_evaluation_leaves_out_by_content_every_problem_the_warmed_up_base_trained_on(tmp_path):
    from molrl.demo.chain import ChainWorldConfig, build_chain_world
    from molrl.demo.pretrained_base import unseen_by
    from molrl.records.provenance import Provenance, read_provenance, trained_overlap, write_provenance
    from molrl.tasks.index import task_content_key

    world = build_chain_world(ChainWorldConfig(max_steps=3, train_problems=16, heldout_problems=12, general_train=24,
                                               general_eval=8))
    assert unseen_by(world, tmp_path) is world  # a base without a record: nothing to leave out
    seen = [world.rule_heldout[0], world.rule_heldout[5], world.general_eval[2]]
    write_provenance(tmp_path, Provenance(lineage=[{"stage": "mol", "config": "x", "date": "d"}],
                                          keys=sorted(task_content_key(t) for t in seen)))
    kept = unseen_by(world, tmp_path)
    assert [t.id for t in kept.rule_heldout] == [t.id for i, t in enumerate(world.rule_heldout) if i not in (0, 5)]
    assert [t.id for t in kept.general_eval] == [t.id for i, t in enumerate(world.general_eval) if i != 2]
    assert kept.rule_train == world.rule_train and kept.general_train == world.general_train
    record = read_provenance(tmp_path)
    assert not trained_overlap(record, {"heldout": kept.rule_heldout, "general": kept.general_eval})
    assert trained_overlap(record, {"heldout": world.rule_heldout, "general": world.general_eval}) == {
        "heldout": 2, "general": 1}


def fake_evaluation(pipeline, model, rights):
    """An evaluation of ``model`` in ``pipeline``: held-out problems p0.. right per ``rights``, one general problem
    right, its results.json and DONE marker."""
    for bench, marks in (("heldout", rights), ("general", [True])):
        rows = [{"id": f"p{i}", "sample": 0, "completion": "", "correct": right} for i, right in enumerate(marks)]
        path = pipeline / "eval" / model / bench / "samples.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    results = {"benchmarks": {b: {"pass@1": sum(m) / len(m), "problems": len(m), "samples": len(m)}
                              for b, m in (("heldout", rights), ("general", [True]))}}
    (pipeline / "eval" / model / "results.json").write_text(json.dumps(results))
    (pipeline / "eval" / model / "DONE").write_text(json.dumps({"seconds": 1, "config": {}}))


def test_the_control_is_reported_with_its_claim_only_once_every_seed_has_it(tmp_path):
    seeds = [tmp_path / "pipeline", tmp_path / "seed-1" / "pipeline", tmp_path / "seed-2" / "pipeline"]
    for pipeline in seeds:  # 10 held-out problems: mol+grpo 9 right, mol 5, mol_short 3, the control 2
        for model, right in (("mol", 5), ("mol_short", 3), ("mol+grpo", 9)):
            fake_evaluation(pipeline, model, [i < right for i in range(10)])
    for pipeline in seeds[:2]:
        fake_evaluation(pipeline, headline_paper.CONTROL, [i < 2 for i in range(10)])
    without = "\n".join(headline_paper.secondary_lines(tmp_path, 3))
    assert "More MoL helps" in without and headline_paper.CONTROL not in without  # seed 2 lacks the control
    fake_evaluation(seeds[2], headline_paper.CONTROL, [i < 2 for i in range(10)])
    lines = headline_paper.secondary_lines(tmp_path, 3)
    control = next(line for line in lines if line.startswith("The control, the same GRPO from `mol_short`"))
    assert "held-out 0.200 ± 0.000 [0.200, 0.200, 0.200]" in control
    claim = next(line for line in lines if "GRPO from the longer MoL reaches more" in line)
    assert re.search(VERDICT, claim) and "+0.700" in claim  # 0.9 − 0.2 on every seed


@pytest.mark.parametrize("model, label", [
    ("HuggingFaceTB/SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct"),  # a Hub id: its name
    ("tiny:chatml", "tiny:chatml"),
    ("runs/smollm2/model", "smollm2/model"),  # a generic folder: its parent says which model
    ("/abs/qwen3-4b/final/", "qwen3-4b/final"),
    ("out/mol/checkpoint-80", "mol/checkpoint-80"),
    ("model", "model"),  # nothing above it to name
    ("runs/qwen3-8b-mol", "qwen3-8b-mol"),
])
def test_a_report_title_names_the_model_not_a_generic_folder(model, label):
    from molrl.study.headline import model_label

    assert model_label(model) == label
