"""Splits are kept apart: every task knows its benchmark split, training takes the train split, eval refuses to
score what an adapter trained on."""

from __future__ import annotations

import json
import logging

import pytest

from molrl.config.blocks import ModelSource
from molrl.errors import MolrlError
from molrl.eval import EvalConfig, run_eval
from molrl.rl.config import TaskSource
from molrl.tasks.source import load_task_source
from molrl.sandbox import SandboxConfig
from molrl.tasks import Task, load_tasks
from molrl.records.provenance import PROVENANCE, made, read_provenance, trained_on, trained_overlap, write_provenance
from molrl.tasks.splits import SPLITS, benchmark_split, mbpp_split, select_split

FILES = {"mbpp": "mbpp/mbpp.jsonl", "humaneval": "humaneval/HumanEval.jsonl.gz", "math500": "math500/test.jsonl",
         "aime": "aime24/test.jsonl"}


@pytest.mark.parametrize("fmt", list(FILES))
def test_every_benchmark_task_knows_its_split(shared_data, fmt):
    tasks = load_tasks(shared_data / FILES[fmt], fmt)
    assert all(t.split in SPLITS and t.split == benchmark_split(t.meta["source"], t.id) for t in tasks)
    assert all(Task.from_json(t.to_json()).split == t.split for t in tasks[:5])  # it travels with RL's rows


def test_mbpp_split_is_the_papers(shared_data):
    counts = {s: 0 for s in SPLITS}
    for t in load_tasks(shared_data / FILES["mbpp"], "mbpp"):
        counts[t.split] += 1
    assert counts == {"prompt": 10, "test": 500, "validation": 90, "train": 374}
    assert [mbpp_split(i) for i in (1, 10, 11, 510, 511, 600, 601, 974)] == [
        "prompt", "prompt", "test", "test", "validation", "validation", "train", "train"]
    deepseek = load_tasks(shared_data / "mbpp/mbpp_test_deepseek.jsonl", "mbpp")
    assert {t.split for t in deepseek} == {"test"}


def test_finding2_rl_on_the_mbpp_file_loads_only_its_train_split(shared_data, caplog):
    with caplog.at_level(logging.WARNING):
        tasks = load_task_source(TaskSource(path=shared_data / FILES["mbpp"], format="mbpp"), "data")
    assert len(tasks) == 374 and {t.split for t in tasks} == {"train"}  # 974 before, the 500 test tasks among them
    assert "eval test split" not in caplog.text
    tasks = load_task_source(TaskSource(path=shared_data / FILES["mbpp"], format="mbpp", split="all"), "data")
    assert len(tasks) == 974
    assert "data: 500 of the 974 tasks are in an eval test split (500 of mbpp's test tasks)" in caplog.text


def test_a_test_only_benchmark_gives_no_training_task_unless_asked(shared_data):
    with pytest.raises(MolrlError, match=r"HumanEval.jsonl.gz: no task in the train split \(its splits: test\); "
                                         r"set data.split to one of them, or data.split=all"):
        load_task_source(TaskSource(path=shared_data / FILES["humaneval"], format="humaneval"), "data")
    # RL's eval hook scores a test split unless told otherwise: all of HumanEval, MBPP's tasks 11-510
    assert len(load_task_source(TaskSource(path=shared_data / FILES["humaneval"], format="humaneval"), "eval.tasks")) == 164
    held_out = load_task_source(TaskSource(path=shared_data / FILES["mbpp"], format="mbpp"), "eval.tasks")
    assert len(held_out) == 500 and {t.split for t in held_out} == {"test"}


def test_a_file_without_splits_is_taken_whole(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps({"id": i, "prompt": "p", "answer": "1"}) + "\n" for i in range(3)))
    assert len(load_task_source(TaskSource(path=path, format="jsonl"), "data")) == 3
    with pytest.raises(MolrlError, match="its tasks have no benchmark split, so data.split=test selects nothing"):
        load_task_source(TaskSource(path=path, format="jsonl", split="test"), "data")


def test_split_is_chosen_before_the_limit(shared_data):
    tasks = load_task_source(TaskSource(path=shared_data / FILES["mbpp"], format="mbpp", limit=3), "data")
    assert [t.id for t in tasks] == ["601", "602", "603"]


def test_unknown_split_is_one_line():
    with pytest.raises(MolrlError, match="data.split='dev': unknown split; expected one of train, validation"):
        select_split([Task(id="1", prompt="p", kind="math", answer="1", split="train")], "dev", "f", "data.split")


def _trained(folder, tasks, stage="mol", parents=()):
    """Write the record of weights in ``folder`` trained on ``tasks``, as a run of ``stage`` writes it."""
    write_provenance(folder, made(stage, "cfg", "tiny:chatml", parents, *trained_on(tasks)))


def test_trained_on_is_merged_along_a_chain_of_runs(tmp_path, shared_data):
    mbpp = load_tasks(shared_data / FILES["mbpp"], "mbpp")
    _trained(tmp_path / "mol" / "adapter", [t for t in mbpp if t.id in ("11", "601")])
    _trained(tmp_path / "rl" / "adapter", [t for t in mbpp if t.id == "602"], "rl",
             [read_provenance(tmp_path / "mol")])
    record = read_provenance(tmp_path / "rl")
    assert [(t.split, t.id) for t in record.tasks] == [("test", "11"), ("train", "601"), ("train", "602")]
    assert [step["stage"] for step in record.lineage] == ["mol", "rl"]
    assert trained_overlap(record, {"mbpp": mbpp}) == {"mbpp": 3}


def _eval_cfg(shared_data, tmp_path, adapter, **kw):
    predictions = tmp_path / "preds.jsonl"
    predictions.write_text("".join(json.dumps({"id": str(i), "completion": "x"}) + "\n" for i in range(11, 13)))
    return EvalConfig(model=ModelSource("tiny:chatml", adapter=adapter), benchmarks=["mbpp"],
                      data={"mbpp": str(shared_data / FILES["mbpp"])}, predictions={"mbpp": str(predictions)},
                      limit=2, output_dir=tmp_path / "eval", sandbox=SandboxConfig(workers=1), **kw)


def test_finding2_eval_refuses_to_score_what_the_adapter_trained_on(tmp_path, shared_data):
    run = tmp_path / "rl"
    _trained(run / "adapter", load_tasks(shared_data / FILES["mbpp"], "mbpp", split="all"))
    with pytest.raises(MolrlError) as err:
        run_eval(_eval_cfg(shared_data, tmp_path, run / "adapter"))
    assert str(err.value) == (f"{run / 'adapter' / PROVENANCE}: the model was trained on 2 of the problems to score "
                              "(mbpp: 2 of 2); score other problems, or set allow_trained_overlap=true to score them "
                              "anyway")
    assert not (tmp_path / "eval").exists()  # refused before any work
    out = run_eval(_eval_cfg(shared_data, tmp_path, run / "adapter", allow_trained_overlap=True))
    assert json.loads((out / "results.json").read_text())["benchmarks"]["mbpp"]["problems"] == 2


def test_eval_scores_an_adapter_trained_on_the_train_split(tmp_path, shared_data):
    run = tmp_path / "rl"
    _trained(run / "adapter", load_tasks(shared_data / FILES["mbpp"], "mbpp", split="train"))
    out = run_eval(_eval_cfg(shared_data, tmp_path, run / "adapter"))
    assert json.loads((out / "results.json").read_text())["benchmarks"]["mbpp"]["problems"] == 2


def test_mol_records_the_benchmark_tasks_its_traces_were_collected_on(tmp_path):
    from molrl.mol.data import load_examples
    from molrl.tiny import build_tiny_tokenizer

    def trace(task_id, split, kind="domain"):
        meta = {"kind": kind, "task_id": task_id, "benchmark": "mbpp", "task_split": split}
        return {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                             {"role": "tool", "content": "f"}, {"role": "assistant", "content": "b"}], "meta": meta}

    path = tmp_path / "traces.jsonl"
    rows = [trace("11", "test"), trace("11", "test"), trace("601", "train"), trace("12", "test", kind="general")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _, stats = load_examples([str(path)], build_tiny_tokenizer("chatml"), 256)
    assert [e[:3] for e in stats.benchmark_tasks] == [("mbpp", "test", "11"), ("mbpp", "train", "601")]  # general: not tasks
    from molrl.mol.config import MolConfig
    from molrl.mol.run import provenance

    write_provenance(tmp_path / "mol", provenance(MolConfig(), stats))
    assert [(t.split, t.id) for t in read_provenance(tmp_path / "mol").tasks] == [("test", "11"), ("train", "601")]


def _trace(meta: dict):
    from molrl.traces.schema import Trace

    return Trace([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                  {"role": "tool", "content": "f"}, {"role": "assistant", "content": "b"}], meta)


TRACES = [  # (meta, the benchmark whose test task the trace is on, or None)
    ({"source": "mint", "dataset": "mbpp", "task_id": 0}, "mbpp"),  # MINT's MBPP problems: MBPP test tasks
    ({"source": "mint", "dataset": "humaneval", "task_id": 3}, "humaneval"),
    ({"source": "mint", "dataset": "math", "task_id": 5}, None),  # only the MATH-500 file tells which are MATH-500's
    ({"source": "mint", "dataset": "mbpp", "kind": "general"}, None),  # replay data trains no task
    ({"benchmark_task": {"benchmark": "math500", "split": "test", "id": "x", "key": "k"}}, "math500"),  # tagged
    ({"benchmark_task": {"benchmark": "mbpp", "split": "train", "id": "601", "key": "k"}}, None),
    ({"source": "mint", "dataset": "mbpp", "benchmark_task": {"benchmark": "mbpp", "split": "validation", "id": "520",
                                                              "key": "k"}}, None),  # the tag decides, not the source
    ({"benchmark": "mbpp", "task_id": "11", "task_split": "test"}, "mbpp"),  # molrl collect's own fields
    ({"source": "openai"}, None),
]


@pytest.mark.parametrize("meta, benchmark", TRACES)
def test_a_trace_is_on_a_test_task_by_its_tag_else_by_its_sources_known_set(meta, benchmark):
    from molrl.tasks.eval_overlap import trace_test_overlap

    assert trace_test_overlap([_trace(meta)]) == ({benchmark: 1} if benchmark else {})


def test_mol_says_at_start_how_many_traces_are_on_test_tasks(tmp_path, caplog):
    from molrl.mol.data import load_examples
    from molrl.tiny import build_tiny_tokenizer

    path = tmp_path / "traces.jsonl"
    path.write_text("".join(json.dumps(_trace(meta).to_dict()) + "\n" for meta, _ in TRACES))
    with caplog.at_level(logging.WARNING, logger="molrl.mol.data"):
        load_examples([str(path)], build_tiny_tokenizer("chatml"), 256)
    assert [r.getMessage() for r in caplog.records] == [
        "data.traces: 4 of the 9 traces are on tasks of an eval test split (1 on humaneval's, 1 on math500's, 2 on "
        "mbpp's test tasks); molrl eval will refuse to score them with an adapter trained on them; leave them out "
        "with data.exclude_benchmarks={humaneval: FILE, math500: FILE, mbpp: FILE} (the files eval scores) or "
        "`molrl traces filter --exclude-benchmarks`"]
    caplog.clear()
    path.write_text(json.dumps(_trace({"source": "openai"}).to_dict()) + "\n")
    with caplog.at_level(logging.WARNING, logger="molrl.mol.data"):
        load_examples([str(path)], build_tiny_tokenizer("chatml"), 256)
    assert caplog.records == []
