"""A model named on the hub (``org/name``) is the snapshot of the local hub cache that ``refs/main`` points to: its
files are fingerprinted like a folder's, so a re-run on other weights under the same name is refused."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from grpo_helpers import save_tiny_model
from molrl.cli import main
from molrl.errors import MolrlError
from molrl.records.fingerprint import fingerprint, hub_snapshot
from molrl.records.provenance import read_provenance
from molrl.records.run_inputs import input_fingerprints

REPO = Path(__file__).resolve().parents[1]
FIRST, SECOND = "a" * 40, "b" * 40


@pytest.fixture
def hub(tmp_path, monkeypatch) -> Path:
    """An offline hub cache holding two snapshots of a tiny model ``org/tiny`` (other weights), refs/main at the first."""
    from huggingface_hub import constants

    repo = tmp_path / "hub" / "models--org--tiny"
    save_tiny_model(repo / "snapshots" / FIRST)
    save_tiny_model(repo / "snapshots" / SECOND, eos_logit=2.0)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(FIRST)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return repo


def _error(caplog) -> str:
    (error,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    return error


def test_a_hub_name_is_fingerprinted_as_its_cached_snapshot(hub):
    from molrl.mol.config import MolConfig

    found = input_fingerprints("mol", MolConfig(model="org/tiny"))
    assert found == {"model.path": {"path": f"org/tiny@{FIRST}", "fingerprint": fingerprint(hub / "snapshots" / FIRST)}}
    (hub / "refs" / "main").write_text(SECOND)
    assert hub_snapshot("org/tiny").folder == hub / "snapshots" / SECOND
    assert fingerprint(hub / "snapshots" / FIRST) != fingerprint(hub / "snapshots" / SECOND)
    assert hub_snapshot("org/absent") is None and hub_snapshot("tiny:chatml") is None


def test_mol_extended_on_other_weights_under_the_same_hub_name_is_refused(hub, tmp_path, cli_logs, caplog):
    run = tmp_path / "run"
    args = ["mol", "--config", str(REPO / "configs" / "mol_tiny.yaml"), "model=org/tiny", "train.report_to=[none]",
            f"output_dir={run}"]
    assert main([*args, "train.max_steps=1"]) == 0
    base = read_provenance(run / "adapter").base
    assert base == {"model": "org/tiny", "path": f"org/tiny@{FIRST}", "fingerprint": fingerprint(hub / "snapshots" / FIRST)}
    (hub / "refs" / "main").write_text(SECOND)
    assert main([*args, "train.max_steps=2"]) == 1  # before: the run extended on the other weights, rc 0
    assert f"model.path (org/tiny@{SECOND}) has other contents" in _error(caplog)


def test_eval_with_a_raised_limit_on_other_weights_under_the_same_hub_name_is_refused(hub, tmp_path, shared_data):
    from molrl.eval import EvalConfig, run_eval
    from molrl.engines.sampling import SamplingConfig

    def cfg(limit: int) -> EvalConfig:
        return EvalConfig(model="org/tiny", benchmarks=["math500"], data={"math500": str(shared_data / "math500/test.jsonl")},
                          limit=limit, sampling=SamplingConfig(max_new_tokens=2), output_dir=tmp_path / "eval")

    run_eval(cfg(1))
    (hub / "refs" / "main").write_text(SECOND)
    with pytest.raises(MolrlError, match=rf"model.path \(org/tiny@{SECOND}\) has other contents"):
        run_eval(cfg(2))  # before: the second problem was scored on the other weights, in one report with the first


def _trained_on_math500_problem(folder: Path, shared_data: Path) -> None:
    """Write a record into ``folder`` saying its weights trained on MATH-500's first problem."""
    from molrl.records.provenance import made, trained_on, write_provenance
    from molrl.tasks import load_tasks

    write_provenance(folder, made("mol", "cfg", "tiny:chatml", [],
                                  *trained_on(load_tasks(shared_data / "math500/test.jsonl", "math500")[:1])))


def _eval_cfg(model: str, tmp_path: Path, shared_data: Path):
    from molrl.eval import EvalConfig
    from molrl.engines.sampling import SamplingConfig

    return EvalConfig(model=model, benchmarks=["math500"], data={"math500": str(shared_data / "math500/test.jsonl")},
                      limit=2, sampling=SamplingConfig(max_new_tokens=2), output_dir=tmp_path / "eval")


def test_eval_reads_the_record_of_a_model_named_by_its_hub_name(hub, tmp_path, shared_data, monkeypatch):
    """A merged export copied into the hub cache and loaded as ``org/tiny`` is refused as its folder is."""
    from molrl.eval import run_eval

    _trained_on_math500_problem(hub / "snapshots" / FIRST, shared_data)
    monkeypatch.setattr("molrl.models.load_model", lambda *a, **k: pytest.fail("loaded before the refusal"))
    with pytest.raises(MolrlError, match=rf"^{hub / 'snapshots' / FIRST / 'molrl_provenance.json'}: the model was "
                                         r"trained on 1 of the problems to score \(math500: 1 of 2\)"):
        run_eval(_eval_cfg("org/tiny", tmp_path, shared_data))  # before: scored, rc 0
    assert read_provenance("org/tiny").where == str(hub / "snapshots" / FIRST / "molrl_provenance.json")


def test_a_bare_hub_name_in_the_cache_is_read_too(hub, shared_data):
    bare = hub.parent / "models--tinybare"
    save_tiny_model(bare / "snapshots" / SECOND)
    (bare / "refs").mkdir()
    (bare / "refs" / "main").write_text(SECOND)
    _trained_on_math500_problem(bare / "snapshots" / SECOND, shared_data)
    assert hub_snapshot("tinybare").folder == bare / "snapshots" / SECOND
    assert read_provenance("tinybare").trained()


@pytest.mark.parametrize("name", ["org/absent", "models/no_such_model", "absent-model"])
def test_a_hub_shaped_name_neither_a_folder_nor_cached_is_one_line_before_loading(name, hub, tmp_path, shared_data,
                                                                                  monkeypatch):
    from molrl.eval import run_eval

    monkeypatch.chdir(tmp_path)  # no models/ folder here: the name can only be a hub name
    monkeypatch.setattr("molrl.models.load_model", lambda *a, **k: pytest.fail("loaded before the refusal"))
    monkeypatch.setattr("molrl.models.load_tokenizer", lambda *a, **k: pytest.fail("loaded before the refusal"))
    with pytest.raises(MolrlError) as err:
        run_eval(_eval_cfg(name, tmp_path, shared_data))  # before: named by the loader, after its hub check (4-6 s)
    assert str(err.value) == (f"{name}: no such folder, and no model of that name in the hub cache ({hub.parent}), so "
                              "what it was trained on (molrl_provenance.json) cannot be read; give the model's "
                              f"folder, or download it first (huggingface-cli download {name})")


def test_a_missing_path_is_left_to_the_loader_and_a_mistyped_folder_named(tmp_path, monkeypatch):
    assert read_provenance(tmp_path / "gone") is None  # the input check or the loader names it
    (tmp_path / "models").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MolrlError, match=r"^models/smolm2: no such folder \(the folder models/ exists\); check the "
                                         r"path$"):
        read_provenance("models/smolm2")


def test_eval_names_an_uncached_hub_name_before_torch_is_imported(tmp_path, shared_data):
    import os
    import subprocess
    import sys

    probe = ("import sys; from molrl.cli import main; "
             f"rc = main(['eval', '--model', 'models/no_such_model', '--benchmarks', 'humaneval', '--data', "
             f"'humaneval={shared_data / 'humaneval/HumanEval.jsonl.gz'}', '--out', '{tmp_path / 'eval'}']); "
             "print(rc, 'torch' in sys.modules)")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    assert done.stdout.split() == ["1", "False"]  # before: named by the loader once torch and the hub check ran
    (line,) = [line for line in done.stderr.splitlines() if "models/no_such_model" in line]
    assert line.endswith(f"models/no_such_model: no such folder, and no model of that name in the hub cache "
                         f"({tmp_path / 'hub'}), so what it was trained on (molrl_provenance.json) cannot be read; "
                         "give the model's folder, or download it first (huggingface-cli download models/no_such_model)")
