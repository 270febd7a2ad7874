"""What a model trained on travels inside its own folder (``molrl.records.provenance``): every kind of weights folder molrl
writes carries the record, and eval refuses, by content, the problems it trained on, wherever the folder went."""

from __future__ import annotations

import gzip
import json
import logging
import shutil
import sys
import types
from pathlib import Path

import pytest

from molrl.cli import main
from molrl.config.blocks import ModelSource
from molrl.errors import MolrlError
from molrl.eval import EvalConfig, run_eval
from molrl.records.fingerprint import fingerprint
from molrl.engines.sampling import SamplingConfig
from molrl.records.provenance import ARTIFACTS, LEGACY, PROVENANCE, check_scored, read_provenance
from molrl.tasks import load_tasks
from molrl.tasks.index import task_content_key

REPO = Path(__file__).resolve().parents[1]
MBPP, HUMANEVAL = "mbpp/mbpp.jsonl", "humaneval/HumanEval.jsonl.gz"
MOL = ["--config", str(REPO / "configs" / "mol_tiny.yaml"), "train.max_steps=2", "train.save_steps=1",
       "train.report_to=[none]"]
REFUSED = "the model was trained on 3 of the problems to score (mbpp: 2 of 3, humaneval: 1 of 3)"


def _openai_traces(shared_data: Path, path: Path) -> Path:
    """OpenAI-format traces of MBPP test tasks 11 and 12 (as DeepSeek's prompt shows them) and HumanEval/0: no
    benchmark, split or id anywhere, only the problems' text."""
    rows = [json.loads(line) for line in (shared_data / MBPP).read_text().splitlines()][10:12]
    with gzip.open(shared_data / HUMANEVAL, "rt") as handle:
        humaneval = json.loads(handle.readline())
    problems = [r["text"] + "\nYour code should pass these tests:\n\n" + "\n".join(r["test_list"]) for r in rows]
    problems.append(humaneval["prompt"])
    records = [{"messages": [{"role": "user", "content": problem},
                             {"role": "assistant", "content": "<execute>\nprint(1)\n</execute>"},
                             {"role": "tool", "content": "Observation:\n1"},
                             {"role": "assistant", "content": "<solution>\npass\n</solution>"}]}
               for problem in problems]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def made(tmp_path_factory, shared_data) -> dict[str, Path]:
    """A MoL run on imported traces, its export, an RL run from it (merge_new) and a GGUF conversion: every kind of
    weights folder molrl writes."""
    root = tmp_path_factory.mktemp("provenance")
    raw = _openai_traces(shared_data, root / "raw.jsonl")
    assert main(["traces", "convert", "--from", "openai", str(raw), str(root / "traces.jsonl")]) == 0
    mol = root / "mol"
    assert main(["mol", *MOL, f"data.traces=[{root / 'traces.jsonl'}]", f"output_dir={mol}"]) == 0
    assert main(["export", "--merge", "--adapter", str(mol / "adapter"), "--out", str(root / "merged")]) == 0
    full = root / "mol_full"  # MoL again, fully fine-tuned, from the merged export
    assert main(["mol", *MOL, "train.max_steps=1", f"model={root / 'merged'}", "lora.enabled=false",
                 f"data.traces=[{REPO / 'configs' / 'data' / 'mol_tiny_traces.jsonl'}]", f"output_dir={full}"]) == 0
    rl = root / "rl"
    assert main(["rl", "--config", str(REPO / "configs" / "rl_tiny.yaml"), "train.max_steps=1", "sampling.n=2",
                 "train.micro_batch_size=2", "sampling.max_new_tokens=4", f"model.adapter={mol / 'adapter'}",
                 "model.adapter_mode=merge_new", "train.report_to=[none]", f"output_dir={rl}"]) == 0
    return {"root": root, "mol": mol, "rl": rl, "merged": root / "merged", "full": full, "gguf": _gguf_conversion(root)}


def _gguf_conversion(root: Path) -> Path:
    """``molrl export --gguf``'s folder, transformers' GGUF reader standing in for a tiny model (no gguf package)."""
    return _converted(root / "model.Q4_1.gguf", root / "from_gguf")


def _converted(gguf: Path, out: Path) -> Path:
    """``out``: a GGUF file written at ``gguf`` and converted there by ``convert_gguf`` (the tiny model standing in)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from molrl.engines.export import convert_gguf
    from molrl.tiny import build_tiny_pair

    gguf.write_bytes(b"GGUF" + bytes(range(200)))
    model, tok = build_tiny_pair("chatml")
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "gguf", types.ModuleType("gguf"))
        patch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: model)
        patch.setattr(AutoTokenizer, "from_pretrained", lambda *a, **k: tok)
        return convert_gguf(gguf, out)


MAKERS = {
    "adapter": lambda m: [m["mol"] / "adapter", m["rl"] / "adapter"],
    "checkpoint": lambda m: [m["mol"] / "checkpoints" / "checkpoint-1", m["rl"] / "checkpoints" / "checkpoint-1"],
    "model": lambda m: [m["rl"] / "model", m["full"] / "model"],
    "merged": lambda m: [m["merged"]],
    "gguf": lambda m: [m["gguf"]],
}
"""Per kind of weights folder (``ARTIFACTS``), where the fixture's runs left one."""


def _eval(shared_data: Path, out: Path, model: str = "tiny:chatml", adapter: Path | None = None, **kw) -> Path:
    return run_eval(EvalConfig(model=ModelSource(model, adapter=adapter), benchmarks=["mbpp", "humaneval"],
                               data={"mbpp": str(shared_data / MBPP), "humaneval": str(shared_data / HUMANEVAL)},
                               limit=3, output_dir=out, **kw))


def _refused(shared_data: Path, tmp_path: Path, **kw) -> str:
    with pytest.raises(MolrlError) as err:
        _eval(shared_data, tmp_path / "eval", **kw)
    assert not (tmp_path / "eval").exists()  # refused before any work
    return str(err.value)


def test_every_artifact_kind_is_made_by_the_fixture():
    assert set(MAKERS) == set(ARTIFACTS)


@pytest.mark.parametrize("kind", sorted(ARTIFACTS))
def test_every_artifact_kind_carries_its_record_and_eval_refuses_what_it_trained_on(kind, made, shared_data,
                                                                                    tmp_path, caplog):
    for folder in MAKERS[kind](made):
        assert (folder / PROVENANCE).is_file(), folder
        record = read_provenance(folder)
        if kind == "gguf":  # a conversion trains on nothing: eval scores it, saying its training data is unknown
            assert record.base["fingerprint"] == fingerprint(made["root"] / "model.Q4_1.gguf") and not record.trained()
            with caplog.at_level(logging.WARNING):
                check_scored(str(folder), None, {}, False, "allow_trained_overlap")
            assert f"{folder}: its training data is unknown" in caplog.text
            continue
        as_model = kind in ("model", "merged")
        error = _refused(shared_data, tmp_path, **({"model": str(folder)} if as_model else {"adapter": folder}))
        assert REFUSED in error and error.startswith(f"{folder / PROVENANCE}: ")


def test_mol_on_imported_traces_records_their_problems_by_content(made, shared_data):
    record = read_provenance(made["mol"] / "adapter")
    mbpp = {t.id: t for t in load_tasks(shared_data / MBPP, "mbpp", split="all")}
    humaneval = load_tasks(shared_data / HUMANEVAL, "humaneval")[0]
    want = {task_content_key(mbpp["11"]), task_content_key(mbpp["12"]), task_content_key(humaneval)}
    assert set(record.keys) == want  # before: trained_on.json was {"benchmarks": {}}, and eval scored them
    assert [step["stage"] for step in record.lineage] == ["mol"] and record.base == {"model": "tiny:chatml"}


def test_eval_refuses_a_checkpoint_of_the_run(made, shared_data, tmp_path):
    checkpoint = made["mol"] / "checkpoints" / "checkpoint-2"
    assert REFUSED in _refused(shared_data, tmp_path, adapter=checkpoint)  # before: scored, rc 0


def test_eval_refuses_a_merged_export(made, shared_data, tmp_path):
    record = read_provenance(made["merged"])
    assert [step["stage"] for step in record.lineage] == ["mol", "export"]
    assert REFUSED in _refused(shared_data, tmp_path, model=str(made["merged"]))  # before: scored, rc 0


def test_eval_refuses_a_copied_adapter(made, shared_data, tmp_path):
    copy = Path(shutil.copytree(made["mol"] / "adapter", tmp_path / "elsewhere" / "copy"))
    assert REFUSED in _refused(shared_data, tmp_path, adapter=copy)  # before: scored, rc 0


def test_eval_refuses_the_run_folder(made, shared_data, tmp_path):
    assert REFUSED in _refused(shared_data, tmp_path, adapter=made["mol"])


def test_rl_from_mol_inherits_the_mol_record_and_appends(made):
    mol, rl = read_provenance(made["mol"] / "adapter"), read_provenance(made["rl"] / "adapter")
    assert [step["stage"] for step in rl.lineage] == ["mol", "rl"] and rl.lineage[0] == mol.lineage[0]
    assert set(mol.keys) < set(rl.keys)  # the toy tasks it trained on are added
    assert read_provenance(made["rl"] / "model").to_json() == rl.to_json()


def test_mol_from_a_merged_export_inherits_its_record(made):
    full, merged = read_provenance(made["full"] / "model"), read_provenance(made["merged"])
    assert [step["stage"] for step in full.lineage] == ["mol", "export", "mol"]
    assert set(merged.keys) < set(full.keys) and full.base == merged.base == {"model": "tiny:chatml"}


def test_allow_trained_overlap_scores_with_a_line(made, shared_data, tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        check_scored("tiny:chatml", made["mol"] / "adapter", {"mbpp": load_tasks(shared_data / MBPP, "mbpp", split="test")[:3]},
                     True, "allow_trained_overlap")
    assert "allow_trained_overlap=true: scoring 2 problems the model was trained on (mbpp: 2)" in caplog.text


def test_a_model_without_a_record_is_scored_with_one_line(tmp_path, shared_data, caplog):
    from molrl.tiny import build_tiny_pair

    model, tok = build_tiny_pair("chatml")
    model.save_pretrained(tmp_path / "plain")
    tok.save_pretrained(tmp_path / "plain")
    with caplog.at_level(logging.WARNING):
        out = run_eval(EvalConfig(model=str(tmp_path / "plain"), benchmarks=["math500"], limit=1,
                                  data={"math500": str(shared_data / "math500/test.jsonl")},
                                  sampling=SamplingConfig(max_new_tokens=2), output_dir=tmp_path / "eval"))
    assert json.loads((out / "results.json").read_text())["benchmarks"]["math500"]["problems"] == 1
    lines = [r.getMessage() for r in caplog.records if "training data is unknown" in r.getMessage()]
    assert lines == [f"{tmp_path / 'plain'}: its training data is unknown (no {PROVENANCE} in it): problems it was "
                     "trained on would be scored like any other"]


def test_a_run_made_before_records_were_inside_is_still_refused_by_id(tmp_path, shared_data):
    run = tmp_path / "old"
    (run / "adapter").mkdir(parents=True)
    (run / LEGACY).write_text(json.dumps({"benchmarks": {"mbpp": {"test": ["11", "12"]}}}))
    error = _refused(shared_data, tmp_path, adapter=run / "adapter")
    assert "trained on 2 of the problems to score (mbpp: 2 of 3)" in error and error.startswith(str(run / LEGACY))


def test_mol_on_wrapped_problems_is_refused_by_eval_as_traces_filter_leaves_them_out(shared_data, tmp_path,
                                                                                     cli_logs, caplog):
    """Four wrappings of HumanEval/0, none known to molrl: ``traces filter --exclude-benchmarks`` leaves all four out,
    and eval refuses the adapter MoL trained on them (before: rc 0, HumanEval/0 scored)."""
    with gzip.open(shared_data / HUMANEVAL, "rt") as handle:
        prompt = json.loads(handle.readline())["prompt"]
    wrapped = ["Solve this task.\n" + prompt, prompt + "\nExplain your answer.", "## Task\n\n" + prompt,
               "Here is the problem:\n```python\n" + prompt + "\n```\nGood luck."]
    rows = [{"messages": [{"role": "user", "content": text},
                          {"role": "assistant", "content": "<execute>\nprint(1)\n</execute>"},
                          {"role": "tool", "content": "Observation:\n1"},
                          {"role": "assistant", "content": "<solution>\npass\n</solution>"}]} for text in wrapped]
    (tmp_path / "raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    traces = tmp_path / "traces.jsonl"
    assert main(["traces", "convert", "--from", "openai", str(tmp_path / "raw.jsonl"), str(traces)]) == 0
    with caplog.at_level(logging.INFO):
        assert main(["traces", "filter", str(traces), str(tmp_path / "kept.jsonl"), "--exclude-benchmarks",
                     f"humaneval={shared_data / HUMANEVAL}"]) == 0
    assert "left out 4 of 4 traces whose task is one eval scores (humaneval/test 4); 0 remain" in caplog.text
    assert main(["mol", *MOL, "train.max_steps=1", f"data.traces=[{traces}]", f"output_dir={tmp_path / 'mol'}"]) == 0
    caplog.clear()
    assert main(["eval", "--adapter", str(tmp_path / "mol" / "adapter"), "--model", "tiny:chatml", "--benchmarks",
                 "humaneval", "--data", f"humaneval={shared_data / HUMANEVAL}", "--limit", "1",
                 "--out", str(tmp_path / "eval")]) == 1
    assert "the model was trained on 1 of the problems to score (humaneval: 1 of 1)" in caplog.text
    assert not (tmp_path / "eval").exists()


def test_every_run_folder_names_the_stage_that_wrote_it(made, tmp_path):
    from molrl.records.locks import folder_stages
    from molrl.records.writes import STAGE

    stages = {made["mol"]: "mol", made["full"]: "mol", made["rl"]: "rl", made["merged"]: "export"}
    assert {folder: (folder / STAGE).read_text().strip() for folder in stages} == stages
    for i, (folder, stage) in enumerate(stages.items()):  # and without that file, by what the run left (MADE_BEFORE)
        before = Path(shutil.copytree(folder, tmp_path / str(i)))
        (before / STAGE).unlink()
        assert list(folder_stages(before)) == [stage]


# --- the record through a checkpoint, a tar round trip and export --gguf --------------------------------------------

def _cut_checkpoint(made: dict[str, Path], tmp_path: Path) -> list[tuple[Path, bool]]:
    """The last checkpoint of a copy of the MoL run, its record cut off as a kill between the trainer's state file and
    the record leaves it, after the run is re-run."""
    run = Path(shutil.copytree(made["mol"], tmp_path / "mol"))
    checkpoint = run / "checkpoints" / "checkpoint-2"
    (checkpoint / PROVENANCE).unlink()
    assert main(["mol", *MOL, f"data.traces=[{made['root'] / 'traces.jsonl'}]", f"output_dir={run}"]) == 0  # finished
    return [(checkpoint, False)]  # before: no record in it, and eval scored the problems it trained on


def _tar_round_trip(made: dict[str, Path], tmp_path: Path) -> list[tuple[Path, bool]]:
    """Every kind of weights folder packed with tar and unpacked elsewhere."""
    import tarfile

    unpacked = []
    for kind in sorted(ARTIFACTS):
        for i, folder in enumerate(MAKERS[kind](made)):
            archive = tmp_path / f"{kind}-{i}.tar.gz"
            with tarfile.open(archive, "w:gz") as tar:
                tar.add(folder, arcname=folder.name)
            with tarfile.open(archive) as tar:
                tar.extractall(tmp_path / f"{kind}-{i}", filter="data")
            copy = tmp_path / f"{kind}-{i}" / folder.name
            assert read_provenance(copy).to_json() == read_provenance(folder).to_json()
            if kind != "gguf":  # a conversion of a GGUF that came with no record trained on nothing molrl knows
                unpacked.append((copy, kind in ("model", "merged")))
    return unpacked


def _gguf_beside_its_record(made: dict[str, Path], tmp_path: Path) -> list[tuple[Path, bool]]:
    """A GGUF file of the merged export, written into its folder as llama.cpp's converter does, converted back."""
    from molrl.records.provenance import config_fingerprint

    merged = Path(shutil.copytree(made["merged"], tmp_path / "merged"))
    gguf = merged / "merged-F16.gguf"
    out = _converted(gguf, tmp_path / "from_gguf")
    record = read_provenance(out)
    assert [step["stage"] for step in record.lineage] == ["mol", "export", "gguf"]  # before: ["gguf"] alone
    assert record.lineage[-1]["config"] == config_fingerprint({"gguf": fingerprint(gguf), "dtype": "float32"})
    return [(out, True)]


ROUTES = {"a checkpoint whose record a kill cut off": _cut_checkpoint, "a tar round trip": _tar_round_trip,
          "export --gguf of a GGUF beside its record": _gguf_beside_its_record}


@pytest.mark.parametrize("route", ROUTES)
def test_the_record_survives_and_eval_refuses_what_the_weights_trained_on(route, made, shared_data, tmp_path,
                                                                          cli_logs):
    for folder, as_model in ROUTES[route](made, tmp_path):
        error = _refused(shared_data, tmp_path, **({"model": str(folder)} if as_model else {"adapter": folder}))
        assert REFUSED in error and error.startswith(f"{folder}"), folder
