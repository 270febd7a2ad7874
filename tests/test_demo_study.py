"""``molrl demo --study``: the verdict rule in closed form, the arms each world runs, and the quick chain study end
to end (every table, verdict line and plot; finished runs reused); the digit world's quick study is slow."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from molrl.cli import main
from molrl.demo.seeds import cell
from molrl.study.verdict import closing_weight, outlook, verdict

NUMBER = r"\d\.\d+ ± \d\.\d+"
VERDICT = r"\*\*: (holds|refuted|undecided|no effect found) \("


def test_the_closing_weight_is_the_least_that_ends_the_drop_without_losing_held_out():
    rows = [(0.0, "holds", "undecided"), (0.05, "holds", "undecided"), (0.1, "undecided", "undecided"),
            (0.3, "no effect found", "holds"), (1.0, "no effect found", "undecided")]
    # 0.05 still drops; 0.1's drop is undecided, not gone; 0.3 loses held-out
    assert closing_weight(rows).startswith("weight 1:")
    assert closing_weight(rows[:4]).startswith("no weight tried") and "0.3: held-out lost" in closing_weight(rows[:4])
    assert "0.1: drop undecided" in closing_weight(rows[:4])
    assert closing_weight([(0.0, "undecided", "undecided"), *rows[1:]]).startswith("no weight needed")
    with pytest.raises(ValueError, match="weight 0"):
        closing_weight(rows[1:])


def test_cell_gives_mean_standard_error_and_seeds():
    # values 0.2, 0.4: mean 0.3, sd 0.1414, se 0.1
    assert cell([0.2, 0.4], 2) == "0.30 ± 0.10 [0.20, 0.40]"


def test_the_chain_study_keeps_the_demos_runs_as_they_are_and_its_world_and_base():
    from molrl.demo.presets import CHAIN_PRESETS
    from molrl.demo.run import config_dir
    from molrl.study.run import chain_study_config
    from molrl.pipeline.config import load_pipeline_config

    demo = load_pipeline_config(config_dir() / "pipeline_chain.yaml", ["model=m"])
    study = chain_study_config(demo, "expert.jsonl", 0, "study")  # type: ignore[arg-type]
    assert all(run in study.mol_runs for run in demo.mol_runs) and all(run in study.rl_runs for run in demo.rl_runs)
    assert CHAIN_PRESETS["study"] == CHAIN_PRESETS["default"]
    names = {r.name: r for r in [*study.mol_runs, *study.rl_runs]}
    assert len(study.mol_runs) == 11 and len(study.rl_runs) == 8
    assert names["mol_kl0"].overrides == ["loss.mode=mol", "loss.kl_weight=0"]
    assert names["mol+grpo_dkl0.3"].overrides == ["algorithm=grpo", "loss.kl_weight=0.3"]
    assert "data.traces=[expert.jsonl," in " ".join(names["ce-expert"].overrides)


def test_a_report_over_an_unfinished_seed_names_the_seed_and_the_missing_score(tmp_path):
    from molrl.study.arms import CHAIN
    from molrl.study.report import write_study_report
    from molrl.errors import MolrlError

    run = tmp_path / "seed-0" / "pipeline"
    (run / "eval").mkdir(parents=True)
    with pytest.raises(MolrlError, match=r"seed-0/pipeline: no \w+ score of mol; finish the study there"):
        write_study_report([run], tmp_path, CHAIN)


def test_quick_chain_study_fills_every_table_and_reuses_finished_runs(tmp_path):
    assert main(["demo", "--study", "--quick", "--seeds", "2", "--out", str(tmp_path)]) == 0
    report = (tmp_path / "study.md").read_text()
    for title in ("## 1. MoL vs CE", "## 2. MoL length", "## 3. GRPO vs Dr.GRPO", "## 4. Staged vs binary code reward: "
                  "not measured", "## 5. The KL dose", "## 6. GRPO from MoL with MoL's decision KL", "## Time",
                  "## Headline over 2 seeds"):
        assert title in report, title
    rows = [line for line in report.splitlines() if line.startswith("| ") and re.search(NUMBER, line)]
    # 6 loss rows, 4 MoL lengths, 2 algorithms, 4 KL doses, 4 RL weights, and the headline: base+grpo against
    # mol_1ep+grpo, mol_3ep+grpo and mol+grpo, 2 models x 2 benchmarks each
    assert len(rows) == 6 + 4 + 2 + 4 + 4 + 12
    for row in rows:  # every cell after the row's labels holds a number
        cells = [c.strip() for c in row.strip("|").split("|")]
        numeric = [c for c in cells if re.fullmatch(r"[\d.]+ ± [\d.]+( \[.*\])?|[\d.]+–[\d.]+|[\d., ]+", c)]
        assert len(numeric) >= len(cells) - 3 and "nan" not in row, row
    # claim 1: 3 per trace source; 2: 3; 3: 2; 5: 2 per non-zero dose and the dose's control; 6: 1 + 3 per weight
    assert len(re.findall(VERDICT, report)) == 6 + 3 + 2 + 7 + 10
    assert re.search(r"The pre-registered primary claim is \*\*MoL before GRPO helps \([\d.]+ epochs \(\d+ steps, "
                     r"the demo's\) vs none\)\*\* \((holds|refuted|undecided|no effect found)\)\. The other 27 claims "
                     r"are secondary", report)
    assert re.search(r"The weight that closes the drop .*: \*\*(weight [\d.]+|no weight (needed|tried))", report)
    assert re.search(r"The whole study: \*\*\d+\.\d minutes\*\* of stage time over 2 seeds", report)
    for png in ("decision_kl.png", "completion_length.png", "kl_dose.png", "rl_decision_kl.png", "general_vs_heldout.png"):
        assert f"(plots/{png})" in report and (tmp_path / "plots" / png).stat().st_size > 10_000
    expert = (tmp_path / "seed-0" / "expert" / "traces.jsonl").read_text()
    assert "I will walk the chain." in expert and "The chain's last value is" in expert
    kl_term = (tmp_path / "seed-0" / "pipeline" / "rl" / "mol+grpo_dkl0.3" / "metrics.jsonl").read_text()
    assert '"loss/decision_kl"' in kl_term

    done = {p: p.stat().st_mtime_ns for p in tmp_path.glob("seed-*/pipeline/**/DONE")}
    assert len(done) == 2 * (1 + 11 + 8 + 20)  # collect, MoL, RL, eval of each seed
    assert main(["demo", "--study", "--quick", "--seeds", "2", "--out", str(tmp_path)]) == 0  # all reused
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("seed-*/pipeline/**/DONE")} == done
    assert (tmp_path / "study.md").read_text().split("## Time")[0] == report.split("## Time")[0]


@pytest.mark.slow
def test_quick_digit_study_fills_every_table(tmp_path):
    assert main(["demo", "--study", "--quick", "--world", "digit", "--seeds", "2", "--out", str(tmp_path)]) == 0
    report = (tmp_path / "study.md").read_text()
    for title in ("## 1. MoL vs CE", "## 2. MoL length", "## 3. GRPO vs Dr.GRPO", "## 4. Staged vs binary",
                  "## Time", "## Headline over 2 seeds"):
        assert title in report
    rows = [line for line in report.splitlines() if line.startswith("| ") and re.search(NUMBER, line)]
    # 6 loss rows, 4 MoL-length rows, 2 algorithm rows, 2 reward rows, and the headline: base+grpo against
    # mol_1ep+grpo, mol+grpo and mol_demo+grpo, 2 models x 3 benchmarks each
    assert len(rows) == 6 + 4 + 2 + 2 + 18
    for row in rows:  # every cell after the row's labels holds a number
        cells = [c.strip() for c in row.strip("|").split("|")]
        numeric = [c for c in cells if re.fullmatch(r"[\d.]+ ± [\d.]+( \[.*\])?|[\d.]+–[\d.]+|[\d., ]+", c)]
        assert len(numeric) >= len(cells) - 2 and "nan" not in row, row
    assert len(re.findall(VERDICT, report)) == 6 + 3 + 2 + 3
    for label in ("| 1.0 (", "| 3.0 (", "steps, the demo's) |"):  # MoL lengths read from the runs
        assert label in report
    for png in ("decision_kl.png", "completion_length.png", "general_vs_heldout.png", "code_reward_stages.png"):
        assert (tmp_path / "plots" / png).stat().st_size > 10_000
    expert = (tmp_path / "seed-0" / "expert" / "traces.jsonl").read_text()
    assert "I will ask the tool." in expert
    code_rl = (tmp_path / "seed-0" / "world" / "code_rl_train.jsonl").read_text()
    assert "Write solve() returning f(" in code_rl and "preamble" not in code_rl


def test_expert_words_its_turns_unlike_the_base_but_prints_the_same():
    from molrl.demo.base import ToolDemonstrator
    from molrl.demo.expert import StyledExpert

    question = "<|im_start|>user\nWhat is f(478)?<|im_end|>\n<|im_start|>assistant\n"
    code = StyledExpert.turn(question)
    assert code != ToolDemonstrator.turn(question)
    program = code.split("<execute>")[1].split("</execute>")[0]
    printed: list[str] = []
    exec(program, {"f": lambda n: 3, "print": lambda *a: printed.append(" ".join(map(str, a)))})
    assert printed == ["f(478) = 3"]  # the same feedback line the base's own code produces
    answer = StyledExpert.turn(question + "<tool_response>\nOutput:\nf(478) = 3\n</tool_response>")
    assert answer.endswith("\\boxed{3}.") and answer != ToolDemonstrator.turn("Output:\nf(478) = 3\n")


def test_the_chain_expert_walks_the_same_chain_and_answers_its_last_value_in_a_sentence():
    from molrl.demo.chain import setup_code
    from molrl.demo.chain_base import ChainDemonstrator
    from molrl.demo.expert import ChainExpert

    question = "<|im_start|>user\nWhat is f^3(472)?<|im_end|>\n<|im_start|>assistant\n"
    code = ChainExpert.turn(question)
    assert code.startswith("I will walk the chain.<execute>") and code != ChainDemonstrator.turn(question)
    printed: list[str] = []
    for call in (code, ChainDemonstrator.turn(question)):  # both print the same feedback
        program = call.split("<execute>")[1].split("</execute>")[0]
        scope = {"print": lambda *a: printed.append(" ".join(map(str, a)))}
        exec(setup_code("1032547698") + program, scope)
    assert printed[:3] == printed[3:] == ["3: f(472) = 3", "2: f(3) = 2", "1: f(2) = 3"]
    feedback = question + "<tool_response>\nOutput:\n3: f(472) = 3\n2: f(3) = 2\n1: f(2) = 3\n</tool_response>"
    assert ChainExpert.turn(feedback) == "The chain's last value is 3, so the answer is \\boxed{3}."
    assert ChainDemonstrator.turn(feedback).startswith("Output:\n3: f(472) = 3")  # the base writes every step


def test_only_the_digit_study_presets_build_the_code_family():
    from molrl.demo.presets import PRESETS

    assert {name for name, preset in PRESETS.items() if preset.world.code_problems or preset.world.code_heldout} == \
        {"study", "study_quick"}


def test_the_no_replay_arms_train_on_the_rule_problems_alone_and_take_the_mol_model_as_the_kls_base():
    from molrl.demo.run import RULE_ONLY, config_dir
    from molrl.pipeline.config import load_pipeline_config, mol_config, rl_config
    from molrl.study.arms import CHAIN_NO_REPLAY, NO_REPLAY
    from molrl.study.run import no_replay_config

    demo = load_pipeline_config(config_dir() / "pipeline_chain.yaml",
                                ["model=m", "output_dir=/r/pipeline", "general_traces=[/r/world/general.jsonl]"])
    cfg = no_replay_config(demo, Path("/r/world"), 0, "study")
    assert cfg.general_traces == []
    names = {r.name for r in cfg.mol_runs}
    assert names == {"mol" + NO_REPLAY, "ce" + NO_REPLAY, "ce_feedback" + NO_REPLAY, *CHAIN_NO_REPLAY.kl_doses.values()}
    for run in cfg.mol_runs:  # every MoL run reads the collected traces and nothing else
        traces = mol_config(cfg, run, ["/r/pipeline/collect/traces.jsonl"], Path("/r/pipeline")).data.traces
        assert [str(t) for t in traces] == ["/r/pipeline/collect/traces.jsonl"]
    assert [r.name for r in cfg.rl_runs] == list(CHAIN_NO_REPLAY.rl_kl.values())
    for run, weight in zip(cfg.rl_runs, CHAIN_NO_REPLAY.rl_kl):
        rl = rl_config(cfg, run, Path("/r/pipeline"))
        assert str(rl.data.path) == f"/r/world/{RULE_ONLY}" and run.start == "mol" + NO_REPLAY
        assert (rl.model.adapter_mode, rl.model.reference) == ("merge_new", "mol")
        assert rl.loss.kl_weight == weight


def test_no_replay_and_model_refuse_the_combinations_they_do_not_run(cli_logs, caplog):
    for args, said in ((["--no-replay"], "--no-replay is a study arm set of the chain world"),
                       (["--study", "--no-replay", "--world", "digit"], "--no-replay is a study arm set"),
                       (["--model", "m", "--study"], "--model runs the demo's chain world (or --world library)"),
                       (["--model", "m", "--world", "digit"], "--model runs the demo's chain world (or --world library)"),
                       (["--model", "m", "--world", "long"], "--model runs the demo's chain world (or --world library)")):
        caplog.clear()
        assert main(["demo", *args]) == 1
        assert said in caplog.text, args


def test_a_pretrained_model_that_is_not_a_model_directory_is_refused_before_any_work(tmp_path, cli_logs, caplog):
    assert main(["demo", "--model", str(tmp_path), "--quick", "--out", str(tmp_path / "out")]) == 1
    assert re.search(r"--model .*no config.json.*molrl export --gguf", caplog.text)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_quick_no_replay_study_fills_every_table(tmp_path):
    assert main(["demo", "--study", "--no-replay", "--quick", "--seeds", "2", "--out", str(tmp_path)]) == 0
    report = (tmp_path / "study_no_replay.md").read_text()
    for title in ("## 1. MoL vs CE vs CE on feedback only, without replay", "## RL from MoL without replay",
                  "## 5. The KL dose", "## 6. GRPO from MoL with MoL's decision KL", "## Time"):
        assert title in report, title
    assert "model.adapter_mode=merge_new" in report and "nan" not in report
    assert len(re.findall(VERDICT, report)) == 3 + 4 + 2 + 7 + 10
    assert (tmp_path / "plots" / "no_replay_arms.png").stat().st_size > 10_000
    rl_prompts = (tmp_path / "seed-0" / "world" / "rl_rule_train.jsonl").read_text()
    assert '"id": "f/' in rl_prompts and '"id": "s/' not in rl_prompts and '"id": "m/' not in rl_prompts


@pytest.mark.slow
def test_quick_demo_on_a_pretrained_model_warms_it_up_then_reports_the_four_models_and_reuses_runs(tmp_path):
    from molrl.demo.run import prepare_seed

    # a small model that already writes text (a random one ends every turn at once): the chain demo's quick base
    prepare_seed(tmp_path / "made", "study_quick", [], 0)
    out = tmp_path / "out"
    args = ["demo", "--model", str(tmp_path / "made" / "base"), "--quick", "--seeds", "2", "--out", str(out)]
    assert main(args) == 0
    report = (out / "headline.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| `")]
    assert [r.split("|")[1].strip() for r in rows] == ["`base`", "`base+grpo`", "`mol`", "`mol+grpo`",
                                                        "`mol+grpo_refmol`"]  # and the KL-reference control
    assert len(re.findall(VERDICT, report)) == 8 and "nan" not in report
    control = (out / "pipeline" / "rl" / "mol+grpo_refmol" / "config.yaml").read_text()
    assert "reference: mol" in control
    assert (out / "plots" / "headline.png").stat().st_size > 10_000
    warm = (out / "base" / "warm_up" / "traces.jsonl").read_text()
    assert "<execute>walk(f, " in warm and '"kind": "domain"' in warm
    assert (out / "base" / "config.json").is_file() and not (out / "seed-1" / "base").exists()  # one base, shared
    assert f"model: {out / 'base'}" in (out / "seed-1" / "pipeline" / "config.yaml").read_text()
    done = {p: p.stat().st_mtime_ns for p in out.glob("**/DONE")}
    assert main(args) == 0  # every warm-up, stage and measurement reused
    assert {p: p.stat().st_mtime_ns for p in out.glob("**/DONE")} == done
    assert (out / "headline.md").read_text() == report


def test_the_no_replay_report_counts_answers_naming_the_secret_rule_and_answers_of_the_wrong_length(tmp_path):
    import json

    from molrl.study.no_replay import naming_f, wrong_length

    rows = [("s/460/2", "Output:\n2: s(460) = 1\n1: s(1) = 2\n\\boxed{2}"),       # right
            ("s/820/1", "Output:\n1: f(820) = 6\n\\boxed{6}"),                     # names f
            ("m/465/1", "Output:\n1: m(465) = 4\n1: m(4) = 5\n\\boxed{5}"),        # two steps for one
            ("f/123/1", "Output:\n1: f(123) = 4\n\\boxed{4}")]                     # a rule problem: not counted
    samples = tmp_path / "eval" / "mol" / "general" / "samples.jsonl"
    samples.parent.mkdir(parents=True)
    samples.write_text("".join(json.dumps({"id": i, "sample": 0, "completion": c}) + "\n" for i, c in rows))
    assert naming_f(tmp_path, "mol") == pytest.approx(1 / 3) and wrong_length(tmp_path, "mol") == pytest.approx(1 / 3)


def test_a_mean_left_at_float_noise_decides_nothing():
    # the no-replay study's "weight 0.05 keeps more general accuracy" (general 0.15, 0.17, 0.12 against 0.23, 0.17,
    # 0.04): the differences sum to float noise, which once gave "about 299076299051606099246410924818433 seeds"
    diffs = [0.15 - 0.23, 0.17 - 0.17, 0.12 - 0.04]
    assert sum(diffs) != 0
    assert verdict(diffs, 0.0) == "undecided"
    assert outlook(diffs, 0.0, 0.05) == ("the mean difference is 0 and the claim has no smallest effect: no number "
                                         "of seeds would decide it")
