"""``benchmarks/gpu_check.py --device cpu --tiny``: every GPU check runs at tiny shapes and reports finite figures.

The GPU list runs on a GPU only when one is lent; this keeps the command from rotting in between.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from conftest import REPO

ITEMS = ["matmul_peak", "mol_0.6b_4k", "mol_0.6b_8k", "mol_1.7b_4k", "mol_1.7b_8k", "mol_1.7b_4k_x4",
         "mol_1.7b_4k_cached", "prepare_0.6b", "generation_decode", "rl_split_0.6b", "rl_split_merged_0.6b",
         "eval_throughput", "demo_quick", "partial_rollouts", "rl_grpo", "rl_dr_grpo", "rl_opd", "rl_ppo_macro",
         "rl_partial", "rl_props", "rl_multiturn"]
"""Every item of shared/GPU.md's list, as gpu_check names them."""


@pytest.mark.slow
def test_tiny_gpu_check_on_cpu_reports_every_item_with_finite_figures(tmp_path):
    out = tmp_path / "gpu_check.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--tiny", "--threads", "1",
           "--workdir", str(tmp_path / "work"), "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert list(report["items"]) == ITEMS
    assert report["tiny"] and report["device"].startswith("CPU")
    for name in ("python", "torch", "transformers", "peft", "trl", "accelerate"):
        assert report["versions"][name], name
    for name, item in report["items"].items():
        assert item["status"] == "ok", (name, item.get("error"))
        numbers = [v for v in item["figures"].values() if not isinstance(v, str)]
        assert numbers and all(math.isfinite(v) for v in numbers), (name, item["figures"])
    figures = {name: item["figures"] for name, item in report["items"].items()}
    assert 0 < figures["mol_0.6b_4k"]["mfu"] and figures["mol_0.6b_4k"]["tokens_per_s"] > 0
    assert figures["mol_1.7b_4k_cached"]["hidden_kl_error"] < 1e-3  # bf16: exact up to its rounding
    split = figures["rl_split_0.6b"]
    assert split["generation_s"] + split["reward_s"] < split["step_s"] and 0 < split["reward_share"] < 1
    assert figures["eval_throughput"]["new_tokens"] <= 64 * figures["eval_throughput"]["max_new_tokens"]
    held_out = {k.split("/", 1)[1] for k in figures["demo_quick"] if k.startswith("held_out/")}
    assert held_out == {"base", "mol", "mol+grpo", "base+grpo"}
    # the markdown table on stdout has a row per item
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and not line.startswith("| item")]
    assert [row.split("|")[1].strip() for row in rows] == ITEMS


def gpu_check(tmp_path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--tiny", "--threads", "1",
           "--workdir", str(tmp_path / "work"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)


@pytest.mark.slow
def test_reuse_keeps_finished_items_and_runs_only_the_rest(tmp_path):
    first = gpu_check(tmp_path, "--only", "matmul_peak", "--json", str(tmp_path / "a.json"))
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    earlier = json.loads((tmp_path / "a.json").read_text())["items"]["matmul_peak"]

    second = gpu_check(tmp_path, "--only", "matmul_peak,mol_0.6b_4k", "--reuse", str(tmp_path / "a.json"),
                       "--json", str(tmp_path / "b.json"))
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    items = json.loads((tmp_path / "b.json").read_text())["items"]
    assert items["matmul_peak"]["reused"] and items["matmul_peak"]["figures"] == earlier["figures"]
    assert not (tmp_path / "work" / "matmul_peak.result.json").stat().st_mtime > (tmp_path / "a.json").stat().st_mtime
    assert items["mol_0.6b_4k"]["status"] == "ok" and "reused" not in items["mol_0.6b_4k"]
    assert items["mol_0.6b_4k"]["figures"]["mfu"] > 0  # the MFU's denominator came from the reused peak
    assert "matmul_peak: reused from" in second.stdout

    (tmp_path / "bad.json").write_text("[1, 2]")
    bad = gpu_check(tmp_path, "--only", "matmul_peak", "--reuse", str(tmp_path / "bad.json"))
    assert bad.returncode != 0 and "bad.json: not a gpu_check JSON" in bad.stderr
