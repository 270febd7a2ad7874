"""A model named on the hub (``org/name``) is the snapshot of the local hub cache that ``refs/main`` points to: its
files are fingerprinted like a folder's, so a re-run on other weights under the same name is refused."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from grpo_helpers import save_tiny_model
from molrl.cli import main
from molrl.errors import MolrlError
from molrl.fingerprint import fingerprint, hub_snapshot
from molrl.provenance import read_provenance
from molrl.run_inputs import input_fingerprints

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
    from molrl.sampling import SamplingConfig

    def cfg(limit: int) -> EvalConfig:
        return EvalConfig(model="org/tiny", benchmarks=["math500"], data={"math500": str(shared_data / "math500/test.jsonl")},
                          limit=limit, sampling=SamplingConfig(max_new_tokens=2), output_dir=tmp_path / "eval")

    run_eval(cfg(1))
    (hub / "refs" / "main").write_text(SECOND)
    with pytest.raises(MolrlError, match=rf"model.path \(org/tiny@{SECOND}\) has other contents"):
        run_eval(cfg(2))  # before: the second problem was scored on the other weights, in one report with the first
