"""One convention across stages: MoL and RL name their training keys alike, the pipeline names its sections
for what they run, and every earlier name still loads, with one line saying what it is read as."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml

from molrl.config import describe, load_config, to_dict
from molrl.mol.config import MolConfig
from molrl.pipeline.config import PipelineConfig, load_pipeline_config
from molrl.rl.config import RlConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SHARED = ("learning_rate", "lr_scheduler", "weight_decay", "max_grad_norm", "max_steps", "micro_batch_size", "seed",
          "gradient_checkpointing", "logging_steps", "save_steps", "report_to")
"""The training keys both stages have (MoL's also has epochs, grad_accumulation, optim, bf16 ...)."""


@pytest.fixture(autouse=True)
def fresh_notes(monkeypatch):
    """Each test sees its notes: a process notes each distinct line once."""
    monkeypatch.setattr("molrl.config.renames._NOTED", set(), raising=False)


def keys(cls: type) -> set[str]:
    """Every key ``--describe`` lists for ``cls``."""
    return {line.split(":")[0] for line in describe(cls) if not line.startswith(" ")}


def notes(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "old key names" in r.getMessage()]


def test_rl_and_mol_share_training_key_names():
    rl, mol = keys(RlConfig), keys(MolConfig)
    assert {f"train.{k}" for k in SHARED} <= rl & mol
    assert not set(SHARED) & rl  # none left at RL's top level (before: learning_rate, max_steps, save_steps, ...)
    assert {"data.path", "data.format"} <= rl  # what the stage trains on is data, as MoL's traces are


def test_old_rl_training_keys_still_load_with_a_note(tmp_path, caplog):
    old = tmp_path / "old.yaml"
    old.write_text("train: {path: tasks.jsonl, format: mbpp, limit: 4}\nlearning_rate: 0.5\nmax_steps: 7\n"
                   "log_every: 2\nmicro_batch_size: 4\nnum_generations: 4\n")
    cfg = load_config(RlConfig, old, ["save_steps=3"])
    t = cfg.train
    assert (t.learning_rate, t.max_steps, t.logging_steps, t.micro_batch_size, t.save_steps) == (0.5, 7, 2, 4, 3)
    assert (cfg.data.path, cfg.data.format, cfg.data.limit) == (Path("tasks.jsonl"), "mbpp", 4)
    file_note, override_note = notes(caplog)  # one line for the file, one for the command line
    assert file_note.startswith(f"{old}: old key names, read as the new ones: train.path -> data.path, ")
    assert "learning_rate -> train.learning_rate" in file_note and "log_every -> train.logging_steps" in file_note
    assert override_note.startswith("command-line overrides: old key names, read as the new ones: "
                                    "save_steps -> train.save_steps")
    # an old key given on the command line overrides the file's new one
    assert load_config(RlConfig, CONFIGS / "rl_tiny.yaml", ["max_steps=2"]).train.max_steps == 2


def test_a_run_saved_under_the_old_key_names_is_the_same_run(tmp_path):
    from molrl.records.rerun import check_rerun

    cfg = load_config(RlConfig, CONFIGS / "rl_tiny.yaml")
    saved = to_dict(cfg)  # as a run of the earlier layout saved it: training keys on top, the tasks under train
    training = saved.pop("train")
    saved["train"] = saved.pop("data")
    training["log_every"] = training.pop("logging_steps")
    for key in ("save_total_limit", "resume", "optim", "warmup_ratio", "bf16"):
        training.pop(key)  # added after that layout
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({**saved, **training}))
    assert check_rerun("rl", cfg, tmp_path / "config.yaml", started=True) == []
    raised = load_config(RlConfig, CONFIGS / "rl_tiny.yaml", ["train.max_steps=20"])
    assert [c.key for c in check_rerun("rl", raised, tmp_path / "config.yaml", started=True)] == ["train.max_steps"]


def test_pipeline_sections_named_for_what_they_run(caplog):
    assert {"rl", "rl_runs"} <= keys(PipelineConfig) and not any("grpo" in k for k in keys(PipelineConfig))
    assert PipelineConfig().stages == ["collect", "mol", "rl", "eval"]
    for path in sorted(CONFIGS.glob("pipeline_*.yaml")):  # the shipped configs use the names: no note
        load_pipeline_config(path, ["model=m"])
    from molrl.collect.config import CollectConfig
    from molrl.eval.config import EvalConfig
    from molrl.mol.config import MolConfig

    stages = {"rl_": (RlConfig, []), "mol_": (MolConfig, []), "eval": (EvalConfig, []),
              "collect": (CollectConfig, ["data.path=t.jsonl"])}  # a template's required value given
    for prefix, (cls, required) in stages.items():  # every shipped stage config, under its stage's current names
        for path in sorted(CONFIGS.glob(f"{prefix}*.yaml")):
            load_config(cls, path, required)
    assert notes(caplog) == []


def test_old_pipeline_section_names_still_load_with_a_note(tmp_path, caplog):
    from molrl.pipeline.config import rl_config

    mine = tmp_path / "mine.yaml"  # an earlier user config over the shipped (renamed) one
    mine.write_text(f"extends: {CONFIGS / 'pipeline_tiny.yaml'}\nstages: [mol, grpo, eval]\n"
                    "grpo: {max_steps: 7}\ngrpo_runs: [{name: a, start: base, overrides: [algorithm=opd, beta=0]}]\n")
    cfg = load_pipeline_config(mine, ["model=m", "grpo.seed=3"])
    assert cfg.stages == ["mol", "rl", "eval"] and [r.name for r in cfg.rl_runs] == ["a"]
    run = rl_config(cfg, cfg.rl_runs[0], tmp_path)
    assert (run.algorithm, run.train.max_steps, run.train.seed, run.train.learning_rate) == ("opd", 7, 3, 1e-3)
    assert any(n.startswith(f"{mine}: old key names, read as the new ones: grpo -> rl, grpo_runs -> rl_runs")
               for n in notes(caplog))
    assert "stages: grpo is now rl; read as rl" in caplog.messages


def test_a_pipeline_stage_finished_under_the_old_names_stays_finished(tmp_path):
    from molrl.pipeline import run_stage

    # engine named as the old use_vllm=false reads (auto may pick another sampler: a changed key for rl)
    cfg = load_config(RlConfig, CONFIGS / "rl_tiny.yaml", ["engine=transformers"])
    old = to_dict(cfg)
    old.update(old.pop("train"))
    old["train"] = old.pop("data")
    old["log_every"] = old.pop("logging_steps")
    for key in ("save_total_limit", "resume", "optim", "warmup_ratio", "bf16"):
        old.pop(key)  # added after that layout, as the engine key was
    old["use_vllm"] = old.pop("engine") == "vllm"
    old["vllm_gpu_memory_utilization"] = old.pop("engine_gpu_memory_utilization")
    (tmp_path / "DONE").write_text(json.dumps({"seconds": 1.0, "config": old}))
    assert run_stage(tmp_path, cfg, lambda: pytest.fail("a finished stage ran again"), "rl") is False


def test_grpo_command_is_an_alias_of_rl_with_a_note(cli_logs, caplog, capsys):
    from molrl.cli import main

    caplog.set_level(logging.WARNING)
    assert main(["grpo", "--describe"]) == 0
    assert "train.max_steps: 100  # Optimiser steps to run." in (
        capsys.readouterr().out.splitlines())
    assert "molrl grpo is now molrl rl, the same command under its one name" in caplog.messages


def test_every_stage_command_takes_overrides_a_config_and_describe_through_one_parser(capsys):
    """collect, mol, rl, eval, pipeline and demo build their parsers with ``add_stage_parser``: the same positional
    overrides, ``--config`` and ``--describe`` (export and the sandbox and traces tools take no config)."""
    from molrl.cli import build_parser, main

    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    for name in ("collect", "mol", "rl", "eval", "pipeline", "demo"):
        options = {o for a in commands[name]._actions for o in a.option_strings}
        positional = [a.dest for a in commands[name]._actions if not a.option_strings]
        assert {"--config", "--describe"} <= options and positional == ["overrides"], name
        capsys.readouterr()
        assert main([name, "--describe"]) == 0
        assert "output_dir" in capsys.readouterr().out or name == "collect", name
