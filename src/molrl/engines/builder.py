"""The one builder of collect's and eval's generator: the engine chosen by the rule, opened by its registry line.

    generator, tokenizer = open_generator("eval", cfg, planned_tokens, batch_size=cfg.batch_size)

A stage's config names its model (``model.path``, ``model.adapter``, ``model.dtype``, ``model.seed``), its sampling
seed, its device and its ``engine_servers`` the same way in collect and eval; ``GeneratorSpec`` is that part of it, the
only thing an engine's opener (``molrl.engines.registry.EngineEntry.generator``) reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from molrl.engines.choice import choose
from molrl.engines.registry import BACKENDS


@dataclass(frozen=True)
class GeneratorSpec:
    """What an engine needs to open a generator for a stage's model."""

    model: str
    """The model directory or hub name (or an in-process ``tiny:`` model)."""
    adapter: str | None = None
    """A PEFT adapter put on the model."""
    dtype: str = "auto"
    """The weights' dtype."""
    model_seed: int = 0
    """A tiny model's weight seed."""
    seed: int = 0
    """The engine's own sampling seed (in-process vLLM on a CPU)."""
    device: str | None = None
    """The device the model is placed on (transformers); none: a GPU when one is visible."""
    batch_size: int = 16
    """Prompts a batch (transformers)."""
    static_cache: bool = False
    """A static KV cache (transformers)."""
    servers: tuple[str, ...] = ()
    """The servers of engine_servers."""

    @classmethod
    def of(cls, cfg: Any, batch_size: int, static_cache: bool = False) -> "GeneratorSpec":
        """The spec of a stage config with ``model``, ``sampling``, ``device`` and ``engine_servers`` blocks."""
        m = cfg.model
        return cls(str(m.path), str(m.adapter) if m.adapter is not None else None, m.dtype, m.seed,
                   cfg.sampling.seed, cfg.device, batch_size, static_cache, tuple(cfg.engine_servers))


def open_generator(stage: str, cfg: Any, work_tokens: int, *, batch_size: int,
                   static_cache: bool = False) -> tuple[Any, Any]:
    """The generator and tokenizer of ``cfg``'s model on the engine the choice rule picks for ``work_tokens`` tokens
    of ``stage``'s work (its choice logged in one line, with the keys it leaves idle)."""
    choice = choose(stage, cfg, work_tokens)
    choice.log(stage, cfg)
    return BACKENDS[choice.name].load("generator")(GeneratorSpec.of(cfg, batch_size, static_cache))
