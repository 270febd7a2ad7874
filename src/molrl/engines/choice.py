"""Which generation engine a stage uses, decided by one rule over two tables.

``molrl.engines.registry.BACKENDS`` says what each engine can do; ``NEEDS`` says which setting of which stage needs
which ability. ``choose`` applies them: an engine asked for by name that lacks an ability a setting needs is refused
in one line naming the setting, why, and the engines that can; ``auto`` takes, among the engines it may choose that
can do all the settings need, the one whose start pays for the stage's work (in-process vLLM when it is installed
and enough tokens are to be generated; transformers otherwise), and says why in one log line at the stage's start.
``check_choice`` is the same rule without the machine (nothing installed or counted), run as each stage's config is
built, so a refused pair never loads anything (all but the model's own need, decided as the stage starts).
``vllm_server`` is never chosen by ``auto``: it generates on the servers listed in ``engine_servers`` (``molrl
serve``), which the user starts. This module imports neither torch nor vLLM.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

from molrl.config.idle import name_idle_after_choice
from molrl.engines.registry import BACKENDS, EngineEntry, engines_that
from molrl.errors import ConfigError, MolrlError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Need:
    """A setting of some stages that only an engine with ``ability`` can honour."""

    stages: tuple[str, ...]
    setting: Callable[[Any], str | None]
    """The setting as an error line shows it (``rollout.behaviour=props``), or None where the config does not set it."""
    ability: str
    """The ability it needs (``molrl.engines.registry.ABILITIES``)."""
    why: str
    """Why an engine without the ability cannot honour it."""
    at_load: bool = True
    """Refused as the config loads; False: as the stage starts (a model a test or a pipeline swaps in later)."""


def _model_in_process(cfg: Any) -> str | None:
    path = str(cfg.model.path) if cfg.model.path is not None else ""
    return f"model.path={path}" if path.startswith("tiny:") else None


NEEDS: tuple[Need, ...] = (
    Need(("collect", "rl", "eval"), _model_in_process, "model_in_process",
         "an in-process model, which an engine that loads a model directory or hub name cannot load", at_load=False),
    Need(("rl",), lambda c: "rollout.behaviour=props" if c.rollout.behaviour == "props" else None, "second_adapter",
         "it samples from a second adapter, which only the trainer's own model holds"),
    Need(("rl",), lambda c: "rollout.merged_generation=true" if c.rollout.merged_generation else None,
         "merged_generation", "merging is for generation on the trainer's own weights; an engine holds its own"),
    Need(("rl",), lambda c: "rollout.max_staleness=1" if c.rollout.max_staleness == 1 else None, "overlap",
         "the overlap generates the next step on engine servers while this one trains, and an engine or generator in "
         "the trainer's process shares its devices, so nothing overlaps"),
)
"""Every stage setting that only some engines honour, with the ability it needs."""


@dataclass(frozen=True)
class EngineChoice:
    """The engine a stage generates with, and why."""

    name: str
    reason: str

    def log(self, stage: str, cfg: Any = None) -> None:
        """One line naming the engine and why; with the stage's config ``cfg``, one more naming the keys an
        engine=auto config sets that this choice leaves idle (``molrl.config.idle``)."""
        log.info("%s: generation engine %s (%s)", stage, self.name, self.reason)
        if cfg is not None:
            name_idle_after_choice(cfg, stage, self.name, self.reason)


def needs_of(stage: str, cfg: Any, loading: bool = False) -> list[tuple[str, Need]]:
    """(setting, need) for every setting of ``cfg`` that ``stage``'s engine must honour (``loading``: those refused
    as the config loads)."""
    return [(shown, need) for need in NEEDS if stage in need.stages and (need.at_load or not loading)
            for shown in [need.setting(cfg)] if shown is not None]


def unmet(stage: str, cfg: Any, name: str, loading: bool = False) -> tuple[str, Need] | None:
    """The first setting of ``cfg`` that engine ``name`` cannot honour in ``stage`` (as shown, and its need)."""
    return next(((shown, need) for shown, need in needs_of(stage, cfg, loading)
                 if need.ability not in BACKENDS[name].can), None)


def refusal(stage: str, cfg: Any, name: str, loading: bool = False) -> str | None:
    """Why engine ``name`` cannot run ``stage`` with ``cfg``'s settings, as one line with the fix; None when it can."""
    if name not in BACKENDS:
        return f"engine={name!r}; expected one of auto, {', '.join(BACKENDS)}"
    found = unmet(stage, cfg, name, loading)
    return None if found is None else refused(name, *found)


def refused(name: str, shown: str, need: Need) -> str:
    """The line refusing engine ``name`` (or auto) for setting ``shown``, naming the engines that can."""
    others = engines_that(need.ability)
    auto = " (or auto)" if any(BACKENDS[e].auto is not None for e in others) else ""
    fix = f"set engine={' or '.join(others)}{auto}" if others else "no engine can"
    return f"engine={name} with {shown}: {need.why}; {fix}, or change {shown.split('=')[0]}"


def check_choice(stage: str, cfg: Any) -> None:
    """The choice rule as a config is built: an engine that cannot honour a setting, or auto where no engine it may
    choose can, is refused in one line (``ValueError``, which the config loader names)."""
    check_engine_servers(cfg.engine, cfg.engine_servers)
    if cfg.engine != "auto":
        why = refusal(stage, cfg, cfg.engine, loading=True)
        if why is not None:
            raise ValueError(why)
        return
    unable = [unmet(stage, cfg, name, loading=True) for name, b in BACKENDS.items() if b.auto is not None]
    if all(found is not None for found in unable):
        raise ValueError(refused("auto", *unable[0]))


def choose(stage: str, cfg: Any, work_tokens: int, *, installed: bool | None = None,
           gpu: bool | None = None) -> EngineChoice:
    """The engine ``stage`` generates with for ``cfg`` (its ``engine``, ``model`` and settings) and ``work_tokens``
    tokens to generate; ``installed`` (every engine that needs installing is, or none is) and ``gpu`` stand in for
    this machine (tests)."""
    here: Callable[[EngineEntry], bool] = (lambda b: b.installed()) if installed is None else \
        (lambda b: installed or not b.install_hint)
    return _choose(stage, cfg, work_tokens, here, cuda_visible() if gpu is None else gpu)


def _choose(stage: str, cfg: Any, work_tokens: int, installed: Callable[[EngineEntry], bool],
            gpu: bool) -> EngineChoice:
    """``choose`` on a machine described by ``installed`` and ``gpu``."""
    requested = cfg.engine
    if requested != "auto":
        why = refusal(stage, cfg, requested)
        if why is not None:
            raise MolrlError(why)
        backend = BACKENDS[requested]
        if not installed(backend):
            raise MolrlError(f"engine={requested} but it is not installed here: {backend.hint()}; or set "
                             "engine=transformers (or auto)")
        servers = list(getattr(cfg, "engine_servers", []) or [])
        where = f": {len(servers)} server(s), {', '.join(servers)}" if "servers" in backend.can else ""
        return EngineChoice(requested, f"engine={requested}{where}")
    return _auto(stage, cfg, work_tokens, installed, gpu)


def _auto(stage: str, cfg: Any, work: int, installed: Callable[[EngineEntry], bool], gpu: bool) -> EngineChoice:
    """``auto``: the able engine with the highest start cost that the work pays for; the reason names what kept the
    others out."""
    best: tuple[int, str] | None = None
    passed: list[str] = []
    for name, backend in BACKENDS.items():
        if backend.auto is None:
            continue
        found = unmet(stage, cfg, name)
        floor = backend.auto(stage, gpu)
        if found is not None:
            passed.append(f"{name} cannot run {found[0]}: {found[1].why}")
        elif isinstance(floor, str):
            passed.append(floor)
        elif not installed(backend):
            passed.append(f"{name} is not installed ({backend.hint()})")
        elif work < floor:
            passed.append(f"{work:,} tokens to generate, under the {floor:,} at which {name}'s start pays for itself "
                          f"on a {'GPU' if gpu else 'CPU'}")
        elif best is None or floor > best[0]:
            best = (floor, name)
    if best is None:
        raise MolrlError(f"engine=auto: no engine can run {stage} here ({'; '.join(passed)})")
    if best[0] > 0:
        return EngineChoice(best[1], f"auto: {best[1]} is installed and {work:,} tokens are to be generated")
    return EngineChoice(best[1], "auto: " + ("; ".join(passed) or f"{best[1]} is the only engine that can"))


def check_engine_servers(engine: str, servers: Sequence[str]) -> None:
    """An engine that generates on servers has ``engine_servers`` (a list of http://HOST:PORT, each once)."""
    if engine in BACKENDS and "servers" in BACKENDS[engine].can and not servers:
        raise ConfigError(f"engine={engine} needs engine_servers: [http://HOST:PORT, ...], the vLLM servers to "
                          "generate on (start each with molrl serve --model MODEL --port PORT)")
    if len(set(servers)) != len(servers):
        raise ConfigError(f"engine_servers={list(servers)} names a server twice; list each once")
    for url in servers:
        server_address(url)


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
