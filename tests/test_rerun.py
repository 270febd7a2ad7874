"""Running a stage again on its own output (``molrl.records.rerun``): a finished run is left as it is, a changed config
is refused by name, a raised max_steps extends the run; values are checked, and typos reported, before torch loads."""

from __future__ import annotations

import inspect
import json
import logging
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from molrl.cli import main
from molrl.config import ConfigError, load_config, save_config
from test_finished_runs import snapshot

REPO = Path(__file__).resolve().parents[1]
GRPO_TINY = ["--config", str(REPO / "configs" / "rl_tiny.yaml"), "train.max_steps=2", "sampling.max_new_tokens=4"]
MOL_TINY = ["--config", str(REPO / "configs" / "mol_tiny.yaml"), "train.max_steps=2", "train.report_to=[none]",
            f"data.traces=[{REPO / 'configs' / 'data' / 'mol_tiny_traces.jsonl'}]"]


@pytest.fixture(scope="module")
def finished_rl(tmp_path_factory) -> Path:
    """A 2-step RL run on the shipped tiny config, run to its end (checkpoint-2 and adapter/)."""
    from molrl.rl.config import RlConfig
    from molrl.rl.run import run_rl

    out = tmp_path_factory.mktemp("rerun") / "rl"
    return run_rl(load_config(RlConfig, GRPO_TINY[1], [*GRPO_TINY[2:], f"output_dir={out}"]))


@pytest.fixture(scope="module")
def finished_mol(tmp_path_factory) -> Path:
    """A 2-step MoL run on the shipped tiny config, run to its end (checkpoint-2 and adapter/)."""
    from molrl.mol.config import MolConfig
    from molrl.mol.run import run_mol

    out = tmp_path_factory.mktemp("rerun") / "mol"
    return run_mol(load_config(MolConfig, MOL_TINY[1], [*MOL_TINY[2:], f"output_dir={out}"]))


def copy_of(run: Path, tmp_path: Path) -> Path:
    """A copy of a finished run elsewhere (its saved output_dir is the original's: a key a re-run may change)."""
    return Path(shutil.copytree(run, tmp_path / "run"))


def steps(run: Path) -> list[int]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if "loss" in r]


def adapter_bytes(run: Path) -> bytes:
    return (run / "adapter" / "adapter_model.safetensors").read_bytes()


def messages(caplog, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


def test_finished_rl_run_is_not_trained_again(finished_rl, tmp_path, cli_logs, caplog):
    run = copy_of(finished_rl, tmp_path)
    before, config = adapter_bytes(run), (run / "config.yaml").read_bytes()
    caplog.set_level(logging.INFO)
    assert main(["rl", *GRPO_TINY, f"output_dir={run}"]) == 0
    assert steps(run) == [1, 2]  # before: 3/2, steps [1, 2, 3]
    assert adapter_bytes(run) == before and (run / "config.yaml").read_bytes() == config
    assert sorted(p.name for p in (run / "checkpoints").glob("checkpoint-*")) == ["checkpoint-2"]
    assert [m for m in messages(caplog, logging.INFO) if "finished" in m] == [
        f"{run}: finished (step 2 of 2, {run / 'adapter'}); nothing to do (raise train.max_steps to train further, "
        "or start a new run with output_dir=DIR)"]


def test_rl_run_killed_before_its_final_save_writes_the_adapter_of_its_last_step(finished_rl, tmp_path, cli_logs):
    from safetensors.torch import load_file

    run = copy_of(finished_rl, tmp_path)
    shutil.rmtree(run / "adapter")  # what a kill between the last checkpoint and the final save leaves
    assert main(["rl", *GRPO_TINY, f"output_dir={run}"]) == 0
    # transformers resumes a mid-epoch checkpoint at max_steps by training one more step; the stage loads it instead
    assert steps(run) == [1, 2]
    want, got = load_file(str(finished_rl / "adapter" / "adapter_model.safetensors")), load_file(
        str(run / "adapter" / "adapter_model.safetensors"))
    assert want.keys() == got.keys() and all((want[k] == got[k]).all() for k in want)


def test_changed_config_is_refused_naming_the_key_rl(finished_rl, tmp_path, cli_logs, caplog):
    run = copy_of(finished_rl, tmp_path)
    before, config = adapter_bytes(run), (run / "config.yaml").read_bytes()
    assert main(["rl", *GRPO_TINY, f"output_dir={run}", "algorithm=ppo", "episode.max_turns=3"]) == 1
    assert messages(caplog, logging.ERROR) == [
        f"{run / 'config.yaml'}: {run} was made with other settings: algorithm was 'dr_grpo', now 'ppo'; "
        "episode.max_turns was 1, now 3; start a new run elsewhere (output_dir=DIR), or re-run with the saved values "
        "to resume this one"]
    assert adapter_bytes(run) == before and (run / "config.yaml").read_bytes() == config and steps(run) == [1, 2]


def test_changed_config_is_refused_naming_the_key_mol(finished_mol, tmp_path, cli_logs, caplog):
    run = copy_of(finished_mol, tmp_path)
    config = (run / "config.yaml").read_bytes()
    assert main(["mol", *MOL_TINY, f"output_dir={run}", "train.learning_rate=0.5"]) == 1
    (error,) = messages(caplog, logging.ERROR)
    assert "train.learning_rate was 0.001, now 0.5; start a new run elsewhere (output_dir=DIR)" in error
    assert (run / "config.yaml").read_bytes() == config  # before: exit 0, config.yaml rewritten to 0.5


def test_finished_mol_run_rewrites_nothing(finished_mol, tmp_path, cli_logs, caplog):
    run = copy_of(finished_mol, tmp_path)
    config, adapter_time = (run / "config.yaml").read_bytes(), (run / "adapter").stat().st_mtime_ns
    caplog.set_level(logging.INFO)
    assert main(["mol", *MOL_TINY, f"output_dir={run}", "train.report_to=[tensorboard]"]) == 0  # a harmless key
    assert (run / "config.yaml").read_bytes() == config and (run / "adapter").stat().st_mtime_ns == adapter_time
    assert steps(run) == [1, 2] and any(m.startswith(f"{run}: finished (step 2 of 2") for m in caplog.messages)


def test_raising_max_steps_extends_the_run(finished_rl, tmp_path, cli_logs, caplog):
    run = copy_of(finished_rl, tmp_path)
    caplog.set_level(logging.INFO)
    assert main(["rl", *GRPO_TINY, f"output_dir={run}", "train.max_steps=3"]) == 0
    assert steps(run) == [1, 2, 3]
    assert f"{run}: extending the run (train.max_steps 2 -> 3), resuming from " \
           f"{run / 'checkpoints' / 'checkpoint-2'} (step 2 of 3)" in caplog.messages


def test_rl_and_mol_share_one_checkpoint_layout(finished_rl, finished_mol):
    for run in (finished_rl, finished_mol):  # before: MoL's were run/checkpoint-N, RL's run/checkpoints/checkpoint-N
        assert [p.name for p in (run / "checkpoints").glob("checkpoint-*")] == ["checkpoint-2"]
        assert not list(run.glob("checkpoint-*"))


def test_old_checkpoint_layout_still_resumes(finished_mol, tmp_path, cli_logs, caplog):
    run = copy_of(finished_mol, tmp_path)
    shutil.move(run / "checkpoints" / "checkpoint-2", run / "checkpoint-2")  # where a MoL run kept it before
    shutil.rmtree(run / "checkpoints")
    caplog.set_level(logging.INFO)
    assert main(["mol", *MOL_TINY, f"output_dir={run}", "train.max_steps=3"]) == 0
    assert f"{run}: extending the run (train.max_steps 2 -> 3), resuming from {run / 'checkpoint-2'} " \
           "(step 2 of 3)" in caplog.messages
    assert steps(run) == [1, 2, 3] and (run / "checkpoints" / "checkpoint-3").is_dir()


def test_lowering_max_steps_is_refused(finished_mol, tmp_path, cli_logs, caplog):
    run = copy_of(finished_mol, tmp_path)
    assert main(["mol", *MOL_TINY, f"output_dir={run}", "train.max_steps=1"]) == 1
    (error,) = messages(caplog, logging.ERROR)
    assert "train.max_steps was 2, now 1 (only raising it extends the run)" in error


def test_collect_and_eval_refuse_through_the_shared_rule(tmp_path):
    from molrl.collect.config import CollectConfig
    from molrl.config.blocks import TaskSource
    from molrl.eval.config import EvalConfig
    from molrl.records.rerun import check_rerun
    from molrl.engines.sampling import SamplingConfig

    save_config(EvalConfig(model="a"), tmp_path / "config.yaml")
    # ks, label and limit only change what is summarised: allowed
    assert check_rerun("eval", EvalConfig(model="a", ks=[1], label="x", limit=3), tmp_path / "config.yaml",
                       started=True) == []
    with pytest.raises(ConfigError, match=r"model.path was 'a', now 'b'; start a new run elsewhere \(output_dir=DIR, or --out DIR for short\)"):
        check_rerun("eval", EvalConfig(model="b", ks=[1]), tmp_path / "config.yaml", started=True)
    saved = tmp_path / "t" / "config.yaml"
    save_config(CollectConfig(model="m", data=TaskSource(Path("t")), output_dir=tmp_path / "t"), saved)
    # output_dir and sampling.n: allowed
    other = CollectConfig(model="m", data=TaskSource(Path("t")), output_dir=tmp_path / "u",
                          sampling=SamplingConfig(n=4))
    other.sampling.temperature = 0.8
    with pytest.raises(ConfigError, match=r"sampling.temperature was 0.0, now 0.8; start a new run "
                                          r"elsewhere \(output_dir=DIR, or --out DIR for short\)") as err:
        check_rerun("collect", other, saved, started=True)
    assert "samples" not in str(err.value) and "output_dir was" not in str(err.value)
    assert check_rerun("collect", other, saved, started=False) == []  # nothing collected yet: nothing to protect


@pytest.mark.parametrize("overrides,key", [
    (["episode.max_turns=2", "loss.ce_weight=inf"], "loss.ce_weight=inf"),
    (["episode.max_turns=2", "loss.ce_weight=nan"], "loss.ce_weight=nan"),
    (["loss.kl_weight=nan"], "loss.kl_weight=nan"),  # before: min(nan, x) < 0 is false, the term went off
    (["sampling.max_new_tokens=0"], "sampling.max_new_tokens=0"),  # before: a transformers traceback after loading
    (["episode.max_turns=2", "episode.turn_tokens=0"], "episode.turn_tokens=0"),
])
def test_non_finite_and_empty_values_are_refused_before_loading(overrides, key, tmp_path, cli_logs, caplog):
    out = tmp_path / "run"
    assert main(["rl", *GRPO_TINY, f"output_dir={out}", *overrides]) == 1
    allowed = "an integer in [1, 1000000000]" if key.endswith("=0") else "a number in [0, 1000000]"
    assert messages(caplog, logging.ERROR) == [
        f"{GRPO_TINY[1]} + command-line overrides: {key} is out of range; allowed: {allowed}"]
    assert not out.exists()  # nothing was loaded or written


def test_values_of_a_config_built_in_python_are_checked_by_the_stage(tmp_path):
    from molrl.rl.config import RlConfig, TaskSource, rl_train
    from molrl.rl.method_settings import TermSettings
    from molrl.rl.run import run_rl

    cfg = RlConfig(output_dir=tmp_path / "run", data=TaskSource(format="toy", limit=2),
                   train=rl_train(max_steps=1), loss=TermSettings(kl_weight=math.nan))
    with pytest.raises(ConfigError, match=r"RlConfig: loss.kl_weight=nan is out of range"):
        run_rl(cfg)
    assert not (tmp_path / "run").exists()


PROBE = """
import sys
from molrl.cli import main
from molrl.config import load_config
import importlib, json
module, cls, path, extra = sys.argv[1:5]
load_config(getattr(importlib.import_module(module), cls), path, json.loads(extra))  # a valid config, checked
rc = main(sys.argv[5:])
heavy = [m for m in ("torch", "transformers", "trl", "peft", "accelerate", "datasets") if m in sys.modules]
print("RESULT", rc, ",".join(heavy) or "none")
"""


@pytest.mark.parametrize("stage,module,cls,config,typo", [
    ("mol", "molrl.mol.config", "MolConfig", "configs/mol_tiny.yaml", "nosuch.key=1"),
    ("rl", "molrl.rl.config", "RlConfig", "configs/rl_tiny.yaml", "nosuch.key=1"),
    ("collect", "molrl.collect.config", "CollectConfig", "configs/collect.yaml", "episode.nosuch=1"),
    ("eval", "molrl.eval.config", "EvalConfig", "configs/eval.yaml", "sampling.nosuch=1"),
    ("pipeline", "molrl.pipeline.config", "PipelineConfig", "configs/pipeline_tiny.yaml", "mol.train.nosuch=1"),
])
def test_config_typo_reported_without_importing_torch(stage, module, cls, config, typo, tmp_path):
    extra = {"collect": ["model=tiny:chatml", "data.path=t.jsonl", f"output_dir={tmp_path / 't'}"],
             "pipeline": ["model=tiny:chatml", "stages=[mol]", f"output_dir={tmp_path}"]}.get(stage, [])
    argv = [stage, "--config", config, *extra, typo]
    done = subprocess.run([sys.executable, "-c", PROBE, module, cls, config, json.dumps(extra), *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.split()[-3:] == ["RESULT", "1", "none"], done.stderr[-2000:]
    assert "nosuch" in done.stderr


def test_the_private_trainer_method_a_finished_checkpoint_is_loaded_with_exists():
    # molrl.records.runfiles.load_checkpoint calls it: if the pinned transformers renames it, this fails first
    from transformers import Trainer

    assert list(inspect.signature(Trainer._load_from_checkpoint).parameters)[:2] == ["self", "resume_from_checkpoint"]


TRAINING_VARIANTS = {
    "output_dir": [],  # the copy itself: saved under the original's folder, re-run in the copy's
    "train.report_to": ["train.report_to=[tensorboard]"],
    "train.logging_steps": ["train.logging_steps=5"],
    "train.save_steps": ["train.save_steps=7"],
    "train.save_total_limit": ["train.save_total_limit=3"],
    "threads": ["threads=1"],
    "sandbox.workers": ["sandbox.workers=2"],
    "loss.base_targets_dir": ["loss.base_targets_dir=elsewhere"],
    "loss.base_targets_check_steps": ["loss.base_targets_check_steps=7"],
}
"""A value other than the finished run's for every key a re-run of mol or rl may change (``train.resume``'s only other
value, ``never``, is the request to start over in the same folder)."""
IDLE_IN_THE_FINISHED_RUN = {"loss.base_targets_dir": "loss.base_targets_dir=elsewhere does nothing with "
                                                     "loss.base_targets=live",
                            "loss.base_targets_check_steps": "loss.base_targets_check_steps=7 does nothing with "
                                                             "loss.base_targets=live"}
"""Variants the finished tiny mol run (loss.base_targets=live) leaves idle: refused as the config loads
(``molrl.config.idle``), before the run folder is touched; a finished run on cached base targets re-run with either is
tested in tests/test_mol_base_targets.py."""
RL_REFUSED = {"engine": ("vllm", "'auto', now 'vllm'"), "engine_gpu_memory_utilization": ("0.5", "0.3, now 0.5")}
"""The keys harmless to rl only under greedy decoding, which rl never samples with (``molrl.records.rerun.GREEDY_ONLY``)."""


def test_every_key_a_rerun_of_mol_or_rl_may_change_has_a_variant():
    from molrl.records.rerun import GREEDY_ONLY, HARMLESS

    assert {*HARMLESS["mol"], *HARMLESS["rl"]} - {"train.resume"} == set(TRAINING_VARIANTS)
    assert set(GREEDY_ONLY["rl"]) == set(RL_REFUSED) and "mol" not in GREEDY_ONLY


@pytest.mark.parametrize("stage", ["mol", "rl"])
@pytest.mark.parametrize("key", sorted(TRAINING_VARIANTS))
def test_a_finished_training_run_rerun_changes_no_file(finished_mol, finished_rl, tmp_path, cli_logs, caplog, stage, key):
    from molrl.records.rerun import HARMLESS

    if key not in HARMLESS[stage]:
        pytest.skip(f"{stage} has no {key}")
    run = copy_of(finished_mol if stage == "mol" else finished_rl, tmp_path)
    before = snapshot(run)
    caplog.set_level(logging.INFO)
    code = main([stage, *(MOL_TINY if stage == "mol" else GRPO_TINY), f"output_dir={run}", *TRAINING_VARIANTS[key]])
    if key in IDLE_IN_THE_FINISHED_RUN:
        assert code == 1 and any(IDLE_IN_THE_FINISHED_RUN[key] in m for m in messages(caplog, logging.ERROR))
    else:
        assert code == 0 and any(m.startswith(f"{run}: finished (step 2 of 2") for m in caplog.messages)
    assert snapshot(run) == before


@pytest.mark.parametrize("key", sorted(RL_REFUSED))
def test_a_key_that_changes_how_rollouts_are_drawn_is_refused_by_name(finished_rl, tmp_path, cli_logs, caplog, key):
    run = copy_of(finished_rl, tmp_path)
    before = snapshot(run)
    value, both = RL_REFUSED[key]
    assert main(["rl", *GRPO_TINY, f"output_dir={run}", f"{key}={value}"]) == 1
    (error,) = messages(caplog, logging.ERROR)
    assert f"{key} was {both}; start a new run elsewhere" in error
    assert snapshot(run) == before  # before: the engine, its mode or its cache were accepted as harmless


def test_each_completion_row_records_the_engine_model_and_sampling(finished_rl):
    rows = [json.loads(line) for line in (finished_rl / "completions.jsonl").read_text().splitlines()]
    assert rows and all(r["made_by"]["engine"] == "transformers" and r["made_by"]["sampling"]["temperature"] > 0
                        and r["made_by"]["model"] == {} for r in rows)  # the tiny base: nothing to fingerprint
