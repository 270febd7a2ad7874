"""The local rehearsal of the cluster layout (scripts/cluster_local.sh) on a real model: 2 ``molrl serve`` servers, 2
``molrl sandbox serve`` servers and 2 trainer processes (accelerate, CPU, gloo) for 2 RL steps. The main trainer saves each step's adapter and loads it
on both servers, the other waits until they list it; both sample from it, and the run leaves the servers as it found
them and stops them. Slow: vLLM's CPU servers take minutes to start on a busy machine.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from test_real_model import gguf_file

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_trainers_on_two_servers_sync_each_steps_adapter_everywhere(tmp_path):
    model = tmp_path / "smollm2"
    export = subprocess.run([sys.executable, "-m", "molrl.cli", "export", "--gguf", str(gguf_file()), "--out",
                             str(model)], capture_output=True, text=True, timeout=900)
    assert export.returncode == 0, export.stderr[-2000:]
    out, ports, sandboxes = tmp_path / "cluster", [free_port(), free_port()], [free_port(), free_port()]
    env = dict(os.environ, MODEL=str(model), OUT=str(out), PORTS=" ".join(map(str, ports)), MEMORY="0.08",
               MAIN_PORT=str(free_port()), SANDBOX_PORTS=" ".join(map(str, sandboxes)))
    done = subprocess.run(["bash", str(REPO / "scripts/cluster_local.sh")], env=env, capture_output=True, text=True,
                          timeout=3600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]

    steps = [json.loads(x) for x in (out / "run/metrics.jsonl").read_text().splitlines()]
    steps = [m for m in steps if "reward" in m]
    assert [m["step"] for m in steps] == [1, 2]
    # every row sampled from the adapter the trainers held: fp32 on both sides, so engine and trainer agree
    assert all(m["rollout/mismatch_kl"] < 1e-4 for m in steps)
    completions = (out / "run/completions.jsonl").read_text().splitlines()
    assert len(completions) == 2 * 2 * 8  # 2 steps x 2 trainers x 8 completions
    for port in ports:
        log = (out / "logs" / f"server_{port}.log").read_text()
        assert log.count('"POST /v1/completions') > 0  # requests spread over both servers
        # each step's adapter loaded on every server by the main trainer, and unloaded once unused
        assert log.count('"POST /v1/load_lora_adapter HTTP/1.1" 200') == 2
        assert log.count('"POST /v1/unload_lora_adapter HTTP/1.1" 200') == 2
        with socket.socket() as s:  # the server was stopped
            assert s.connect_ex(("127.0.0.1", port)) != 0
    assert not any((out / "engine_sync").iterdir())
    for port in sandboxes:  # the rewards' code ran on both sandbox servers, which were stopped cleanly
        last = (out / "logs" / f"sandbox_{port}.log").read_text().strip().splitlines()[-1]
        jobs = int(last.split(" requests, ")[1].split(" jobs run")[0])
        assert jobs > 0, last
