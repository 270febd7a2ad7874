"""Messages a new user meets in the first hour name the right cause and fix, one line each.

Before: a mistyped local model path took about 50 s and some 40 hub-retry warnings to fail; a raw MINT
file given to ``molrl mol`` got ``unknown top-level key 'state'`` twenty times with no hint of
``traces convert --from mint``; ``traces convert --from openai`` on a MINT file wrote an empty file and
exited 0; after ``--strip-example`` MoL still advised ``--strip-example``; the console showed each step's
loss one step late and never the last one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from molrl.cli import main
from molrl.errors import MolrlError

REPO = Path(__file__).resolve().parents[1]
MINT = "traces/mint/gpt-4-0613_F_None__{}.jsonl"

pytestmark = pytest.mark.usefixtures("cli_logs")


# --- a mistyped model path fails at once ------------------------------------------------------------------------------

@pytest.fixture
def no_hub(monkeypatch):
    """The hub unreachable, as on a machine without network; fails the test if transformers is asked."""
    from molrl import models

    monkeypatch.setattr(models, "_hub_unavailable", lambda: "the model hub (huggingface.co) cannot be reached (test)")
    import transformers

    for cls in (transformers.AutoTokenizer, transformers.AutoModelForCausalLM):
        monkeypatch.setattr(cls, "from_pretrained", lambda *a, **k: pytest.fail("transformers was asked"))


def test_finding_15_mistyped_model_folder_beside_its_parent_names_the_near_name(tmp_path, monkeypatch, no_hub):
    from molrl.models import load_model, load_tokenizer

    (tmp_path / "models/smollm2").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    for load in (load_model, load_tokenizer):
        with pytest.raises(MolrlError) as err:
            load("models/smolm2")
        assert str(err.value) == ("model folder models/smolm2 not found (the folder models/ exists; did you mean "
                                  "models/smollm2?); check the path")


@pytest.mark.parametrize("name", ["models/smollm2", "smollm2", "someone/some-model"])
def test_finding_15_a_name_that_is_no_folder_fails_at_once_without_the_hub(tmp_path, monkeypatch, no_hub, name):
    from molrl.models import load_tokenizer

    monkeypatch.chdir(tmp_path)  # no models/ here: a hub name as far as the name goes
    with pytest.raises(MolrlError) as err:
        load_tokenizer(name)
    assert str(err.value) == (f"model {name}: no such local folder, and the model hub (huggingface.co) cannot be "
                              "reached (test); check the path, or download the model where the hub can be reached "
                              "and pass its folder")


def test_finding_15_the_hub_switched_off_is_named(monkeypatch):
    from molrl.models import _hub_unavailable

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert _hub_unavailable() == "the model hub is switched off (HF_HUB_OFFLINE=1)"


def test_finding_15_an_unreachable_hub_is_found_in_seconds(monkeypatch):
    from molrl.models import _hub_unavailable

    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    assert _hub_unavailable().startswith("the model hub (127.0.0.1) cannot be reached (")


def test_finding_15_mistyped_model_on_the_command_line_is_one_line(tmp_path, monkeypatch, capsys, caplog):
    (tmp_path / "models/smollm2").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    traces = tmp_path / "t.jsonl"
    traces.write_text((REPO / "configs/data/mol_tiny_traces.jsonl").read_text())
    code = main(["mol", "model=models/smolm2", f"data.traces=[{traces}]", f"output_dir={tmp_path / 'run'}"])
    seen = capsys.readouterr().err + caplog.text
    assert code == 1 and "model folder models/smolm2 not found" in seen and "did you mean models/smollm2?" in seen
    assert "huggingface.co" not in seen and "Traceback" not in seen


# --- a raw MINT file where traces are expected ------------------------------------------------------------------------

def _raw_mint(shared_data: Path, tmp_path: Path, n: int = 25) -> Path:
    path = tmp_path / "gpt-4-0613_F_None__mbpp.jsonl"
    path.write_text("".join((shared_data / MINT.format("mbpp")).read_text().splitlines(keepends=True)[:n]))
    return path


def test_finding_15_raw_mint_file_given_to_mol_is_one_line_naming_the_converter(shared_data, tmp_path, capsys, caplog):
    path = _raw_mint(shared_data, tmp_path)
    code = main(["mol", "--config", str(REPO / "configs/mol_tiny.yaml"), f"output_dir={tmp_path / 'run'}",
                 f"data.traces=[{path}]", "train.report_to=[none]"])
    seen = capsys.readouterr().err + caplog.text
    assert code == 1
    assert (f"{path}: 25 bad records (lines 1, 2, 3, 4, 5, ...), each: a raw MINT record (top-level keys 'task' and "
            "'state'), not a molrl trace; convert the file first: molrl traces convert --from mint IN OUT") in seen
    assert "unknown top-level key" not in seen
    assert sum("a raw MINT record" in m for m in caplog.messages) == 1  # one line, not one per record


@pytest.mark.parametrize("fmt", ["mint", "tora"])
def test_finding_15_every_raw_format_is_named_by_the_trace_reader(fmt):
    from molrl.traces.schema import RAW_FORMATS, Trace, TraceError

    record = {key: {} for key in RAW_FORMATS[fmt][1]}
    with pytest.raises(TraceError, match=rf"convert the file first: molrl traces convert --from {fmt} IN OUT"):
        Trace.from_dict(record)


def test_finding_15_convert_from_openai_refuses_a_mint_file_naming_mint(shared_data, tmp_path, capsys, caplog):
    path = _raw_mint(shared_data, tmp_path, n=3)
    out = tmp_path / "out.jsonl"
    code = main(["traces", "convert", "--from", "openai", str(path), str(out)])
    seen = capsys.readouterr().err + caplog.text
    assert code == 1 and not out.exists()
    assert (f"{path}: none of its 3 records converted with --from openai; line 1: a raw MINT record (top-level keys "
            "'task' and 'state'), not --from openai; convert it with --from mint") in seen


def test_finding_15_convert_from_mint_refuses_a_trace_file_naming_openai(tmp_path, capsys, caplog):
    out = tmp_path / "out.jsonl"
    code = main(["traces", "convert", "--from", "mint", str(REPO / "configs/data/mol_tiny_traces.jsonl"), str(out)])
    assert code == 1 and not out.exists()
    assert "not a MINT row; convert it with --from openai" in capsys.readouterr().err + caplog.text


# --- the advice after --strip-example ---------------------------------------------------------------------------------

def test_finding_15_after_strip_example_mol_no_longer_advises_it(shared_data, qwen3_tokenizer, tmp_path):
    from molrl.mol.data import load_examples
    from molrl.traces.importers import import_file
    from molrl.traces.schema import write_traces

    result = import_file(shared_data / MINT.format("mbpp"), "mint", strip_example=True)
    path = tmp_path / "stripped.jsonl"
    write_traces(path, (t for _, t in result.traces))
    with pytest.raises(MolrlError) as err:  # even without the example, 150 tokens cut every prompt
        load_examples([str(path)], qwen3_tokenizer, max_length=150)
    assert "--strip-example" not in str(err.value)
    assert str(err.value).endswith("Raise data.max_length (MINT's in-context example is already stripped from these "
                                   "prompts)")


# --- the console shows each step's own loss, the last one included ----------------------------------------------------

def test_finding_15_progress_lines_show_each_steps_own_loss_including_the_last(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), MOLRL_PROGRESS_EVERY="0.000001", OMP_NUM_THREADS="1")
    out = tmp_path / "run"
    run = subprocess.run([sys.executable, "-m", "molrl.cli", "mol", "--config", "configs/mol_tiny.yaml",
                          f"output_dir={out}", "train.max_steps=3", "train.report_to=[none]"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    losses = [f"{r['loss']:.4g}" for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
              if "loss" in r]
    shown = re.findall(r" mol run (\d)/3 \(\d+%\)  loss (\S+)", run.stderr)
    assert len(losses) == 3 and shown
    assert all(loss == losses[int(step) - 1] for step, loss in shown)  # every line: its own step's loss
    assert shown[-1] == ("3", losses[2])  # and the last step's is shown
