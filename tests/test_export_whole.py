"""``molrl export`` writes its folder whole or not at all (``molrl.records.writes.write_folder``): a kill -9 at the worst
moment leaves the folder that was there before, or none, never weights without their tokenizer. And a model folder
left half-written by a stopped copy or an older export is refused in one line by the stages that load it."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from peft import LoraConfig, get_peft_model

from molrl.cli import main
from molrl.records.rerun import whole_weights
from molrl.tiny import build_tiny_pair

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def adapter(tmp_path_factory) -> Path:
    """A LoRA adapter on ``tiny:chatml``, with its tokenizer."""
    out = tmp_path_factory.mktemp("export") / "adapter"
    model, tok = build_tiny_pair("chatml")
    peft = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False,
                                            task_type="CAUSAL_LM"))
    peft.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _export(adapter: Path, out: Path, kill_at: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    env.pop("MOLRL_KILL_AT", None)
    if kill_at:
        env["MOLRL_KILL_AT"] = kill_at
    return subprocess.run([sys.executable, "-m", "molrl.cli", "export", "--merge", "--adapter", str(adapter),
                           "--base", "tiny:chatml", "--out", str(out)], env=env, capture_output=True, text=True,
                          timeout=600)


def _loadable(folder: Path) -> bool:
    return whole_weights(folder) and (folder / "tokenizer.json").is_file()


def test_a_killed_first_export_leaves_no_folder_and_a_rerun_writes_it_whole(adapter, tmp_path):
    out = tmp_path / "merged"
    killed = _export(adapter, out, kill_at="merged")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]  # before: export wrote in place, rc 0
    assert sorted(p.name for p in out.iterdir()) == [".lock", ".molrl_stage"]  # but the lock and the stage's name
    rerun = _export(adapter, out)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert _loadable(out) and (out / ".molrl_stage").read_text() == "export\n"  # the folder is an export's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged"]  # the killed run's temporary is gone


def test_a_killed_export_over_an_old_one_leaves_the_old_one(adapter, tmp_path):
    out = tmp_path / "merged"
    assert _export(adapter, out).returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    killed = _export(adapter, out, kill_at="merged")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.name != ".lock"}  # the killed run's lock file stays
    assert after == before and _loadable(out)


def _half_written(tmp_path: Path, cut: str) -> Path:
    """A model folder as a write stopped part-way leaves it: ``weights`` cut short, or ``tokenizer`` without
    tokenizer.json."""
    folder = tmp_path / f"half-{cut}"
    model, tok = build_tiny_pair("chatml")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    if cut == "weights":
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    else:
        (folder / "tokenizer.json").unlink()
    return folder


STAGES = {
    "mol": lambda model, out, data: ["mol", "--config", str(REPO / "configs" / "mol_tiny.yaml"), f"model={model}",
                                     f"output_dir={out}", f"data.traces=[{REPO / 'configs/data/mol_tiny_traces.jsonl'}]"],
    "eval": lambda model, out, data: ["eval", "--model", str(model), "--benchmarks", "math500", "--limit", "1",
                                      "--data", f"math500={data / 'math500' / 'test.jsonl'}", "--out", str(out)],
}


@pytest.mark.parametrize("cut", ["weights", "tokenizer"])
@pytest.mark.parametrize("stage", STAGES)
def test_a_half_written_model_folder_is_refused_in_one_line(stage, cut, tmp_path, shared_data, cli_logs, caplog):
    folder = _half_written(tmp_path, cut)
    caplog.set_level(logging.ERROR)
    assert main(STAGES[stage](folder, tmp_path / "run", shared_data)) == 1  # before: a safetensors or tokenizers traceback
    (error,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert str(folder) in error and "\n" not in error
    assert "write the folder again" in error


def test_the_export_kill_point_is_the_folder_rename(adapter, tmp_path):
    """What the kill tests rely on: the export's one write point is its folder, named like ``--out``."""
    out = tmp_path / "renamed-out"
    killed = _export(adapter, out, kill_at="renamed-out")
    assert killed.returncode == -signal.SIGKILL
    (left,) = tmp_path.glob("renamed-out.tmp-*")
    assert _loadable(left)  # whole, waiting for its rename
    shutil.rmtree(left)


def _filled(folder: Path, names: list[str]) -> Path:
    from molrl.records.writes import write_folder

    with write_folder(folder) as tmp:
        for name in names:
            (tmp / name).write_text(name)
    return folder


@pytest.mark.parametrize("before", ["none", "empty", "written", "same_names", "lock_only", "others", "subfolder"])
def test_a_folder_written_whole_never_deletes_what_it_does_not_write_again(before, tmp_path):
    """Every state the folder can be found in: what molrl wrote whole is replaced whole; a folder of anything else is
    replaced only when the new folder writes every name it holds (the lock of the run aside)."""
    from molrl.errors import MolrlError
    from molrl.records.writes import WHOLE

    folder = tmp_path / "out"
    if before == "written":
        _filled(folder, ["old.bin", "config.json"])  # an earlier whole write: old.bin goes
    elif before != "none":
        folder.mkdir()
        names = {"empty": [], "same_names": ["config.json"], "lock_only": [".lock"], "others": ["notes.txt", "DONE"],
                 "subfolder": []}[before]
        for name in names:
            (folder / name).write_text("mine")
        if before == "subfolder":
            (folder / "checkpoints").mkdir()
    refused = before in ("others", "subfolder")
    if refused:
        kept = sorted(p.name for p in folder.iterdir())
        with pytest.raises(MolrlError) as err:
            _filled(folder, ["config.json"])
        assert str(folder) in str(err.value) and "\n" not in str(err.value)
        assert all(name in str(err.value) for name in kept if name != "config.json")
        assert sorted(p.name for p in folder.iterdir()) == kept  # untouched
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary left
        return
    _filled(folder, ["config.json"])
    assert sorted(p.name for p in folder.iterdir()) == sorted(["config.json", WHOLE])
    assert (folder / "config.json").read_text() == "config.json"


def test_an_export_into_a_run_folder_is_refused_and_the_run_is_kept(adapter, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(adapter, run / "adapter")
    (run / "metrics.jsonl").write_text("{}\n")
    result = _export(run / "adapter", run)  # before: the run folder replaced by the merged model, rc 0
    assert result.returncode == 1 and "adapter, metrics.jsonl" in result.stderr
    assert "which writing the folder whole would delete" in result.stderr
    assert sorted(p.name for p in run.iterdir() if p.name != ".lock") == ["adapter", "metrics.jsonl"]
