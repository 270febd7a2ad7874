"""What a run leaves is whole or absent (``molrl.records.writes``), "finished" means loadable, and one run writes an output.

The kill tests enumerate the write points from what a finished run leaves: each file or folder it wrote for good is a
point, and ``MOLRL_KILL_AT`` kills the process (SIGKILL) with that write's content on disk under its temporary name.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from molrl.cli import main
from molrl.errors import MolrlError
from molrl.records.rerun import whole_weights

REPO = Path(__file__).resolve().parents[1]
MOL_TINY = ["--config", str(REPO / "configs" / "mol_tiny.yaml"), "train.max_steps=2", "train.report_to=[none]",
            f"data.traces=[{REPO / 'configs' / 'data' / 'mol_tiny_traces.jsonl'}]"]
LOGS = {"metrics.jsonl", "completions.jsonl", "checkpoints", ".lock"}  # appended to (torn tails repaired) or trainer-written, not points


def _cli(args: list[str], kill_at: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    env.pop("MOLRL_KILL_AT", None)
    if kill_at:
        env["MOLRL_KILL_AT"] = kill_at
    return subprocess.run([sys.executable, "-m", "molrl.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def finished_mol(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("whole") / "mol"
    assert main(["mol", *MOL_TINY, f"output_dir={out}"]) == 0
    return out


def _left(run: Path) -> list[str]:
    return sorted(p.name for p in run.iterdir())


def _steps(run: Path) -> list[int]:
    return [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def test_finding4_a_torn_adapter_is_rebuilt_from_the_last_checkpoint(finished_mol, tmp_path, cli_logs, caplog):
    from safetensors.torch import load_file

    run = Path(shutil.copytree(finished_mol, tmp_path / "run"))
    shutil.rmtree(run / "adapter")
    (run / "adapter").mkdir()  # what a kill -9 while the final adapter was written left
    caplog.set_level(logging.INFO)
    assert main(["mol", *MOL_TINY, f"output_dir={run}"]) == 0
    assert not any("finished" in m for m in caplog.messages)  # before: "finished (step 2 of 2, ...)", empty adapter/
    assert f"{run}: {run / 'checkpoints' / 'checkpoint-2'} holds the last step (2 of 2); writing {run / 'adapter'} " \
           "from it, training nothing" in caplog.messages
    assert whole_weights(run / "adapter") and _steps(run) == [1, 2]
    want, got = (load_file(str(r / "adapter" / "adapter_model.safetensors")) for r in (finished_mol, run))
    assert want.keys() == got.keys() and all((want[k] == got[k]).all() for k in want)


def test_finding4_a_torn_adapter_without_a_checkpoint_is_refused_in_one_line(finished_mol, tmp_path, cli_logs, caplog):
    run = Path(shutil.copytree(finished_mol, tmp_path / "run"))
    shutil.rmtree(run / "checkpoints")
    weights = run / "adapter" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # cut short
    assert main(["mol", *MOL_TINY, f"output_dir={run}"]) == 1
    (error,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert error.startswith(f"{run / 'adapter'}: incomplete (the run was killed while writing it) and no checkpoint")


def test_finding4_a_torn_rl_adapter_is_rebuilt_from_the_last_checkpoint(tmp_path, cli_logs, caplog):
    run = tmp_path / "rl"
    args = ["rl", "--config", str(REPO / "configs" / "rl_tiny.yaml"), "train.max_steps=2", "sampling.max_new_tokens=4",
            f"output_dir={run}"]
    assert main(args) == 0
    (run / "adapter" / "adapter_model.safetensors").write_bytes(b"")  # what a kill -9 mid-save left before
    caplog.clear()
    caplog.set_level(logging.INFO)
    assert main(args) == 0
    assert not any("finished" in m for m in caplog.messages)
    assert any("rebuilding it from" in m for m in caplog.messages)
    assert whole_weights(run / "adapter") and _steps(run) == [1, 2]


RL_TINY = ["--config", str(REPO / "configs" / "rl_tiny.yaml"), "train.max_steps=2", "sampling.max_new_tokens=4"]
POINTS = {"mol": (MOL_TINY, ["adapter", "config.yaml", "inputs.json", "data_stats.json", "molrl_provenance.json",
                             ".molrl_stage"]),
          "rl": (RL_TINY, ["adapter", "config.yaml", "inputs.json", "data_summary.json", "molrl_provenance.json",
                           ".molrl_stage"])}
"""Per training stage, its tiny run's arguments and every file or folder it writes for good."""


@pytest.fixture(scope="module")
def finished_rl(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("whole") / "rl"
    assert main(["rl", *RL_TINY, f"output_dir={out}"]) == 0
    return out


@pytest.mark.parametrize("stage,point", [(stage, point) for stage, (_, points) in POINTS.items() for point in points])
def test_a_training_run_killed_at_each_write_point_reruns_to_the_same_result(stage, point, request, tmp_path, cli_logs):
    finished, (args, _) = request.getfixturevalue(f"finished_{stage}"), POINTS[stage]
    run = tmp_path / "run"
    killed = _cli([stage, *args, f"output_dir={run}"], kill_at=point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert main([stage, *args, f"output_dir={run}"]) == 0  # the rerun, in this process: only the kill needs its own
    assert _left(run) == _left(finished)  # no temporary left, nothing missing
    assert whole_weights(run / "adapter") and _steps(run) == [1, 2]
    for name in POINTS[stage][1][1:]:
        assert _undated((run / name).read_text()) == _undated((finished / name).read_text()).replace(str(finished), str(run))


def _undated(text: str) -> str:
    """A file's text, the date of each step of a provenance record left out (two runs start at other times)."""
    return re.sub(r'"date": "[^"]*"', '"date": ""', text)


@pytest.mark.parametrize("stage", POINTS)
def test_every_file_a_training_run_leaves_is_a_tested_write_point(stage, request):
    finished = request.getfixturevalue(f"finished_{stage}")
    assert set(_left(finished)) - LOGS == set(POINTS[stage][1])


def _eval_args(tmp_path: Path) -> list[str]:
    """``molrl eval``'s arguments for two math problems with their predictions given (no model)."""
    data, preds, config = tmp_path / "mine.jsonl", tmp_path / "p.jsonl", tmp_path / "eval.yaml"
    data.write_text('{"qid": "a", "question": "1+1?", "final": "2"}\n{"qid": "b", "question": "2+2?", "final": "4"}\n')
    preds.write_text('{"id": "a", "completion": "\\\\boxed{2}"}\n{"id": "b", "completion": "\\\\boxed{5}"}\n')
    config.write_text(f"benchmarks: [mine]\ndata:\n  mine:\n    path: {data}\n    spec: {{kind: math, id_field: qid, "
                      f"prompt_field: question, answer_field: final}}\npredictions:\n  mine: {preds}\n")
    return ["eval", "--config", str(config)]


def test_an_eval_killed_at_each_write_point_reruns_to_the_same_result(tmp_path, cli_logs):
    args, straight = _eval_args(tmp_path), tmp_path / "straight"
    assert main([*args, f"output_dir={straight}"]) == 0
    points = [p.name for p in straight.iterdir() if p.is_file() and p.name != ".lock"]
    assert sorted(points) == [".molrl_stage", "config.yaml", "inputs.json", "results.json", "results.md"]
    for point in points:
        run = tmp_path / point
        assert _cli([*args, f"output_dir={run}"], kill_at=point).returncode == -signal.SIGKILL
        assert main([*args, f"output_dir={run}"]) == 0  # the rerun, in this process: only the kill needs its own
        assert _left(run) == _left(straight), point
        assert json.loads((run / "results.json").read_text()) == json.loads((straight / "results.json").read_text())


HOLDER = """
import sys, time
from molrl.records.locks import folder_lock
with folder_lock(sys.argv[1], "use another output"):
    print("held", flush=True)
    time.sleep(120)
"""


@pytest.fixture
def held(tmp_path):
    """An output folder whose lock another process holds, as a running stage does; yields (folder, holder's pid)."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield out, holder.pid
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("stage", ["mol", "rl"])
def test_finding5_a_second_training_run_on_one_output_is_refused(held, stage, cli_logs, caplog):
    out, pid = held
    assert main([stage, *POINTS[stage][0], f"output_dir={out}"]) == 1  # before: both ran, every step logged twice
    (error,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert error.startswith(f"{out} is being written by another run (pid {pid}); wait for it to end")
    assert _left(out) == [".lock"]


def test_finding5_a_second_eval_on_one_output_is_refused(held, tmp_path):
    from molrl.eval.config import EvalConfig
    from molrl.eval.run import run_eval

    out, pid = held
    with pytest.raises(MolrlError, match=rf"{out} is being written by another run \(pid {pid}\)"):
        run_eval(EvalConfig(model="tiny:chatml", benchmarks=["math500"], output_dir=out))
    assert _left(out) == [".lock"]


def test_finding5_a_second_pipeline_on_one_output_is_refused(held):
    from molrl.pipeline import run_pipeline
    from molrl.pipeline.config import PipelineConfig

    out, pid = held
    with pytest.raises(MolrlError, match=rf"{out} is being written by another run \(pid {pid}\)"):
        run_pipeline(PipelineConfig(model="tiny:chatml", output_dir=out, stages=["eval"], eval_models=["base"]))
    assert _left(out) == [".lock"]
