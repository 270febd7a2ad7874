"""Pipeline wiring: stage configs from sections, DONE markers, and the report read back from disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO
from molrl.config import ConfigError
from molrl.errors import MolrlError
from molrl.pipeline import model_weights, run_stage
from molrl.pipeline.config import MolRun, PipelineConfig, RlRun, load_pipeline_config, rl_config, stage_config
from molrl.report import score_table, standard_error, write_report


def test_stage_config_merges_section_fixed_values_and_run_overrides():
    from molrl.mol.config import MolConfig

    section = {"train": {"learning_rate": 0.002, "max_steps": 7}, "lora": {"rank": 4}}
    cfg = stage_config(MolConfig, section, {"model": "m", "data": {"traces": ["t.jsonl"]}}, ["loss.mode=ce"], "mol_runs.ce")
    assert (cfg.model.path, cfg.data.traces, cfg.loss.mode) == ("m", ["t.jsonl"], "ce")
    assert (cfg.train.learning_rate, cfg.train.max_steps, cfg.lora.rank) == (0.002, 7, 4)


def test_stage_config_refuses_a_key_the_pipeline_sets():
    from molrl.mol.config import MolConfig

    with pytest.raises(ConfigError, match="model is set by the pipeline"):
        stage_config(MolConfig, {"model": "other"}, {"model": "m"}, [], "mol")


def test_stage_config_names_the_section_of_a_bad_key():
    from molrl.mol.config import MolConfig

    with pytest.raises(ConfigError, match="pipeline section mol_runs.x: .*unknown key 'train.nope'"):
        stage_config(MolConfig, {"train": {"nope": 1}}, {}, [], "mol_runs.x")


def test_rl_run_must_start_from_a_known_mol_run():
    with pytest.raises(ValueError, match="not a MoL run"):
        PipelineConfig(model="m", mol_runs=[MolRun("mol")], rl_runs=[RlRun("g", start="missing")])


def test_run_names_must_be_unique():
    with pytest.raises(ValueError, match="used twice"):
        PipelineConfig(model="m", mol_runs=[MolRun("base")])


def test_finished_stage_is_skipped_and_a_changed_config_is_refused(tmp_path):
    calls = []
    assert run_stage(tmp_path / "s", {"a": 1}, lambda: calls.append(1)) is True
    assert run_stage(tmp_path / "s", {"a": 1}, lambda: calls.append(2)) is False
    assert calls == [1]
    with pytest.raises(MolrlError, match="finished with other settings"):
        run_stage(tmp_path / "s", {"a": 2}, lambda: calls.append(3))


def test_a_finished_stage_stays_finished_when_only_harmless_keys_change(tmp_path):
    """A re-run may change what ``molrl.records.rerun.HARMLESS`` lists (logging, threads) without redoing the stage; any
    other key is refused, named with both values."""
    from molrl.config import load_config
    from molrl.mol.config import MolConfig

    cfg = load_config(MolConfig, REPO / "configs" / "mol_tiny.yaml", [f"output_dir={tmp_path / 'm'}"])
    assert run_stage(tmp_path / "m", cfg, lambda: None, "mol") is True
    louder = load_config(MolConfig, REPO / "configs" / "mol_tiny.yaml",
                         [f"output_dir={tmp_path / 'm'}", "train.report_to=[tensorboard]", "threads=1"])
    assert run_stage(tmp_path / "m", louder, lambda: pytest.fail("a finished stage ran again"), "mol") is False
    other = load_config(MolConfig, REPO / "configs" / "mol_tiny.yaml",
                        [f"output_dir={tmp_path / 'm'}", "train.learning_rate=0.5", "threads=1"])
    with pytest.raises(MolrlError, match=r"train\.learning_rate was .*, now 0\.5; delete") as err:
        run_stage(tmp_path / "m", other, lambda: pytest.fail("a changed stage ran"), "mol")
    assert "threads" not in str(err.value)


def test_interrupted_stage_runs_again(tmp_path):
    def boom():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_stage(tmp_path / "s", {"a": 1}, boom)
    assert not (tmp_path / "s" / "DONE").exists()
    assert run_stage(tmp_path / "s", {"a": 1}, lambda: None) is True


def test_model_weights_of_named_runs(tmp_path):
    cfg = PipelineConfig(model="base_dir", mol_runs=[MolRun("mol")], rl_runs=[RlRun("g", start="mol")])
    for d in ("mol/mol/adapter", "grpo/g/adapter"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "mol/mol/DONE").write_text("{}")
    assert model_weights(cfg, "base", tmp_path) == ("base_dir", None)
    assert model_weights(cfg, "mol", tmp_path) == ("base_dir", str(tmp_path / "mol/mol/adapter"))
    with pytest.raises(MolrlError, match="has not finished"):
        model_weights(cfg, "g", tmp_path)


CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("pipeline_*.yaml")))
def test_shipped_configs_build_every_stage_config(name, tmp_path):
    from molrl.pipeline import check_stages

    cfg = load_pipeline_config(CONFIGS / name, ["model=m", "stages=[collect,mol,rl,eval]"])
    # the demos' configs run the headline pair only (their ablations are `molrl demo --study`); the real
    # configs carry the paper's ablations as named runs
    demo = not name.startswith("pipeline_qwen3")
    assert len(cfg.mol_runs) >= (1 if demo else 3) and len(cfg.rl_runs) >= 2
    check_stages(cfg, tmp_path, in_memory=demo)


def test_every_demo_preset_builds_every_stage_config(tmp_path):
    from molrl.demo.presets import WORLD_CONFIGS, WORLDS
    from molrl.pipeline import check_stages

    for world, presets in WORLDS.items():
        for name, preset in presets.items():
            cfg = load_pipeline_config(CONFIGS / WORLD_CONFIGS[world], ["model=m", *preset.pipeline_overrides])
            check_stages(cfg, tmp_path / world / name, in_memory=True)


def test_the_algorithms_config_extends_the_demo_config():
    from pathlib import Path

    configs = Path(__file__).resolve().parents[1] / "configs"
    demo = load_pipeline_config(configs / "pipeline_tiny.yaml", ["model=m"])
    every = load_pipeline_config(configs / "pipeline_tiny_rl.yaml", ["model=m"])
    assert every.rl == demo.rl and every.mol == demo.mol and every.eval == demo.eval
    algorithms = {o.split("=")[1] for run in every.rl_runs for o in run.overrides if o.startswith("algorithm=")}
    assert algorithms == {"grpo", "opd", "ppo"}
    options = {o for run in every.rl_runs for o in run.overrides}
    assert {"rollout.partial=true", "rollout.behaviour=props"} <= options


def test_extends_merges_sections_and_replaces_lists(tmp_path):
    (tmp_path / "base.yaml").write_text("title: a\nmol: {data: {max_length: 5}, lora: {rank: 2}}\nstages: [mol, eval]\n")
    (tmp_path / "child.yaml").write_text("extends: base.yaml\nmol: {lora: {rank: 4}}\nstages: [eval]\n")
    cfg = load_pipeline_config(tmp_path / "child.yaml", ["model=m"])
    assert cfg.title == "a" and cfg.stages == ["eval"]
    assert cfg.mol == {"data": {"max_length": 5}, "lora": {"rank": 4}}
    (tmp_path / "base.yaml").write_text("extends: child.yaml\n")
    with pytest.raises(MolrlError, match="cycle"):
        load_pipeline_config(tmp_path / "child.yaml")
    (tmp_path / "child.yaml").write_text("extends: missing.yaml\n")
    with pytest.raises(MolrlError, match=r"missing.yaml: config file not found \(extended by .*child.yaml\)"):
        load_pipeline_config(tmp_path / "child.yaml")


def test_rl_prompts_that_differ_from_eval_are_warned_about(tmp_path, caplog):
    from pathlib import Path

    from molrl.pipeline import check_stages

    configs = Path(__file__).resolve().parents[1] / "configs"
    cfg = load_pipeline_config(configs / "pipeline_tiny.yaml", ["model=m"])
    check_stages(cfg, tmp_path, in_memory=True)
    assert "differs from eval" not in caplog.text  # the shipped config poses tasks alike
    cfg = load_pipeline_config(configs / "pipeline_tiny.yaml", ["model=m", "rl.math_prompt=Question {prompt}"])
    check_stages(cfg, tmp_path, in_memory=True)
    assert "rl_runs.mol+grpo: math_prompt differs from eval's" in caplog.text


def test_standard_error_closed_form():
    # p = 0.25 over 12 problems: sqrt(0.25 * 0.75 / 12) = sqrt(0.015625) = 0.125
    assert standard_error(0.25, 12) == pytest.approx(0.125)


def _fake_run(tmp_path):
    from molrl.config import save_config

    cfg = PipelineConfig(model="m", mol_runs=[MolRun("mol", ["loss.mode=mol"])], rl_runs=[RlRun("g", start="mol")])
    save_config(cfg, tmp_path / "config.yaml")
    for name, p in (("base", 0.05), ("mol", 0.25), ("g", 0.75)):
        (tmp_path / "eval" / name).mkdir(parents=True)
        result = {"benchmarks": {"heldout": {"problems": 40, "samples": 80, "pass@1": p}}}
        (tmp_path / "eval" / name / "results.json").write_text(json.dumps(result))
    (tmp_path / "mol" / "mol").mkdir(parents=True)
    rows = [{"step": s, "ce_feedback": 2.0 / s, "kl_decision": 0.01 * s} for s in range(1, 6)]
    (tmp_path / "mol" / "mol" / "metrics.jsonl").write_text("\n".join(map(json.dumps, rows)))
    (tmp_path / "grpo" / "g").mkdir(parents=True)
    rows = [{"step": s, "reward": s / 10} for s in range(1, 21)]
    (tmp_path / "grpo" / "g" / "metrics.jsonl").write_text("\n".join(map(json.dumps, rows)))
    return cfg


def test_score_table_gives_accuracy_error_and_sample_sizes(tmp_path):
    cfg = _fake_run(tmp_path)
    from molrl.config import to_dict
    from molrl.report import eval_results

    table = score_table(eval_results(tmp_path), to_dict(cfg))
    # 0.75 over 40 problems: sqrt(0.75 * 0.25 / 40) = 0.0685
    assert "| g | GRPO stage from mol  | 0.750 ± 0.068 (40 × 2) |" in table
    assert table.splitlines()[2].startswith("| base |")


def test_report_has_table_findings_and_pngs(tmp_path):
    _fake_run(tmp_path)
    report = write_report(tmp_path).read_text()
    assert "0.250 ± 0.068 (40 × 2)" in report
    # the difference in standard errors: 0.70 / sqrt(0.0685^2 + 0.0345^2) = 9.1
    assert "g: 0.750 (+0.700 vs base, +9.1 s.e., +0.500 vs its start mol)" in report
    # rewards 0.1 ... 2.0 over 20 steps: first ten average 0.55, last ten 1.55
    assert "GRPO training reward of g: 0.550 over its first 10 steps, 1.550 over its last 10 (20 steps)" in report
    for png in ("mol_losses.png", "grpo_reward.png", "eval_accuracy.png"):
        assert f"plots/{png}" in report
        assert (tmp_path / "plots" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rl_runs_live_under_rl_and_an_older_run_dir_resumes_under_grpo(tmp_path):
    from molrl.records.layout import rl_runs

    assert rl_runs(tmp_path) == tmp_path / "rl"  # a new run directory
    (tmp_path / "grpo" / "mol+grpo").mkdir(parents=True)  # one made before the rename
    assert rl_runs(tmp_path) == tmp_path / "grpo"
    cfg = PipelineConfig(model="m", mol_runs=[MolRun("mol")], rl_runs=[RlRun("mol+grpo", start="mol")],
                         output_dir=str(tmp_path))
    assert str(rl_config(cfg, cfg.rl_runs[0], tmp_path).output_dir) == str(tmp_path / "grpo" / "mol+grpo")
    (tmp_path / "rl").mkdir()
    assert rl_runs(tmp_path) == tmp_path / "rl"
