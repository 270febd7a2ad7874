"""A file or folder a stage's config names that is not there is named before anything loads (``molrl.records.input_checks``).

Per stage, each kind of input (model folder, adapter, task or trace file) is given a path that does not exist, in a
process of its own: exit code 1, one line naming the key and the path, and torch never imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from molrl.records.input_checks import check_inputs

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "configs" / "data" / "mol_tiny_traces.jsonl"
RL = ROOT / "configs" / "rl_tiny.yaml"
GONE = "/nonexistent/molrl-input"

CASES = [
    (["mol", f"model={GONE}", f"data.traces=[{TRACES}]"], f"model.path={GONE}: no such model folder"),
    (["mol", "model=tiny:chatml", f"data.traces=[{TRACES},{GONE}.jsonl]"], f"data.traces[1]={GONE}.jsonl: no such file"),
    (["rl", "--config", str(RL), f"model={GONE}"], f"model.path={GONE}: no such model folder"),
    (["rl", "--config", str(RL), f"model.adapter={GONE}"], f"model.adapter={GONE}: no such folder"),
    (["rl", "--config", str(RL), f"data.path={GONE}.jsonl", "data.format=mbpp"], f"data.path={GONE}.jsonl: no such file"),
    (["eval", "--model", GONE, "--benchmarks", "math500", "--data", f"math500={TRACES}"],
     f"model.path={GONE}: no such model folder"),
    (["eval", "--model", "tiny:chatml", "--adapter", GONE, "--benchmarks", "math500", "--data", f"math500={TRACES}"],
     f"model.adapter={GONE}: no such folder"),
    (["eval", "--model", "tiny:chatml", "--benchmarks", "math500", "--data", f"math500={GONE}.jsonl"],
     f"data.math500.path={GONE}.jsonl: no such file"),
    (["collect", "--model", GONE, "--tasks", str(TRACES), "--format", "jsonl"], f"model.path={GONE}: no such model folder"),
    (["collect", "--model", "tiny:chatml", "--tasks", f"{GONE}.jsonl", "--format", "jsonl"],
     f"data.path={GONE}.jsonl: no such file"),
    (["pipeline", "--config", str(ROOT / "configs" / "pipeline_tiny.yaml"), f"model={GONE}"],
     f"model={GONE}: no such model folder"),
    (["pipeline", "--config", str(ROOT / "configs" / "pipeline_tiny.yaml"), f"traces=[{GONE}.jsonl]"],
     f"traces[0]={GONE}.jsonl: no such file"),
]
"""(command line, what its one error line says), each naming the key and the missing path."""

RUN = """
import json, logging, sys
from molrl.cli import main
out = []
for args in json.loads(sys.argv[1]):
    handler = logging.Handler()
    lines = []
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger("molrl").addHandler(handler)
    out.append({"rc": main([*args, "output_dir=" + sys.argv[2] + "/" + args[0]]), "lines": lines})
    logging.getLogger("molrl").removeHandler(handler)
print(json.dumps({"torch": "torch" in sys.modules, "runs": out}))
"""


def test_a_missing_input_of_every_stage_is_named_before_torch_is_imported(tmp_path):
    done = subprocess.run([sys.executable, "-c", RUN, json.dumps([args for args, _ in CASES]), str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.splitlines()[-1])
    for (args, says), run in zip(CASES, result["runs"]):
        errors = [line for line in run["lines"] if says in line]
        assert run["rc"] == 1 and len(errors) == 1, (args, run)
        assert "check the path" in errors[0], errors
    assert result["torch"] is False
    assert {args[0] for args, _ in CASES} == {"mol", "rl", "eval", "collect", "pipeline"}
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name", ["Qwen/Qwen3-8B", "gpt2", "tiny:chatml", "tiny:llama3"])
def test_a_hub_name_or_a_tiny_model_passes_to_the_loader(tmp_path, monkeypatch, name):
    from molrl.mol.config import MolConfig

    monkeypatch.chdir(tmp_path)
    traces = tmp_path / "t.jsonl"
    traces.write_text("")
    check_inputs("mol", MolConfig(model=name, data={"traces": [traces]}))


@pytest.mark.parametrize("name", ["./m", "/m", "~/molrl-no-such-model", "runs/mol/model", "m/"])
def test_a_path_shaped_model_that_is_not_there_is_refused(tmp_path, monkeypatch, name):
    from molrl.errors import ConfigError
    from molrl.eval.config import EvalConfig

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=f"^model.path={name}: no such model folder; check the path"):
        check_inputs("eval", EvalConfig(model=name, benchmarks=["x"]))
