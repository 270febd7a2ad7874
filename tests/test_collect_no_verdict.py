"""An episode the sandbox stopped is never a training trace: collection drops it with a count, collects it again on
resume, and stops a run whose sandbox fails past sandbox.max_error_rate."""

from __future__ import annotations

import json
import logging

import pytest
from collect_scripted import ScriptedGenerator

from failing_sandbox import LOST, fail_every
from molrl.collect import CollectConfig, run_collect
from molrl.collect.files import collect_files
from molrl.collect.run import SANDBOX_STOP, finished_pairs
from molrl.config.blocks import TaskSource
from molrl.engines.generation import SamplingConfig
from molrl.episode import EpisodeConfig
from molrl.errors import MolrlError
from molrl.sandbox import SandboxConfig
from molrl.tiny import build_tiny_tokenizer
from molrl.traces.schema import read_traces

SOLUTION = {"": ["<solution>\ndef f(*args):\n    return 1\n</solution>"]}


def _cfg(tmp_path, shared_data, limit: int, n: int) -> CollectConfig:
    return CollectConfig(model="tiny:chatml", output_dir=tmp_path,
                         data=TaskSource(path=shared_data / "mbpp/mbpp.jsonl", format="mbpp", split="all", limit=limit),
                         episode=EpisodeConfig(max_turns=1), thinking=True,
                         sampling=SamplingConfig(n=n, temperature=1.0, max_new_tokens=24),
                         sandbox=SandboxConfig(workers=1, timeout_s=5), progress=False)


def _collect(cfg):
    return run_collect(cfg, generator=ScriptedGenerator(SOLUTION), tokenizer=build_tiny_tokenizer("chatml"))


def test_an_episode_the_sandbox_stopped_is_dropped_counted_and_collected_again(tmp_path, shared_data, monkeypatch,
                                                                              caplog):
    fail_every(monkeypatch, 1)
    cfg = _cfg(tmp_path, shared_data, limit=2, n=2)
    with caplog.at_level(logging.INFO, logger="molrl.collect.run"):
        out = _collect(cfg)
    assert not out.exists() or out.read_text() == ""  # no trace carries the sandbox's failure as feedback
    rejects = [json.loads(line) for line in (tmp_path / "traces.rejects.jsonl").read_text().splitlines()]
    assert len(rejects) == 4 and {r["stop_reason"] for r in rejects} == {"sandbox_error"}
    assert all(r["error"] == f"{SANDBOX_STOP}: {LOST}" for r in rejects)
    assert "4 dropped at a sandbox error" in caplog.text
    assert "4 episodes of this run have no trace (4 stopped by a sandbox error" in caplog.text
    assert finished_pairs(collect_files(tmp_path)) == {}  # not finished: a resume collects them again
    monkeypatch.undo()  # the sandbox works again
    _collect(cfg)
    traces = [t for _, t in read_traces(out)]
    assert len(traces) == 4 and all(t.meta["stop_reason"] != "sandbox_error" for t in traces)
    assert set(finished_pairs(collect_files(tmp_path))) == {(t.meta["task_id"], t.meta["sample"]) for t in traces}


def test_a_collect_whose_sandbox_fails_past_the_limit_stops_in_one_line(tmp_path, shared_data, monkeypatch):
    fail_every(monkeypatch, 1)
    with pytest.raises(MolrlError, match=r"^collect: 32 of 32 graded rows \(100.0%\) were sandbox errors"):
        _collect(_cfg(tmp_path, shared_data, limit=4, n=8))
    rejects = (tmp_path / "traces.rejects.jsonl").read_text().splitlines()
    assert len(rejects) == 32  # each recorded before the run stopped
