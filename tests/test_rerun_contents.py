"""The re-run rule compares contents and resolved paths (``molrl.records.run_inputs.INPUTS``), never lets a key that can change a
grade pass as harmless, and a continued adapter's LoRA shape is the adapter's (``molrl.rl.adapter_lora``)."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path

import pytest
import yaml

from molrl.config.blocks import ModelSource, TaskSource
from molrl.cli import main
from molrl.config import ConfigError, load_config, save_config, to_dict
from molrl.records.rerun import HARMLESS, check_rerun, save_run_config

REPO = Path(__file__).resolve().parents[1]


def _errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]


def test_finding6_replaced_traces_refuse_an_extension(tmp_path, cli_logs, caplog):
    traces = Path(shutil.copy(REPO / "configs" / "data" / "mol_tiny_traces.jsonl", tmp_path / "traces.jsonl"))
    args = ["mol", "--config", str(REPO / "configs" / "mol_tiny.yaml"), "train.report_to=[none]",
            f"data.traces=[{traces}]", f"output_dir={tmp_path / 'run'}"]
    assert main([*args, "train.max_steps=1"]) == 0
    lines = traces.read_text().splitlines(keepends=True)
    traces.write_text("".join(reversed(lines)))  # other contents under the same name
    assert main([*args, "train.max_steps=2"]) == 1  # before: the run extended on the other data
    (error,) = _errors(caplog)
    assert f"was made from other contents under the same name: data.traces[0] ({traces}) has other contents" in error


def _model_folder(path: Path) -> Path:
    path.mkdir()
    (path / "config.json").write_text('{"model_type": "qwen3"}')
    (path / "model.safetensors").write_bytes(bytes(range(256)) * 4)
    return path


def test_finding6_replaced_model_weights_are_refused(tmp_path):
    from molrl.mol.config import MolConfig

    model = _model_folder(tmp_path / "model")
    cfg = MolConfig(model=str(model), output_dir=tmp_path / "run")
    save_run_config("mol", cfg, tmp_path / "run" / "config.yaml")
    assert check_rerun("mol", cfg, tmp_path / "run" / "config.yaml", started=True) == []
    (model / "model.safetensors").write_bytes(bytes(reversed(range(256))) * 4)  # same size, other weights
    with pytest.raises(ConfigError, match=rf"model.path \({model}\) has other contents"):
        check_rerun("mol", cfg, tmp_path / "run" / "config.yaml", started=True)


def test_finding6_the_same_folder_written_two_ways_is_the_same_run(tmp_path, monkeypatch):
    from molrl.mol.config import MolConfig

    monkeypatch.chdir(tmp_path)
    _model_folder(tmp_path / "models")
    save_run_config("mol", MolConfig(model="models", output_dir=Path("run")), tmp_path / "run" / "config.yaml")
    again = MolConfig(model="./models", output_dir=Path("run"))  # before: refused as a change of model
    assert check_rerun("mol", again, tmp_path / "run" / "config.yaml", started=True) == []
    with pytest.raises(ConfigError, match="model.path was 'models', now 'other'"):
        check_rerun("mol", MolConfig(model="other", output_dir=Path("run")), tmp_path / "run" / "config.yaml",
                    started=True)


def test_finding6_eval_of_an_adapter_trained_further_is_refused_not_finished(tmp_path):
    from molrl.eval.config import EvalConfig
    from molrl.eval.run import run_eval
    from molrl.tasks import JsonlSpec

    data, preds, adapter = tmp_path / "mine.jsonl", tmp_path / "p.jsonl", tmp_path / "rl" / "adapter"
    data.write_text('{"qid": "a", "question": "1+1?", "final": "2"}\n')
    preds.write_text('{"id": "a", "completion": "\\\\boxed{2}"}\n')
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text('{"r": 8}')
    (adapter / "adapter_model.safetensors").write_bytes(b"step 2")
    spec = JsonlSpec(kind="math", id_field="qid", prompt_field="question", answer_field="final")
    cfg = EvalConfig(benchmarks=["mine"], data={"mine": TaskSource(path=data, spec=spec)},
                     predictions={"mine": str(preds)}, model=ModelSource(adapter=adapter), output_dir=tmp_path / "eval")
    run_eval(cfg)
    (adapter / "adapter_model.safetensors").write_bytes(b"step 3")  # the RL run was extended
    with pytest.raises(ConfigError, match=rf"model.adapter \({adapter}\) has other contents"):
        run_eval(cfg)  # before: "finished", with the old adapter's scores


def test_finding9_a_sandbox_tolerance_is_not_harmless(tmp_path):
    from molrl.eval.config import EvalConfig

    save_config(EvalConfig(model="a"), tmp_path / "config.yaml")
    loose = EvalConfig(model="a")
    loose.sandbox.float_abs_tol = 1e6  # grades a wrong `return 0.0` correct
    with pytest.raises(ConfigError, match="sandbox.float_abs_tol was 0.0, now 1000000.0"):
        check_rerun("eval", loose, tmp_path / "config.yaml", started=True)  # before: accepted silently
    more = EvalConfig(model="a")
    more.sandbox.workers = 7
    assert check_rerun("eval", more, tmp_path / "config.yaml", started=True) == []


WHY_HARMLESS = {
    "output_dir": "where a run writes, not what it computes",
    "threads": "torch CPU threads: the same numbers, sooner or later",
    "train.report_to": "which trackers receive the logged figures",
    "train.logging_steps": "how often figures are logged",
    "train.save_steps": "how often checkpoints are written (a resume continues the same curve)",
    "train.save_total_limit": "how many checkpoints are kept",
    "train.resume": "whether the saved run is looked at, not what is trained",
    "sandbox.workers": "how many sandbox processes run tests at once; a verdict does not depend on it",
    "sandbox.workers": "how many sandbox processes run tests at once; a verdict does not depend on it",
    "limit": "how many problems or tasks: what was made for the first ones stays valid",
    "data.limit": "how many tasks: what was made for the first ones stays valid",
    "data.*.limit": "how many of one benchmark's problems: what was made for the first ones stays valid",
    "sampling.n": "how many episodes per task: what was collected stays valid",
    "benchmarks": "which benchmarks: each one's samples stay valid",
    "ks": "which pass@k are summarised from the same samples",
    "label": "the run's name in comparisons",
    "partial_predictions": "whether problems without predictions are an error; graded ones stay as graded",
    "batch_size": "how many problems are generated together (the resume granularity)",
    "episode.batch_size": "how many episodes are generated together",
    "device": "where the model runs",
    "engine": "which engine generates (in rl each samples the policy being trained: rollout/engine_logp_gap)",
    "engine_gpu_memory_utilization": "how much of a GPU the engine's KV cache takes",
    "progress": "whether a progress bar is drawn",
    "loss.base_targets_dir": "where the base's cached targets are kept; a cache is keyed by all that made it",
    "loss.base_targets_check_steps": "how often the cache's error is logged against the live base",
    "static_cache": "how the KV cache is held while generating: the same tokens (tests/test_generation.py)",
}
"""Why each key ``HARMLESS`` lists cannot change a grade or a trained weight: a key added there must be added here."""


def _flat_keys(data, prefix=""):
    if isinstance(data, dict) and data:
        return {k for key, v in data.items() for k in _flat_keys(v, f"{prefix}{key}.")}
    return {prefix.rstrip(".")}


def _required(cls: type) -> dict:
    from molrl.config.blocks import TaskSource

    if cls.__name__ == "EvalConfig":
        return {"data": {"x": TaskSource(Path("t"))}}
    return {"model": "m", "data": TaskSource(Path("t"))} if cls.__name__ == "CollectConfig" else {}


@pytest.mark.parametrize("stage,cls", [("mol", "molrl.mol.config:MolConfig"), ("rl", "molrl.rl.config:RlConfig"),
                                       ("collect", "molrl.collect.config:CollectConfig"),
                                       ("eval", "molrl.eval.config:EvalConfig")])
def test_every_harmless_key_is_a_single_key_with_a_stated_reason(stage, cls):
    import importlib

    module, name = cls.split(":")
    klass = getattr(importlib.import_module(module), name)
    leaves = _flat_keys(to_dict(klass(**_required(klass))))
    for key in HARMLESS[stage]:
        assert key.replace("*", "x") in leaves, f"{stage}: {key} is not one key of the config (a whole section could change a grade)"
        assert key in WHY_HARMLESS, f"{stage}: {key} is listed harmless without a reason here"
        assert not key.startswith("sandbox.") or key == "sandbox.workers"


def test_finding8_a_lora_value_that_disagrees_with_the_continued_adapter_is_refused(tmp_path, cli_logs, caplog):
    adapter = tmp_path / "mol" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text(json.dumps(
        {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": ["v_proj", "q_proj"]}))
    base = ["rl", "--config", str(REPO / "configs" / "rl_tiny.yaml"), f"model.adapter={tmp_path / 'mol'}",
            f"output_dir={tmp_path / 'rl'}"]
    assert main([*base, "lora.rank=8"]) == 1  # before: trained rank 16, recorded 8
    (error,) = _errors(caplog)
    assert error == (f"lora.rank=8: model.adapter_mode=continue trains the MoL adapter {adapter} further, whose rank "
                     "is 16; leave lora.rank unset (or set 16), or use model.adapter_mode=merge_new to train a new "
                     "LoRA of this shape")


def test_finding8_the_config_records_the_continued_adapters_shape(tmp_path):
    from molrl.rl.adapter_lora import take_adapter_lora
    from molrl.rl.config import RlConfig

    (tmp_path / "adapter_config.json").write_text(json.dumps(
        {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": ["v_proj", "q_proj"]}))
    cfg = RlConfig()
    cfg.model.adapter = tmp_path
    take_adapter_lora(cfg)
    save_config(cfg, tmp_path / "config.yaml")
    lora = yaml.safe_load((tmp_path / "config.yaml").read_text())["lora"]
    # dropout 0 (the default) is RL's switch that turns dropout off while training: it stays
    assert lora == {"rank": 16, "alpha": 32, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}  # rl has no lora.enabled
    cfg.lora.dropout = 0.2
    with pytest.raises(ConfigError, match="lora.dropout=0.2: .* whose dropout is 0.05"):
        take_adapter_lora(cfg)


def test_a_finished_pipeline_stage_whose_input_changed_is_refused(tmp_path):
    from molrl.errors import MolrlError
    from molrl.eval.config import EvalConfig
    from molrl.pipeline import run_stage

    tasks = tmp_path / "x.jsonl"
    tasks.write_text('{"id": "a", "prompt": "1+1?", "answer": "2"}\n')
    cfg = EvalConfig(model="m", benchmarks=["x"], data={"x": str(tasks)}, output_dir=tmp_path / "stage")
    assert run_stage(tmp_path / "stage", cfg, lambda: None, "eval")
    assert not run_stage(tmp_path / "stage", cfg, lambda: None, "eval")  # finished, same contents
    tasks.write_text('{"id": "a", "prompt": "1+1?", "answer": "3"}\n')
    with pytest.raises(MolrlError, match=rf"data.x.path \({tasks}\) has other contents"):
        run_stage(tmp_path / "stage", cfg, lambda: None, "eval")


def _renamed_inputs():
    """(stage, class, old key, new key) of every renamed key that names an input (``INPUTS``), by enumeration."""
    import importlib

    from molrl.records.run_inputs import is_input

    classes = {"mol": "molrl.mol.config:MolConfig", "rl": "molrl.rl.config:RlConfig",
               "collect": "molrl.collect.config:CollectConfig", "eval": "molrl.eval.config:EvalConfig"}
    found = []
    for stage, where in classes.items():
        module, name = where.split(":")
        cls = getattr(importlib.import_module(module), name)
        for old, (new, _) in getattr(cls, "RENAMED_KEYS", {}).items():
            if "*" not in old and is_input(stage, new):
                found.append((stage, cls, old, new))
    return found


@pytest.mark.parametrize("stage,cls,old,new", _renamed_inputs(), ids=lambda v: getattr(v, "__name__", str(v)))
def test_an_input_saved_under_an_old_key_is_checked_under_its_new_one(stage, cls, old, new):
    from molrl.records.run_inputs import current_label

    assert current_label(cls, old) == new
    assert current_label(cls, new) == new


def test_the_renamed_inputs_enumerated_include_each_stages_task_file_and_model():
    names = {(stage, old) for stage, _, old, _ in _renamed_inputs()}
    assert {("collect", "tasks"), ("rl", "policy.base"), ("rl", "policy.mol_adapter"),
            ("collect", "adapter"), ("eval", "adapter")} <= names


def test_a_collect_run_saved_with_its_tasks_label_is_refused_when_the_file_changed(tmp_path):
    from molrl.collect.config import CollectConfig
    from molrl.config.blocks import TaskSource
    from molrl.records.run_inputs import changed_inputs, input_fingerprints

    tasks = tmp_path / "t.jsonl"
    tasks.write_text('{"id": "a", "prompt": "1+1?", "answer": "2"}\n')
    cfg = CollectConfig(model="m", data=TaskSource(tasks))
    kept = {"tasks": input_fingerprints("collect", cfg)["data.path"]}  # as a run saved it before the rename
    assert changed_inputs("collect", kept, cfg) == []
    tasks.write_text('{"id": "a", "prompt": "1+1?", "answer": "3"}\n')
    assert [c.label for c in changed_inputs("collect", kept, cfg)] == ["data.path"]
    eval_kept = {"data.x": {"path": str(tasks), "fingerprint": "old"}}
    from molrl.eval.config import EvalConfig

    assert [c.label for c in changed_inputs("eval", eval_kept, EvalConfig(data={"x": tasks}))] == ["data.x.path"]


def test_an_input_saved_before_its_block_had_a_shorthand_is_checked_under_the_blocks_path():
    from molrl.eval.config import EvalConfig
    from molrl.mol.config import MolConfig
    from molrl.records.run_inputs import current_label

    assert current_label(MolConfig, "model") == "model.path"
    assert current_label(EvalConfig, "data.mbpp") == "data.mbpp.path"
    assert current_label(MolConfig, "data.traces[1]") == "data.traces[1]"
