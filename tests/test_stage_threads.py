"""One thread policy for every CPU stage (``molrl.cpu.use_threads``): the idle cores by default, ``threads=N`` to
fix the count, the count logged when the stage starts."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from molrl import cpu
from molrl.cli import main

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "configs" / "data" / "mol_tiny_traces.jsonl"


class Started(Exception):
    """Raised by the wrapped policy: the stage got as far as setting its threads, which is all a test needs."""


@pytest.fixture
def stop_after_threads(monkeypatch):
    """Every stage entry runs the real policy, then stops; torch's count and the governor are restored after."""
    seen: list[int] = []

    def policy(threads, stage, most=None):
        seen.append(cpu.use_threads(threads, stage, most))
        seen.append(torch.get_num_threads())
        raise Started

    for module in ("molrl.mol.run", "molrl.rl.run", "molrl.eval.run", "molrl.collect.run"):
        monkeypatch.setattr(f"{module}.use_threads", policy)
    before = torch.get_num_threads()
    yield seen
    cpu.govern_threads(None)
    torch.set_num_threads(before)


def test_the_governor_takes_the_idle_cores_of_this_process_share():
    # config first, then OMP_NUM_THREADS, else none fixed (the idle cores decide)
    assert cpu.fixed_threads(3, {"OMP_NUM_THREADS": "1"}) == 3
    assert cpu.fixed_threads(None, {"OMP_NUM_THREADS": "2"}) == 2
    assert cpu.fixed_threads(None, {"OMP_NUM_THREADS": "0"}) is None and cpu.fixed_threads(None, {}) is None
    # 16 usable cores shared by 4 processes of one launcher: at most 4 each; never below 1
    assert cpu.share_of_cores(16, {"LOCAL_WORLD_SIZE": "4"}) == 4 and cpu.share_of_cores(2, {"LOCAL_WORLD_SIZE": "8"}) == 1
    # another process keeps 1.2 of 4 cores busy: 2.8 idle rounds to 3 threads, under a share of 4
    assert cpu.threads_for(idle=4 - 1.2, usable=4, most=cpu.share_of_cores(4, {})) == 3


def _tasks(path: Path) -> Path:
    path.write_text("".join(json.dumps({"id": f"t{i}", "prompt": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                            for i in range(2)))
    return path


def _stage_args(stage: str, tmp_path: Path) -> list[str]:
    tasks = str(_tasks(tmp_path / "tasks.jsonl"))
    return {
        "mol": ["mol", "--config", str(REPO / "configs" / "mol_tiny.yaml"), f"data.traces=[{TRACES}]",
                f"output_dir={tmp_path / 'mol'}"],
        "rl": ["rl", "--config", str(REPO / "configs" / "rl_tiny.yaml"), f"output_dir={tmp_path / 'rl'}"],
        "eval": ["eval", "--model", "tiny:chatml", "--benchmarks", "qa", "--data", f"qa={tasks}",
                 "--out", str(tmp_path / "eval"), "data.qa.spec.kind=math"],
        "collect": ["collect", "--model", "tiny:chatml", "--tasks", tasks, "--format", "jsonl",
                    "--out", str(tmp_path / "collect")],
    }[stage]


@pytest.mark.parametrize("stage", ["mol", "rl", "eval", "collect"])
def test_a_stage_run_with_threads_2_uses_and_logs_two_threads(stage, tmp_path, stop_after_threads, cli_logs, caplog):
    caplog.set_level(logging.INFO)
    torch.set_num_threads(1)
    with pytest.raises(Started):
        main([*_stage_args(stage, tmp_path), "threads=2"])
    assert stop_after_threads == [2, 2]
    assert f"{stage}: torch threads: 2 (threads=2)" in caplog.text


def test_the_pipeline_passes_its_threads_to_a_stage_that_sets_none(tmp_path, stop_after_threads, cli_logs, caplog):
    caplog.set_level(logging.INFO)
    torch.set_num_threads(1)
    with pytest.raises(Started):
        main(["pipeline", "--config", str(REPO / "configs" / "pipeline_tiny.yaml"), "model=tiny:chatml",
              f"output_dir={tmp_path}", "stages=[mol]", f"traces=[{TRACES}]", "threads=2"])
    assert stop_after_threads == [2, 2]
    assert "mol: torch threads: 2 (threads=2)" in caplog.text


def test_without_threads_a_stage_follows_the_idle_cores(monkeypatch, caplog):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cpu, "idle_threads", lambda most, interval_s=0.3: min(most, 1))  # one core idle now
    cpu.govern_threads(None)  # no stage before this one left a governor running
    before = torch.get_num_threads()
    caplog.set_level(logging.INFO)
    try:
        assert cpu.use_threads(None, "eval", most=4) == 1
        assert torch.get_num_threads() == 1 and cpu._GOVERNOR is not None and cpu._GOVERNOR.most == 4
    finally:
        cpu.govern_threads(None)
        torch.set_num_threads(before)
    assert "eval: torch threads: 1 (the idle cores, at most 4" in caplog.text


@pytest.mark.parametrize("threads", [1, 2])
def test_the_in_process_engine_starts_under_the_stage_s_thread_count_unpinned(threads, monkeypatch):
    """start_llm on a CPU: the engine is built under the count ``use_threads`` set (OMP_NUM_THREADS, read by vLLM's
    worker processes) with vLLM's core pinning off; the process's own OMP_NUM_THREADS is put back afterwards."""
    vllm = pytest.importorskip("vllm")
    from molrl.engines.local_vllm import start_llm

    seen = {}

    class Recorded:
        def __init__(self, **kwargs):
            import os

            seen.update(OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS"),
                        VLLM_CPU_OMP_THREADS_BIND=os.environ.get("VLLM_CPU_OMP_THREADS_BIND"))

    monkeypatch.setattr(vllm, "LLM", Recorded)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    before = torch.get_num_threads()
    try:
        cpu.use_threads(threads, "rl")
        start_llm("models/m")
    finally:
        cpu.govern_threads(None)
        torch.set_num_threads(before)
    assert seen == {"OMP_NUM_THREADS": str(threads), "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    import os

    assert os.environ["OMP_NUM_THREADS"] == "7"
