"""``molrl serve``: one vLLM server of the engine tier (``engine: vllm_server``), started with the flags molrl needs.

    molrl serve --model runs/smollm2/model --port 8001 [--max-lora-rank 64] [--host 0.0.0.0]
    molrl serve --model M --port 8001 --devices 0          # one server a GPU: one line each, on its own port
    molrl serve --model M --port 8001 --devices 0,1        # one server over two GPUs (tensor parallel)

It runs vLLM's own OpenAI-compatible server as a child process: LoRA enabled up to the rank given (rounded up to one
vLLM takes), runtime LoRA loading allowed (the run loads each new adapter), log-probs of the sampling distribution
(``processed_logprobs``, as the trainer's), the model's dtype (from its ``config.json``), no generation defaults of
the model's own (only what a request asks shapes sampling), 0.9 of the GPU's memory (``--memory``); on a CPU eager,
with prompts never split (a request's own seed needs that there), 0.3 of the machine's memory and a 1 GiB KV cache
(``VLLM_CPU_KVCACHE_SPACE``). ``--devices`` names the GPUs the server sees (``CUDA_VISIBLE_DEVICES`` of its process)
and splits the model over all of them (``--tensor-parallel-size``, which may say fewer). It prints the URL, then
``ready`` once ``/health`` answers; SIGTERM and SIGINT go to the server, and molrl serve exits with its code. A run
names the URL in ``engine_servers``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
"""vLLM's server, run as a module (the ``vllm`` console script does not start from a ``vllm-cpu`` install)."""
VLLM_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
"""A model's ``config.json`` dtype as vLLM's ``--dtype`` names it; anything else: auto."""
READY_TIMEOUT_S = 1800.0
"""Seconds to wait for the server's ``/health`` before giving up on it."""


def model_dtype(model: str) -> str:
    """The dtype vLLM should load ``model`` in: its ``config.json``'s (``dtype`` or ``torch_dtype``); auto for a hub
    name or a config that names none."""
    config = Path(model) / "config.json"
    if not config.is_file():
        return "auto"
    data = json.loads(config.read_text())
    return VLLM_DTYPES.get(str(data.get("dtype") or data.get("torch_dtype")), "auto")


def serve_command(model: str, port: int, *, host: str = "127.0.0.1", max_lora_rank: int = 64, dtype: str = "auto",
                  gpu: bool = False, memory: float | None = None, devices: str | None = None,
                  tensor_parallel_size: int | None = None, module: str = SERVER_MODULE,
                  python: str = sys.executable) -> tuple[list[str], dict[str, str]]:
    """The server's command line and the environment it adds, for ``model`` on ``host``:``port``, on the GPUs
    ``devices`` (``0,1``; none: every GPU its process sees) split ``tensor_parallel_size`` ways (none: over every
    device named, else 1)."""
    from molrl.engines.adapters import VLLM_LORA_RANKS

    rank = next((r for r in VLLM_LORA_RANKS if r >= max_lora_rank), None)
    if rank is None:
        raise ValueError(f"--max-lora-rank {max_lora_rank}: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}")
    parallel = server_devices(devices, tensor_parallel_size)
    argv = [python, "-m", module, "--model", model, "--host", host, "--port", str(port), "--dtype", dtype,
            "--enable-lora", "--max-lora-rank", str(rank), "--max-loras", "2",  # the adapter sampled and the next
            "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm",
            "--gpu-memory-utilization", str(memory if memory is not None else 0.9 if gpu else 0.3)]
    if parallel > 1:
        argv += ["--tensor-parallel-size", str(parallel)]
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = devices
    if not gpu:  # eager starts in seconds, not minutes; a seeded request fails on a split prompt on a CPU
        argv += ["--enforce-eager", "--no-enable-chunked-prefill"]
        env["VLLM_CPU_KVCACHE_SPACE"] = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")
    return argv, env


def server_devices(devices: str | None, tensor_parallel_size: int | None) -> int:
    """The tensor-parallel size of a server on ``devices`` (a comma-separated list of GPU indices, each once):
    ``tensor_parallel_size`` when given (at most the devices named), else one way per device named, else 1."""
    named = [d.strip() for d in devices.split(",")] if devices is not None else []
    if devices is not None and (not all(d.isdigit() for d in named) or len(set(named)) != len(named)):
        raise ValueError(f"--devices {devices}: GPU indices separated by commas, each once (e.g. 0,1)")
    if tensor_parallel_size is None:
        return len(named) or 1
    if tensor_parallel_size < 1 or (named and tensor_parallel_size > len(named)):
        raise ValueError(f"--tensor-parallel-size {tensor_parallel_size}: 1 to the {len(named) or 'visible'} "
                         f"GPU(s) --devices names")
    return tensor_parallel_size


def register(subparsers: argparse._SubParsersAction) -> None:
    from molrl.cli import count

    p = subparsers.add_parser("serve", help="start a vLLM server for engine=vllm_server", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the policy's base: a model directory or hub name")
    p.add_argument("--port", type=count, default=8000, help="port to listen on (default 8000)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for a cluster)")
    p.add_argument("--max-lora-rank", type=count, default=64, help="the largest LoRA rank a run sends (default 64)")
    p.add_argument("--memory", type=float, help="share of the GPU's memory (on a CPU: of the machine's) the server "
                                                "may take (default 0.9 on a GPU, 0.3 on a CPU)")
    p.add_argument("--devices", help="the GPUs this server uses, e.g. 0 or 0,1 (its CUDA_VISIBLE_DEVICES; default: "
                                     "every GPU it sees); several: one server split over them")
    p.add_argument("--tensor-parallel-size", type=count, help="GPUs the model is split over (default: as many as "
                                                              "--devices names, else 1)")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    """Run the server until it exits or is told to stop; its exit code."""
    from molrl.engines.server.client import ServerClient
    from molrl.engines.choice import cuda_visible

    try:
        argv, env = serve_command(args.model, args.port, host=args.host, max_lora_rank=args.max_lora_rank,
                                  dtype=model_dtype(args.model), gpu=cuda_visible(), memory=args.memory,
                                  devices=args.devices, tensor_parallel_size=args.tensor_parallel_size,
                                  module=SERVER_MODULE)
    except ValueError as err:
        print(f"molrl serve: {err}", file=sys.stderr)
        return 2
    url = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else args.host}:{args.port}"
    child = subprocess.Popen(argv, env={**os.environ, **env})
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda number, _frame: child.send_signal(number))
    print(f"molrl serve: {args.model} at {url} (engine_servers: [{url}])", flush=True)
    client, deadline = ServerClient(url), time.monotonic() + READY_TIMEOUT_S
    while child.poll() is None and not client.healthy():
        if time.monotonic() > deadline:
            child.terminate()
            break
        time.sleep(1.0)
    if child.poll() is None:
        print(f"molrl serve: {url} ready", flush=True)
    return child.wait()
