"""``evaluate_single`` (the in-memory loop other stages call), custom JSONL and hub data sources."""

from __future__ import annotations

import json

import datasets
import pytest

from molrl.eval import EvalConfig, evaluate_single, run_eval
from molrl.traces.spans import render_prompts
from molrl.config.blocks import TaskSource
from molrl.engines.generation import SamplingConfig
from molrl.models import load_model_and_tokenizer
from molrl.sandbox import SandboxConfig, SandboxPool
from molrl.tasks import JsonlSpec, Task, load_tasks


class _AnswerBook:
    """Answers each rendered prompt from a table keyed by a phrase of the problem."""

    def __init__(self, answers: dict[str, str]):
        self.answers = answers

    def generate(self, prompts, sampling):
        return [[next(a for key, a in self.answers.items() if key in p)] * sampling.n for p in prompts]


def test_evaluate_single_scores_a_generators_answers(shared_data):
    tasks = load_tasks(shared_data / "aime24/test.jsonl", "aime", limit=3)
    # right, right, wrong
    book = {tasks[0].prompt[:60]: f"\\boxed{{{tasks[0].answer}}}", tasks[1].prompt[:60]: f"so it is \\boxed{{{tasks[1].answer}}}",
            tasks[2].prompt[:60]: "\\boxed{0}"}
    _, tok = load_model_and_tokenizer("tiny:chatml")
    out = evaluate_single(None, tok, tasks, SamplingConfig(n=2, temperature=1.0), generator=_AnswerBook(book), ks=[1, 2])
    assert out["accuracy"] == pytest.approx(2 / 3) and out["pass@2"] == pytest.approx(2 / 3)
    assert out["maj@2"] == pytest.approx(2 / 3)
    assert [r.correct for r in out["records"][2]] == [False, False]


def test_evaluate_single_tiny_model_with_code_and_math(shared_data):
    tasks = load_tasks(shared_data / "humaneval/HumanEval.jsonl.gz", "humaneval", limit=1)
    tasks += load_tasks(shared_data / "math500/test.jsonl", "math500", limit=1)
    model, tok = load_model_and_tokenizer("tiny:chatml")
    with SandboxPool(SandboxConfig(workers=1)) as pool:
        out = evaluate_single(model, tok, tasks, SamplingConfig(max_new_tokens=4), pool)
    assert out["problems"] == 2 and out["accuracy"] == 0.0
    assert out["stages"] == {"no_code": 1, "no_answer": 1}


def test_prompts_follow_thinking_switch():
    task = Task(id="t", prompt="What is 1+1?", kind="math", answer="2")
    _, tok = load_model_and_tokenizer("tiny:chatml")
    on, off = (render_prompts(tok, [task], enable_thinking=flag)[0] for flag in (True, False))
    assert "\\boxed{}" in on and "<think>" not in on
    assert off == on + "<think>\n\n</think>\n\n"


def test_custom_jsonl_benchmark(tmp_path):
    data = tmp_path / "mine.jsonl"
    data.write_text('{"qid": "a", "question": "1+1?", "final": "2"}\n{"qid": "b", "question": "2+2?", "final": "4"}\n')
    preds = tmp_path / "p.jsonl"
    preds.write_text('{"id": "a", "completion": "\\\\boxed{2}"}\n{"id": "b", "completion": "\\\\boxed{5}"}\n')
    spec = JsonlSpec(kind="math", id_field="qid", prompt_field="question", answer_field="final")
    cfg = EvalConfig(benchmarks=["mine"], data={"mine": TaskSource(path=data, spec=spec)},
                     predictions={"mine": str(preds)}, output_dir=tmp_path / "run")
    out = run_eval(cfg)
    assert json.loads((out / "results.json").read_text())["benchmarks"]["mine"]["pass@1"] == 0.5


def test_hub_source_is_fetched_once_into_the_run(shared_data, tmp_path, monkeypatch):
    rows = [json.loads(line) for line in (shared_data / "aime25/test.jsonl").read_text().splitlines()]
    asked = []

    def fake_load_dataset(name, split):
        asked.append((name, split))
        return datasets.Dataset.from_list(rows)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    preds = tmp_path / "p.jsonl"
    preds.write_text("".join(json.dumps({"id": r["id"], "completion": f"\\boxed{{{r['answer']}}}"}) + "\n" for r in rows))
    cfg = EvalConfig(benchmarks=["aime25"], data={"aime25": "hub:someone/aime25:train"},
                     predictions={"aime25": str(preds)}, output_dir=tmp_path / "run")
    for _ in range(2):
        out = run_eval(cfg)
    assert asked == [("someone/aime25", "train")]
    assert json.loads((out / "results.json").read_text())["benchmarks"]["aime25"]["pass@1"] == 1.0
    assert (out / "data/aime25.jsonl").is_file()
