"""Inputs checked up front, one line each: adapters, model folders, tokenizer files, traces cut to nothing,
every bad trace line, and a failed eval's output folder."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from molrl.config.blocks import ModelSource
from molrl.errors import DataError, MolrlError

MINT = "traces/mint"
GPT4 = "gpt-4-0613_F_None__{}.jsonl"


# --- an adapter from another base -------------------------------------------------------------------------------

def _save_adapter(tmp_path: Path, template: str, targets: list[str], **model_kwargs) -> Path:
    """A LoRA adapter saved from a tiny model, recording that model's folder as its base."""
    from peft import LoraConfig, get_peft_model

    from molrl.tiny import build_tiny_pair

    model, tok = build_tiny_pair(template, **model_kwargs)
    base = tmp_path / "other_base"
    model.save_pretrained(base)
    tok.save_pretrained(base)
    model.name_or_path = str(base)
    peft = get_peft_model(model, LoraConfig(r=4, target_modules=targets, task_type="CAUSAL_LM"))
    peft.save_pretrained(tmp_path / "adapter")
    return tmp_path / "adapter"


@pytest.fixture
def narrow_adapter(tmp_path) -> Path:
    """An adapter trained on a tiny model of hidden size 32 (tiny:chatml has 64)."""
    return _save_adapter(tmp_path, "chatml", ["q_proj", "v_proj"], hidden_size=32)


def _merge(adapter: Path, tmp_path: Path) -> None:
    from molrl.engines.export import merge_adapter

    merge_adapter(adapter, tmp_path / "merged", base="tiny:chatml")


def _rl_policy(adapter: Path, tmp_path: Path) -> None:
    from molrl.rl.config import RlConfig
    from molrl.rl.policy import build_policy

    cfg = RlConfig()
    cfg.model.adapter = adapter
    build_policy(cfg)


def _eval_generator(adapter: Path, tmp_path: Path) -> None:
    from molrl.eval.config import EvalConfig
    from molrl.engines.builder import open_generator

    open_generator("eval", EvalConfig(model=ModelSource("tiny:chatml", adapter=adapter), device="cpu"), 0, batch_size=1)


@pytest.mark.parametrize("path", [_merge, _rl_policy, _eval_generator], ids=["export", "rl", "eval"])
def test_adapter_from_another_base_is_one_line_naming_its_base(narrow_adapter, tmp_path, path):
    with pytest.raises(MolrlError) as err:
        path(narrow_adapter, tmp_path)
    # 8 tensors: lora_A and lora_B of q_proj and v_proj in 2 layers, all sized for hidden size 32.
    assert str(err.value) == (
        f"{narrow_adapter}: adapter trained on {tmp_path / 'other_base'} does not fit tiny:chatml: its "
        f"model.layers.0.self_attn.q_proj has hidden size 32, tiny:chatml's has 64 (8 adapter tensors differ); "
        f"load it on {tmp_path / 'other_base'}, the base it was trained on"
    )
    assert not (tmp_path / "merged").exists()


def test_adapter_from_another_vocabulary_names_the_vocabulary(tmp_path):
    from molrl.models import load_model

    # tiny:llama3's byte tokenizer has 256 + 5 special tokens, tiny:chatml's 256 + 7: same hidden size, other head.
    adapter = _save_adapter(tmp_path, "llama3", ["q_proj", "lm_head"])
    with pytest.raises(MolrlError, match=r"its lm_head has vocabulary 261, tiny:chatml's has 263; load it on "):
        load_model("tiny:chatml", adapter=adapter)


def test_adapter_of_the_same_shapes_still_loads(tmp_path):
    from molrl.models import load_model

    adapter = _save_adapter(tmp_path, "chatml", ["q_proj", "v_proj"], seed=1)  # another seed, same shapes
    model = load_model("tiny:chatml", adapter=adapter)
    assert sum("lora_A" in name for name, _ in model.named_parameters()) == 4  # q and v in 2 layers


# --- model folders: missing, or without tokenizer files --------------------------------------------------------------

@pytest.mark.parametrize("name", ["./models/Qwen3-8B", "/no/such/models/Qwen3-8B", "~/no-such-molrl-model"])
def test_missing_model_folder_is_one_line_naming_it(name):
    from molrl.models import load_model, load_tokenizer

    message = f"model folder {name} not found; check the path (a hub model is named like Qwen/Qwen3-8B)"
    for load in (load_model, load_tokenizer):
        with pytest.raises(MolrlError) as err:
            load(name)
        assert str(err.value) == message


def test_hub_names_are_not_taken_for_folders():
    from molrl.models import looks_like_path

    assert [looks_like_path(n) for n in ("Qwen/Qwen3-8B", "gpt2", "./m", "/m", "~/m", "runs/mol/model", "m/")] == \
        [False, False, True, True, True, True, True]


@pytest.fixture
def model_folder_without_tokenizer(tmp_path) -> Path:
    """A tiny model saved with its weights and config only."""
    from molrl.tiny import build_tiny_pair

    model, _ = build_tiny_pair("chatml")
    model.save_pretrained(tmp_path / "model")
    return tmp_path / "model"


def test_model_folder_without_tokenizer_files_is_named(model_folder_without_tokenizer):
    from molrl.models import load_tokenizer

    folder = model_folder_without_tokenizer
    with pytest.raises(MolrlError) as err:
        load_tokenizer(str(folder))
    assert str(err.value) == (
        f"{folder}: no tokenizer files in this folder (tokenizer.json, tokenizer_config.json or vocab files); "
        "copy them from the model it was trained from (tokenizer.save_pretrained(FOLDER) writes them)"
    )


def test_tokenizer_far_smaller_than_its_model_is_named(model_folder_without_tokenizer, shared_data):
    from molrl.models import load_tokenizer

    # tokenizer_config.json alone: transformers builds a tokenizer of its 26 added tokens, the model has 263.
    folder = model_folder_without_tokenizer
    (folder / "tokenizer_config.json").write_bytes((shared_data / "qwen3_tokenizer/tokenizer_config.json").read_bytes())
    with pytest.raises(MolrlError, match=rf"^{folder}: its tokenizer has 26 tokens but the model's vocabulary is 263;"):
        load_tokenizer(str(folder))


def test_traces_stats_names_a_folder_without_tokenizer_files(model_folder_without_tokenizer, tmp_path, caplog,
                                                             cli_logs):
    from molrl.cli import main

    traces = tmp_path / "t.jsonl"
    traces.write_text("")
    assert main(["traces", "stats", str(traces), "--tokenizer", str(model_folder_without_tokenizer)]) == 1
    assert f"{model_folder_without_tokenizer}: no tokenizer files in this folder" in caplog.text
    assert "chat_template" not in caplog.text


# --- MINT traces cut inside their prompt ------------------------------------------------------------------------------

def _mint_traces(shared_data: Path, tmp_path: Path, dataset: str, strip_example: bool = False) -> Path:
    from molrl.traces.importers import import_file
    from molrl.traces.schema import write_traces

    result = import_file(shared_data / MINT / GPT4.format(dataset), "mint", strip_example=strip_example)
    assert not result.rejects
    out = tmp_path / f"{dataset}{'_stripped' if strip_example else ''}.jsonl"
    write_traces(out, (t for _, t in result.traces))
    return out


def test_mol_refuses_traces_all_cut_inside_their_prompt(shared_data, qwen3_tokenizer, tmp_path):
    from molrl.mol.data import load_examples

    # Under Qwen3 every gpt-4 MBPP prompt is 734 to 800 tokens, so a cut at 600 leaves nothing to train on.
    path = _mint_traces(shared_data, tmp_path, "mbpp")
    with pytest.raises(MolrlError) as err:
        load_examples([str(path)], qwen3_tokenizer, max_length=600)
    assert str(err.value) == (
        f"{path}: data.max_length=600 cuts all 91 domain traces before their first decision or feedback token, "
        "inside the prompt, leaving nothing to train on; refusing to train. Raise data.max_length, or drop MINT's "
        "in-context example from the prompts: molrl traces convert --from mint --strip-example"
    )


def test_traces_cut_to_nothing_are_counted_with_the_fix(shared_data, qwen3_tokenizer, tmp_path, caplog):
    from molrl.mol.data import load_examples

    path = _mint_traces(shared_data, tmp_path, "math")
    _, stats = load_examples([str(path)], qwen3_tokenizer, max_length=1024)
    assert (stats.traces, stats.cut_to_nothing, stats.cut_feedback) == (100, 11, 89)
    assert (f"{path}: data.max_length=1024 leaves 89 of its 100 domain traces without a feedback token, 11 of them "
            "with nothing to train on (cut inside the prompt). Raise data.max_length, or drop MINT's in-context "
            "example") in caplog.text
    assert "--from tora" not in caplog.text  # the importer is not blamed for what the cut did


def test_stripped_mint_prompts_keep_traces_under_the_same_cut(shared_data, qwen3_tokenizer, tmp_path):
    from molrl.mol.data import load_examples

    path = _mint_traces(shared_data, tmp_path, "mbpp", strip_example=True)
    _, stats = load_examples([str(path)], qwen3_tokenizer, max_length=600)
    assert stats.cut_to_nothing == 0 and stats.decision_tokens > 91 * 100


def test_no_feedback_after_the_cut_names_the_cut_not_the_importer():
    from molrl.mol.data import DataStats, check_feedback

    stats = DataStats(traces=3, cut_feedback=3, max_length=512, files=["t.jsonl"], decision_tokens=40)
    with pytest.raises(MolrlError) as err:
        check_feedback(stats, "mol")
    assert "data.max_length=512 cuts the feedback of 3 of them. Raise data.max_length" in str(err.value)
    assert "--from tora" not in str(err.value)


@pytest.mark.parametrize(("dataset", "dropped"), [("mbpp", 501), ("math", 579), ("humaneval", 575)])
def test_strip_example_drops_mint_in_context_example_and_keeps_the_task(shared_data, qwen3_tokenizer, tmp_path,
                                                                         dataset, dropped):
    from molrl.traces.importers import import_file

    source = shared_data / MINT / GPT4.format(dataset)
    whole = import_file(source, "mint").traces
    stripped = import_file(source, "mint", strip_example=True).traces
    rows = [json.loads(line) for line in source.read_text().splitlines()]
    assert len(whole) == len(stripped) == len(rows)
    drops = set()
    for (_, before), (_, after), row in zip(whole, stripped, rows):
        prompt, short = before.messages[0]["content"], after.messages[0]["content"]
        drops.add(len(qwen3_tokenizer(prompt)["input_ids"]) - len(qwen3_tokenizer(short)["input_ids"]))
        assert short.endswith("\n\n---\n\nTask:\n" + row["task"]["prompt"].strip() + "\n")  # the task stays, last
        assert short.startswith(prompt[: prompt.index("\n\n---\n\n")])  # the instructions stay, first
        assert short.count("Task:\n") == 1 and "\nAssistant:" not in short  # the solved example is gone
        assert after.messages[1:] == before.messages[1:] and after.meta["example_stripped"] is True
    assert drops == {dropped}  # one fixed example per task set: the same count for every trace


def test_strip_example_rejects_a_prompt_without_the_example(tmp_path):
    from molrl.traces.importers import import_file

    row = {"task": {"task_id": 1, "prompt": "Add 2 and 3."},
           "state": {"history": [{"role": "user", "content": "Task:\nAdd 2 and 3."},
                                 {"role": "assistant", "content": "Assistant:\n<solution>5</solution>"}],
                     "success": True}}
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(row) + "\n")
    result = import_file(path, "mint", strip_example=True)
    assert result.traces == []
    assert [str(r) for r in result.rejects] == [
        f"{path}:1: the first user message holds no MINT in-context example (instructions, ---, Task: with a solved "
        "example, ---, Task:); convert it without --strip-example"]


def test_convert_cli_strip_example_writes_prompts_without_the_example(shared_data, tmp_path, cli_logs):
    from molrl.cli import main
    from molrl.traces.schema import read_traces

    out = tmp_path / "out.jsonl"
    assert main(["traces", "convert", "--from", "mint", "--strip-example",
                 str(shared_data / MINT / GPT4.format("humaneval")), str(out)]) == 0
    prompts = [t.messages[0]["content"] for _, t in read_traces(out)]
    assert len(prompts) == 45 and all(p.count("Task:\n") == 1 for p in prompts)


# --- every bad line of a traces file ----------------------------------------------------------------------------------

GOOD = {"messages": [{"role": "user", "content": "Add 2 and 3."},
                     {"role": "assistant", "content": "<execute>print(2+3)</execute>"},
                     {"role": "tool", "content": "Observation:\n5"},
                     {"role": "assistant", "content": "<solution>5</solution>"}]}


def _bad_file(path: Path, n_bad: int) -> Path:
    bad_role = json.loads(json.dumps(GOOD))
    bad_role["messages"][2]["role"] = "observation"
    lines = [json.dumps(GOOD)]
    for i in range(n_bad):
        lines.append("{not json" if i % 2 == 0 else json.dumps(bad_role))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_mol_data_lists_every_bad_line_of_a_traces_file(tmp_path):
    from molrl.mol.data import load_examples
    from molrl.tiny import build_tiny_tokenizer

    path = _bad_file(tmp_path / "traces.jsonl", 2)
    with pytest.raises(DataError) as err:
        load_examples([str(path)], build_tiny_tokenizer("chatml"), max_length=4096)
    assert str(err.value).splitlines() == [
        f"{path}: 2 bad records; fix or delete them (`molrl traces filter IN OUT` keeps the good ones and writes the "
        "rest to OUT.rejects.jsonl):",
        f"  {path}:2: malformed JSON (Expecting property name enclosed in double quotes at column 2); fix or delete "
        "the line",
        f"  {path}:3: message 2 has role 'observation'; expected one of system/user/assistant/tool",
    ]


def test_strict_reader_lists_twenty_bad_lines_then_counts_the_rest(tmp_path):
    from molrl.traces.schema import read_traces

    path = _bad_file(tmp_path / "traces.jsonl", 25)
    with pytest.raises(DataError) as err:
        list(read_traces(path, strict=True))
    lines = str(err.value).splitlines()
    assert lines[0].startswith(f"{path}: 25 bad records;")
    assert [line.split(": ")[0] for line in lines[1:21]] == [f"  {path}:{n}" for n in range(2, 22)]
    assert lines[21:] == ["  ... and 5 more"]


def test_convert_strict_lists_every_bad_line(tmp_path, caplog, cli_logs):
    from molrl.cli import main

    path = _bad_file(tmp_path / "in.jsonl", 3)
    assert main(["traces", "convert", "--from", "openai", str(path), str(tmp_path / "out.jsonl"), "--strict"]) == 1
    for line in (2, 3, 4):
        assert f"{path}:{line}: " in caplog.text
    assert not (tmp_path / "out.jsonl").exists()


# --- a failed eval's output folder ------------------------------------------------------------------------------------

def _eval_cfg(shared_data: Path, out: Path, model: str):
    from molrl.eval.config import EvalConfig

    return EvalConfig(model=model, benchmarks=["math500"], data={"math500": str(shared_data / "math500/test.jsonl")},
                      limit=1, output_dir=out, device="cpu")


def test_failed_eval_removes_the_output_folder_it_created(shared_data, tmp_path):
    from molrl.eval import run_eval

    out = tmp_path / "run"
    with pytest.raises(MolrlError, match="model folder ./no/such/model not found"):
        run_eval(_eval_cfg(shared_data, out, "./no/such/model"))
    assert not out.exists()


def test_failed_eval_keeps_samples_an_earlier_run_wrote(shared_data, tmp_path, caplog):
    from molrl.eval import run_eval

    out = tmp_path / "run"
    (out / "math500").mkdir(parents=True)
    (out / "math500/samples.jsonl").write_text('{"task_id": "x"}\n')
    with caplog.at_level(logging.ERROR), pytest.raises(MolrlError):
        run_eval(_eval_cfg(shared_data, out, "./no/such/model"))
    assert (out / "math500/samples.jsonl").read_text() == '{"task_id": "x"}\n'
