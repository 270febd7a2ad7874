"""GRPO prompts from the real benchmark files, rendered with the real Qwen3 chat template."""

from __future__ import annotations

import json

import pytest

from grpo_helpers import save_tiny_model, toy_config
from molrl.rl.config import TaskSource
from molrl.rl.data import build_prompt_rows
from molrl.tasks.prompts import strip_added_bos
from molrl.tasks.source import load_task_source
from molrl.tasks import Task

SOURCES = {
    "humaneval": "humaneval/HumanEval.jsonl.gz",
    "mbpp": "mbpp/mbpp.jsonl",
    "math500": "math500/test.jsonl",
}


@pytest.mark.parametrize("fmt", sorted(SOURCES))
def test_benchmark_tasks_become_rendered_prompts(shared_data, qwen3_tokenizer, fmt):
    tasks = load_task_source(TaskSource(path=shared_data / SOURCES[fmt], format=fmt, limit=5), "train")
    rows, summary = build_prompt_rows(tasks, qwen3_tokenizer, enable_thinking=False, max_prompt_length=4096)
    assert summary.kept == 5 and len(rows) == 5
    first = rows[0]["prompt"]
    assert first.startswith("<|im_start|>user\n") and first.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert Task.from_json(rows[0]["task_json"]).id == tasks[0].id


def test_thinking_on_leaves_the_think_block_to_the_model(shared_data, qwen3_tokenizer):
    tasks = load_task_source(TaskSource(path=shared_data / SOURCES["math500"], format="math500", limit=1), "train")
    rows, _ = build_prompt_rows(tasks, qwen3_tokenizer, enable_thinking=True, max_prompt_length=4096)
    assert rows[0]["prompt"].endswith("<|im_start|>assistant\n")


def test_a_bos_the_tokenizer_adds_is_not_doubled():
    class AddsBos:
        bos_token, bos_token_id = "<s>", 1

        def __call__(self, text):
            return {"input_ids": [1, 2]}

    assert strip_added_bos(AddsBos(), "<s>hello") == "hello"
    AddsBos.__call__ = lambda self, text: {"input_ids": [2]}
    assert strip_added_bos(AddsBos(), "<s>hello") == "<s>hello"


def test_math_tasks_train_without_a_sandbox(tmp_path):
    tasks = tmp_path / "math.jsonl"
    tasks.write_text("\n".join(json.dumps({"id": f"m{i}", "prompt": f"What is {i}+{i}?", "answer": str(2 * i)})
                               for i in range(4)) + "\n")
    base = save_tiny_model(tmp_path / "base")
    from molrl.rl.run import run_rl

    out = run_rl(toy_config(tmp_path / "run", base, max_steps=1, data=TaskSource(path=tasks, format="jsonl")))
    rows = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and all(r["reward_stage"].startswith("math/") for r in rows)
    assert all(r["rewards"]["correctness"] in (0.0, 1.0) for r in rows)


@pytest.mark.parametrize("name", ["rl_tiny", "rl_qwen3_4b", "rl_qwen3_8b"])
def test_shipped_configs_load(name):
    from pathlib import Path

    from molrl.config import load_config
    from molrl.rl.config import RlConfig

    cfg = load_config(RlConfig, Path(__file__).resolve().parents[1] / "configs" / f"{name}.yaml")
    assert cfg.sampling.n == 8 and cfg.sampling.temperature == 0.9


def test_bad_configs_name_the_key():
    from molrl.config import ConfigError, load_config
    from molrl.rl.config import RlConfig

    with pytest.raises(ConfigError, match="train.micro_batch_size=3 must divide"):
        load_config(RlConfig, None, ["train.micro_batch_size=3"])
    with pytest.raises(ConfigError, match="algorithm='reinforce'"):
        load_config(RlConfig, None, ["algorithm=reinforce"])
    with pytest.raises(ConfigError, match="macro.rule='fixed:0'"):
        load_config(RlConfig, None, ["macro.rule=fixed:0"])


def test_vllm_requested_but_missing_is_a_clear_error(tmp_path, monkeypatch):
    import importlib.util

    from molrl.errors import MolrlError
    from molrl.rl.run import build_trainer

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(MolrlError, match="engine=vllm but it is not installed here"):
        build_trainer(toy_config(tmp_path, "models/m", engine="vllm"))


def test_finding2_an_rl_run_on_the_mbpp_file_trains_and_records_only_train_tasks(tmp_path, shared_data):
    base = save_tiny_model(tmp_path / "base")
    from molrl.rl.run import run_rl

    data = TaskSource(path=shared_data / SOURCES["mbpp"], format="mbpp", limit=4)
    out = run_rl(toy_config(tmp_path / "run", base, max_steps=1, data=data, max_prompt_length=1024))
    rows = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert {r["task_id"] for r in rows} <= {"601", "602", "603", "604"}  # MBPP's train split: tasks 601-974
    from molrl.records.provenance import read_provenance

    trained = read_provenance(out / "adapter").tasks
    assert [(t.benchmark, t.split, t.id) for t in trained] == [("mbpp", "train", i) for i in ("601", "602", "603", "604")]
