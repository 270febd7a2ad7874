"""A stored evaluation judged by an older grading is graded again from its completions, and only that.

The class: every way a finished evaluation is read back (``molrl eval`` run again, the pipeline's finished stage, and
each kind of sample source) sees a sample judged by an older version of its task kind's grading
(``molrl.tasks.grade.GRADING``) and brings it up to date; single-turn and predictions samples are graded again from
the completions they hold (nothing is generated), interactive episodes are played again.
"""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

from molrl.config.blocks import TaskSource
from molrl.eval import EvalConfig, run_eval
from molrl.eval.run import grading_current, run_suite
from molrl.sandbox.errors import ErrorCount
from molrl.eval.samples import SampleRecord, SampleStore
from molrl.sandbox import SandboxConfig, SandboxPool
from molrl.task_types import JsonlSpec, Task, TestCase
from molrl.tasks.grade import GRADING

ANSWER = ("```python\ndef inc(x):\n    return x + 1\n```\nYou can check it with:\n```python\nassert inc(3) == 4\n"
          "print(inc(2))\n```")
"""Right, with a usage block after it: version 1 graded the usage block (inc undefined there), version 2 the
function."""
WRONG = "```python\ndef inc(x):\n    return x\n```"
ANSWER_3 = "Example:\n```text\ninc(3) -> 4\n```\nSolution:\n```python\ndef inc(x):\n    return x + 1\n```"
"""Right, after a sample-output block: version 2 graded the text between the two fences ('Solution:'), version 3
the function."""


def _task(task_id: str) -> Task:
    return Task(id=task_id, prompt="", kind="code", entry_point="inc",
                tests=[TestCase("call", args=[n], expected=n + 1) for n in (1, 2, 7)])


def _as_version_1(record: SampleRecord) -> SampleRecord:
    """The record as version 1 stored it: the usage block graded, a runtime error (and the field absent)."""
    return dataclasses.replace(record, extracted="assert inc(3) == 4\nprint(inc(2))", correct=False, score=0.2,
                               stage="runtime_error", grading=1)


def _as_version_2(record: SampleRecord) -> SampleRecord:
    """The record as version 2 stored it: the text between the output block and the code graded, a compile error."""
    return dataclasses.replace(record, extracted="Solution:", correct=False, score=0.1, stage="compile_error",
                               grading=2)


def test_code_grading_is_version_4_and_the_other_kinds_version_1():
    assert GRADING == {"code": 4, "math": 1, "toy": 1}
    line = {"id": "a", "sample": 0, "completion": "", "extracted": None, "correct": False, "score": 0.0,
            "stage": "no_code"}
    assert SampleRecord(**line).grading == 1  # a record written before versions were kept


class _Source:
    """A sample source of one ``mode`` that records which problems it was asked to produce samples for."""

    def __init__(self, mode: str):
        self.mode, self.asked = mode, []

    def finished(self, name, task_id, records):
        return len(records) == 1

    def made_by(self, offset):
        return None

    def records(self, name, tasks, offset, pool):
        self.asked += [t.id for t in tasks]
        return [[SampleRecord(id=t.id, sample=0, completion="played again", extracted=None, correct=False,
                              score=0.0, stage="max_turns", grading=GRADING["code"])] for t in tasks]


class _Progress:
    def add_task(self, *args, **kwargs):
        return 0

    def advance(self, *args):
        pass


@pytest.mark.parametrize("mode", ["single", "predictions", "interactive"])
def test_every_source_brings_samples_of_an_older_grading_up_to_date(tmp_path, mode):
    tasks = [_task("a"), _task("b"), _task("c"), _task("d")]
    store = SampleStore(tmp_path / "code" / "samples.jsonl")
    source = _Source(mode)
    with SandboxPool(SandboxConfig(workers=1)) as pool:
        current = run_suite("code", tasks[2:3], _Source("single"), pool, SimpleNamespace(output_dir=tmp_path,
                                                                                         batch_size=4), _Progress(),
                            ErrorCount(0.1, "eval"))
        store.rewrite([_as_version_1(SampleRecord(id="a", sample=0, completion=ANSWER, extracted=None,
                                                  correct=False, score=0.0, stage="", truncated=True)),
                       _as_version_1(SampleRecord(id="b", sample=0, completion=WRONG, extracted=None,
                                                  correct=False, score=0.0, stage="")),
                       *current[0],
                       _as_version_2(SampleRecord(id="d", sample=0, completion=ANSWER_3, extracted=None,
                                                  correct=False, score=0.0, stage=""))])
        records = run_suite("code", tasks, source, pool, SimpleNamespace(output_dir=tmp_path, batch_size=4),
                            _Progress(), ErrorCount(0.1, "eval"))
    by_id = {rs[0].id: rs[0] for rs in records}
    assert all(r.grading == GRADING["code"] for r in by_id.values())
    assert by_id["c"] == current[0][0]  # judged by the current grading already: kept as it was
    if mode == "interactive":  # an episode's verdict came from its turns: played again, the current one kept
        assert source.asked == ["a", "b", "d"] and by_id["a"].completion == "played again"
    else:  # graded again from the completion held; nothing generated, the cut at the token limit kept
        assert source.asked == []
        assert (by_id["a"].stage, by_id["a"].correct, by_id["a"].truncated) == ("all_pass", True, True)
        assert by_id["a"].extracted == "def inc(x):\n    return x + 1" and by_id["a"].completion == ANSWER
        assert (by_id["b"].stage, by_id["b"].correct) == ("partial", False)
        assert (by_id["d"].stage, by_id["d"].correct, by_id["d"].extracted) == ("all_pass", True,
                                                                                "def inc(x):\n    return x + 1")
    assert {i: rs[0] for i, rs in store.load().items()} == by_id  # the file says the same


def test_a_finished_eval_under_an_older_grading_is_graded_again_by_eval_and_by_the_pipeline(tmp_path):
    from molrl.pipeline import run_stage

    data = tmp_path / "inc.jsonl"
    data.write_text("".join(json.dumps({"id": i, "prompt": "Write inc.", "entry_point": "inc",
                                        "tests": [f"assert inc({n}) == {n + 1}" for n in (1, 2, 7)]}) + "\n"
                            for i in ("a", "b")))
    preds = tmp_path / "p.jsonl"
    preds.write_text(json.dumps({"id": "a", "completion": ANSWER}) + "\n"
                     + json.dumps({"id": "b", "completion": WRONG}) + "\n")
    cfg = EvalConfig(benchmarks=["inc"], data={"inc": TaskSource(path=data, spec=JsonlSpec(kind="code"))},
                     predictions={"inc": str(preds)}, output_dir=tmp_path / "run", sandbox=SandboxConfig(workers=1))

    def score():
        return json.loads((tmp_path / "run" / "results.json").read_text())["benchmarks"]["inc"]["pass@1"]
    ran = []
    assert run_stage(tmp_path / "run", cfg, lambda: ran.append(run_eval(cfg)), "eval",
                     current=lambda: grading_current(cfg))
    assert score() == 0.5 and grading_current(cfg)
    samples = SampleStore(tmp_path / "run" / "inc" / "samples.jsonl")
    old = {i: rs for i, rs in samples.load().items()}
    samples.rewrite([_as_version_1(old["a"][0]), *old["b"]])  # as version 1 left it
    (tmp_path / "run" / "results.json").write_text(json.dumps({"benchmarks": {"inc": {"pass@1": 0.0}}}))
    assert not grading_current(cfg)
    assert run_stage(tmp_path / "run", cfg, lambda: ran.append(run_eval(cfg)), "eval",
                     current=lambda: grading_current(cfg))  # finished, but under an older grading: run again
    assert score() == 0.5 and grading_current(cfg) and len(ran) == 2
    assert not run_stage(tmp_path / "run", cfg, lambda: ran.append(run_eval(cfg)), "eval",
                         current=lambda: grading_current(cfg))  # up to date: skipped
    samples.rewrite([_as_version_1(old["a"][0]), *old["b"]])
    run_eval(cfg)  # `molrl eval` run again on its own finished run grades it again too
    assert score() == 0.5 and grading_current(cfg)


def test_the_forgetting_measures_of_an_evaluation_graded_again_are_reused():
    from molrl.study.headline import same_run

    inputs = {"model.adapter": {"path": "a", "fingerprint": "w1"}, "data.general": {"path": "g", "fingerprint": "g1"}}
    before = json.dumps({"seconds": 438.1, "config": {"data": {"general": "g"}, "custom": {}}, "inputs": inputs})
    renamed = {"model.adapter": inputs["model.adapter"], "data.general.path": inputs["data.general"]}
    graded_again = json.dumps({"seconds": 1.2, "config": {"data": {"general": {"path": "g"}}}, "inputs": renamed})
    assert same_run(before, graded_again)  # the same weights and tasks: the cached KL stands
    other_weights = {**renamed, "model.adapter": {"path": "a", "fingerprint": "w2"}}
    assert not same_run(before, json.dumps({"seconds": 1.2, "config": {}, "inputs": other_weights}))
    assert not same_run("", graded_again) and same_run("", "")
