"""End-to-end eval runs with the tiny in-process model: every benchmark, outputs, resuming."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import molrl.eval.sources as sources
from molrl.errors import MolrlError
from molrl.eval import EvalConfig, run_eval
from molrl.engines.generation import SamplingConfig
from molrl.sandbox import SandboxConfig

DATA = {"math500": "math500/test.jsonl", "aime24": "aime24/test.jsonl", "aime25": "aime25/test.jsonl",
        "humaneval": "humaneval/HumanEval.jsonl.gz", "mbpp": "mbpp/mbpp.jsonl"}


def _cfg(shared_data: Path, out: Path, benchmarks: list[str], **kw) -> EvalConfig:
    kw.setdefault("sampling", SamplingConfig(n=2, temperature=0.7, top_p=0.8, top_k=20, max_new_tokens=6))
    kw.setdefault("limit", 2)
    return EvalConfig(model="tiny:chatml", benchmarks=benchmarks, data={b: str(shared_data / DATA[b]) for b in benchmarks},
                      ks=[1, 2], output_dir=out, sandbox=SandboxConfig(workers=1), **kw)


def _samples(out: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (out / name / "samples.jsonl").read_text().splitlines()]


def _count_prompts(monkeypatch) -> list[int]:
    """Wrap the generator so the test sees how many prompts each generate call got."""
    calls: list[int] = []
    real = sources.open_generator

    def counting(*args, **kwargs):
        gen, tok = real(*args, **kwargs)
        inner = gen.generate
        gen.generate = lambda prompts, sampling: (calls.append(len(prompts)), inner(prompts, sampling))[1]
        return gen, tok

    monkeypatch.setattr(sources, "open_generator", counting)
    return calls


def test_tiny_model_runs_every_benchmark(shared_data, tmp_path):
    out = run_eval(_cfg(shared_data, tmp_path / "run", list(DATA)))
    results = json.loads((out / "results.json").read_text())
    assert list(results["benchmarks"]) == list(DATA)
    for name, m in results["benchmarks"].items():
        assert (m["problems"], m["samples"]) == (2, 4), name
        # six random tokens neither box a right answer nor write a passing function
        assert m["pass@1"] == 0.0 and m["pass@2"] == 0.0, name
        records = _samples(out, name)
        assert [(r["sample"]) for r in records] == [0, 1, 0, 1]
        assert all(isinstance(r["completion"], str) and r["stage"] for r in records)
    assert "maj@2" in results["benchmarks"]["math500"] and "maj@2" not in results["benchmarks"]["mbpp"]
    assert set(results["benchmarks"]["math500"]["by_subject"]) <= {
        "Algebra", "Intermediate Algebra", "Prealgebra", "Number Theory", "Precalculus", "Geometry",
        "Counting & Probability"}
    assert yaml.safe_load((out / "config.yaml").read_text())["sampling"]["top_k"] == 20
    assert "| humaneval | 2 | 4 |" in (out / "results.md").read_text()


def test_rerun_regenerates_nothing(shared_data, tmp_path, monkeypatch):
    cfg = _cfg(shared_data, tmp_path / "run", ["aime24"])
    run_eval(cfg)
    first = (tmp_path / "run/aime24/samples.jsonl").read_text()
    calls = _count_prompts(monkeypatch)
    run_eval(cfg)
    assert calls == []  # the model was never asked for anything
    assert (tmp_path / "run/aime24/samples.jsonl").read_text() == first


def test_raising_the_limit_generates_only_new_problems(shared_data, tmp_path, monkeypatch):
    run_eval(_cfg(shared_data, tmp_path / "run", ["aime24"]))
    calls = _count_prompts(monkeypatch)
    out = run_eval(_cfg(shared_data, tmp_path / "run", ["aime24"], limit=3))
    assert calls == [1]
    assert json.loads((out / "results.json").read_text())["benchmarks"]["aime24"]["problems"] == 3


def test_half_written_problem_is_redone(shared_data, tmp_path, monkeypatch):
    cfg = _cfg(shared_data, tmp_path / "run", ["aime24"])
    run_eval(cfg)
    path = tmp_path / "run/aime24/samples.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:3]) + lines[3][:20])  # problem 2 lost its last sample mid-write
    calls = _count_prompts(monkeypatch)
    run_eval(cfg)
    assert calls == [1]
    assert [(r["id"], r["sample"]) for r in _samples(tmp_path / "run", "aime24")] == [
        ("60", 0), ("60", 1), ("61", 0), ("61", 1)]


def test_changed_sampling_refuses_to_resume(shared_data, tmp_path):
    run_eval(_cfg(shared_data, tmp_path / "run", ["aime24"]))
    other = SamplingConfig(n=2, temperature=1.0, max_new_tokens=6)
    with pytest.raises(MolrlError, match="was made with other settings: sampling.temperature was 0.7, now 1.0"):
        run_eval(_cfg(shared_data, tmp_path / "run", ["aime24"], sampling=other))


def test_missing_data_names_the_flag(shared_data, tmp_path):
    cfg = _cfg(shared_data, tmp_path / "run", ["aime24"])
    cfg.data = {}
    with pytest.raises(MolrlError, match="pass --data aime24=PATH"):
        run_eval(cfg)


def test_interactive_mode_runs_the_collection_loop(shared_data, tmp_path):
    cfg = _cfg(shared_data, tmp_path / "run", ["aime24", "humaneval"], limit=1, mode="interactive")
    cfg.episode.max_turns = 2
    out = run_eval(cfg)
    results = json.loads((out / "results.json").read_text())
    assert results["mode"] == "interactive"
    for name in ("aime24", "humaneval"):
        assert results["benchmarks"][name]["samples"] == 2 and results["benchmarks"][name]["pass@1"] == 0.0
        records = _samples(out, name)
        # each sample is a finished episode: why it stopped, and how many turns it took
        assert all(r["stage"] in {"empty_turn", "max_turns", "out_of_solutions", "token_limit"} for r in records)
        assert all(1 <= r["details"]["turns"] <= 2 or r["stage"] == "empty_turn" for r in records)
        assert len({r["task_key"] for r in records}) == 1 and len(records[0]["task_key"]) == 16  # one problem's key


class _SecondTryGenerator:
    """Submits a wrong answer, then (having seen the feedback) the right one: 204 for AIME24 #60."""

    def generate(self, prompts, sampling):
        return [["<solution>204</solution>" if "<solution>7</solution>" in p else "<solution>7</solution>"]
                for p in prompts]


def test_interactive_verdict_comes_from_the_last_submission(shared_data, tmp_path, monkeypatch):
    from molrl.models import load_tokenizer

    monkeypatch.setattr(sources, "open_generator", lambda *args, **kwargs: (_SecondTryGenerator(), load_tokenizer("tiny:chatml")))
    cfg = _cfg(shared_data, tmp_path / "run", ["aime24"], limit=1, mode="interactive")
    out = run_eval(cfg)
    assert json.loads((out / "results.json").read_text())["benchmarks"]["aime24"]["pass@1"] == 1.0
    record = _samples(out, "aime24")[0]
    assert (record["stage"], record["extracted"], record["details"]["solutions"]) == ("solved", "204", 2)
    assert len(record["details"]["feedback"]) == 2  # the wrong answer's feedback, then the verdict


class _LookupTableGenerator:
    """The attack of finding 3: submit ``return None``, then a table of the expected values the feedback showed."""

    failed = __import__("re").compile(r"^- (\w+)\((.*)\) returned None, expected (.*)$", __import__("re").M)

    def generate(self, prompts, sampling):
        out = []
        for prompt in prompts:
            name = __import__("re").search(r"function `(\w+)`", prompt).group(1)
            rows = [f"    if args == ({args},):\n        return {expected}" for _, args, expected in self.failed.findall(prompt)]
            out.append([f"<solution>\ndef {name}(*args):\n" + "\n".join(rows) + "\n    return None\n</solution>"])
        return out


def test_finding3_eval_turns_a_lookup_table_of_the_feedback_scores_nothing(shared_data, tmp_path, monkeypatch):
    from molrl.models import load_tokenizer

    monkeypatch.setattr(sources, "open_generator", lambda *args, **kwargs: (_LookupTableGenerator(), load_tokenizer("tiny:chatml")))
    cfg = _cfg(shared_data, tmp_path / "run", ["humaneval"], limit=40, mode="interactive",
               sampling=SamplingConfig(n=1, temperature=0.7, max_new_tokens=6))
    out = run_eval(cfg)
    m = json.loads((out / "results.json").read_text())["benchmarks"]["humaneval"]
    assert m["shown_pass@1"] > 0.2  # the table passes the tests its feedback showed (14 of 40 before)...
    assert m["held_back_pass@1"] == 0.0  # ...and none it never saw (it "solved" 14 of 40 before)
    records = _samples(out, "humaneval")
    assert sum(r["held_back_pass"] is None for r in records) == m["no_held_back"] > 0  # one-test tasks, flagged
    # pass@1 is 0 on every task that holds a test back; a one-test task shows its only test, is graded on it, flagged
    assert [r["id"] for r in records if r["correct"] and r["held_back_pass"] is not None] == []
    assert "shown_pass@1" in (out / "results.md").read_text()


def test_single_turn_reports_the_shown_and_held_back_tests_apart(shared_data, tmp_path):
    # MBPP 11's shown test is remove_Occ("hello","l") == "heo": a constant passes it and neither held-back test
    reference_12 = json.loads((shared_data / DATA["mbpp"]).read_text().splitlines()[11])["code"]
    predictions = tmp_path / "preds.jsonl"
    predictions.write_text(json.dumps({"id": "11", "completion": "```python\ndef remove_Occ(s, ch):\n    return 'heo'\n```"})
                           + "\n" + json.dumps({"id": "12", "completion": f"```python\n{reference_12}\n```"}) + "\n")
    cfg = _cfg(shared_data, tmp_path / "run", ["mbpp"], predictions={"mbpp": str(predictions)})
    m = json.loads((run_eval(cfg) / "results.json").read_text())["benchmarks"]["mbpp"]
    assert (m["pass@1"], m["shown_pass@1"], m["held_back_pass@1"], m["no_held_back"]) == (0.5, 1.0, 0.5, 0)
    assert [(r["shown_pass"], r["held_back_pass"]) for r in _samples(tmp_path / "run", "mbpp")] == [(True, False),
                                                                                                   (True, True)]
