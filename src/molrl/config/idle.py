"""Keys that act only under a setting, and the one rule that applies them: one set where it cannot act is refused.

``RULES`` holds one ``Rule`` a key group: the stages that have the keys, where they act, the setting that leaves them
idle, and the fix. ``check_idle`` (the last step of each stage config's ``__post_init__``) refuses a config that sets
one of them to a value other than the stage's default where it cannot act, in one line naming each such key, its
value, the setting that leaves it idle and the fix:

    engine_sync_dir='/x' does nothing with engine=transformers: it is read only with engine=vllm_server; set
    engine=vllm_server (with engine_servers), or leave engine_sync_dir out

An engine's keys act where an engine can do what they set (``molrl.engines.registry``: each engine's abilities), so a
new engine is judged by its registry line alone. ``engine=auto`` is judged as the engines it may choose: a key acts
under auto when it acts on one of them, and a config is refused when no engine auto may choose takes it. Once a stage
has chosen, ``name_idle_after_choice`` names in one line the keys its choice leaves idle (auto on a CPU keeps rl on
transformers, where ``engine_gpu_memory_utilization`` does nothing).

A pipeline's ``mol`` and ``rl`` sections are each shared by every run of their stage, each run adding its own overrides:
a key of the section idle in one run and acting in another is named once in a log line for the run it does nothing in
(``shared_section``), a key the run's own overrides set idle is refused, and a key of the section idle in every run is
refused (``molrl.pipeline.check_stages``). A stage's own config, and the pipeline's collect and eval sections (one
config each), refuse every idle key.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from molrl.config.ranges import _shown, ranges
from molrl.engines.registry import able, auto_engines, engines_that
from molrl.episode.config import EpisodeTurns

log = logging.getLogger(__name__)

def engines(cfg: Any) -> frozenset[str]:
    """The engines a config may generate on: its ``engine``, or for auto each one auto may choose (mol: none)."""
    engine = getattr(cfg, "engine", None)
    if engine is None:
        return frozenset()
    return frozenset(auto_engines()) if engine == "auto" else frozenset({engine})


def _on(ability: str) -> str:
    """Where keys that need ``ability`` act: ``engine=vllm_server`` (or several engines, each named)."""
    return " or ".join(f"engine={name}" for name in engines_that(ability))


@dataclass(frozen=True)
class Rule:
    """Keys that act only under a setting: where they act, and what leaves them idle."""

    stages: tuple[str, ...]
    """The stages whose configs have the keys (collect, mol, rl, eval)."""
    keys: tuple[str, ...]
    """Dotted keys; one that names a section covers every key under it."""
    acts: Callable[[Any, frozenset[str]], bool]
    """Whether the keys act in a config that may generate on these engines."""
    where: str
    """Where the keys act, as the error line says it (``engine=vllm_server``)."""
    idle: Callable[[Any, str], str]
    """The setting that leaves the keys idle in a config, its engine shown as the given one."""
    fix: str = ""
    """What to set instead (``{key}``: the key); empty: set ``where``, or leave the key out."""
    why: str = ""
    """Why the keys do nothing there, when ``where`` alone does not say it."""


def _engine(cfg: Any, engine: str) -> str:
    return f"engine={engine}"


def _algorithm(cfg: Any, engine: str) -> str:
    return f"algorithm={cfg.algorithm}"


def _ppo_critic(cfg: Any, engine: str) -> str:
    return f"algorithm={cfg.algorithm}" if cfg.algorithm != "ppo" else f"ppo.critic={cfg.ppo.critic}"


def _single_turn(cfg: Any, engine: str) -> str:
    return f"episode.max_turns={cfg.episode.max_turns}"


RL_EPISODE = ("episode.max_solutions", "episode.system_prompt", "episode.code_prompt", "episode.math_prompt",
              "episode.instructions_role", "episode.feedback", "episode.feedback_max_tokens",
              "episode.max_failures_shown", "episode.tests_on_execute", "episode.turn_tokens", "sampling.stop",
              "loss.ce_weight")
"""rl's keys of multi-turn rollouts: every ``episode`` key but ``max_turns`` (and the critic's, which its own rule
covers), the turns' stop strings and the CE on their feedback tokens."""
EVAL_EPISODE = ("episode.max_solutions", "episode.system_prompt", "episode.code_prompt", "episode.math_prompt",
                "episode.instructions_role", "episode.feedback", "episode.feedback_max_tokens",
                "episode.max_failures_shown", "episode.tests_on_execute", "episode.max_turns",
                "episode.max_total_tokens")
"""eval's keys of interactive mode: its whole ``episode`` block (the critic's under its own rule)."""


SANDBOX_REMOTE = ("sandbox.servers", "sandbox.protocol", "sandbox.request_grace_s", "sandbox.retries",
                  "sandbox.server_failures", "sandbox.server_cooldown_s")
"""The sandbox keys of a remote tier's client."""
SANDBOX_SERVER_SIDE = ("sandbox.tmpfs_mb", "sandbox.seccomp", "sandbox.preimport", "sandbox.slot_memory_mb")
"""The sandbox keys a server decides for its own slots (the limits of a job travel with it: docs/sandbox.md)."""


def _episodes(cfg: Any) -> str | None:
    """The setting that keeps a stage from running agent episodes (rl single-turn, eval's single mode), or None."""
    if getattr(cfg, "mode", "interactive") != "interactive":  # eval
        return f"mode={cfg.mode}"
    return "episode.max_turns=1" if isinstance(cfg.episode, EpisodeTurns) and cfg.episode.max_turns == 1 else None


def _no_critic(cfg: Any, engine: str) -> str:
    return _episodes(cfg) or f"episode.feedback={list(cfg.episode.feedback)}"


def _no_base(cfg: Any, engine: str) -> str:
    return f"loss.mode={cfg.loss.mode} loss.monitor_kl=false"


def _live_base(cfg: Any, engine: str) -> str:
    return _no_base(cfg, engine) if not cfg.loss.needs_base else f"loss.base_targets={cfg.loss.base_targets}"


RULES: tuple[Rule, ...] = (
    # the engines
    Rule(("collect", "rl", "eval"), ("engine_servers",), lambda c, e: able(e, "servers"), _on("servers"), _engine),
    Rule(("rl",), ("engine_sync_dir",), lambda c, e: able(e, "sync_dir"), _on("sync_dir"), _engine,
         "set engine=vllm_server (with engine_servers), or leave {key} out"),
    Rule(("rl",), ("engine_gpu_memory_utilization",), lambda c, e: able(e, "gpu_share"), _on("gpu_share"), _engine,
         "set " + _on("gpu_share") + ", or leave {key} out (a server takes its share when it starts: molrl serve "
         "--memory)"),
    Rule(("rl",), ("rollout.max_mismatch_kl",), lambda c, e: able(e, "own_logprobs"), _on("own_logprobs"), _engine,
         why="the gate compares an engine's log-probs with the trainer's, and nothing else samples with its own"),
    Rule(("rl",), ("rollout.merged_generation",),
         lambda c, e: able(e, "merged_generation") and c.rollout.behaviour == "policy",
         _on("merged_generation") + " (or auto) rollout.behaviour=policy",
         lambda c, e: "rollout.behaviour=props" if able({e}, "merged_generation") or e == "auto" else f"engine={e}",
         why="it merges the policy's adapter for transformers generation; an engine holds its own weights, and props "
             "samples from a second adapter"),
    Rule(("collect", "eval"), ("device",), lambda c, e: able(e, "device"), _on("device"), _engine,
         "set " + _on("device") + " (or auto), or leave {key} out (vLLM places the model itself)"),
    Rule(("eval",), ("static_cache",), lambda c, e: able(e, "static_cache"), _on("static_cache"), _engine,
         "set " + _on("static_cache") + " (or auto), or leave {key} out"),
    # the rollout policies
    Rule(("rl",), ("rollout.tis_cap",), lambda c, e: c.rollout.max_staleness == 1,
         "rollout.max_staleness=1 (engine=vllm_server)",
         lambda c, e: f"rollout.max_staleness={c.rollout.max_staleness}",
         "set rollout.max_staleness=1 (with engine=vllm_server), or leave {key} out"),
    Rule(("rl",), ("rollout.over_provision", "rollout.off_policy"), lambda c, e: c.rollout.partial,
         "rollout.partial=true", lambda c, e: "rollout.partial=false"),
    Rule(("rl",), ("rollout.importance_cap",), lambda c, e: c.rollout.partial and c.rollout.off_policy == "importance",
         "rollout.partial=true rollout.off_policy=importance",
         lambda c, e: "rollout.off_policy=mask" if c.rollout.partial else "rollout.partial=false"),
    Rule(("rl",), ("rollout.sampling_error_split",), lambda c, e: c.rollout.sampling_error,
         "rollout.sampling_error=true", lambda c, e: "rollout.sampling_error=false"),
    Rule(("rl",), ("props",), lambda c, e: c.rollout.behaviour == "props", "rollout.behaviour=props",
         lambda c, e: f"rollout.behaviour={c.rollout.behaviour}"),
    Rule(("rl",), RL_EPISODE, lambda c, e: c.episode.max_turns > 1, "episode.max_turns > 1", _single_turn,
         "set episode.max_turns=2 or more, or leave {key} out",
         "a single-turn completion is one answer, with no turns, stop strings between them or feedback"),
    # the algorithms
    Rule(("rl",), ("ppo.gamma", "ppo.lam", "ppo.critic", "ppo.critic_warmup_steps"),
         lambda c, e: c.algorithm == "ppo", "algorithm=ppo", _algorithm),
    Rule(("rl",), ("ppo.value_clip",), lambda c, e: c.algorithm == "ppo" and c.ppo.critic != "group_mean",
         "algorithm=ppo with ppo.critic=separate or shared", _ppo_critic),
    Rule(("rl",), ("ppo.value_coef",), lambda c, e: c.algorithm == "ppo" and c.ppo.critic == "shared",
         "algorithm=ppo ppo.critic=shared", _ppo_critic,
         why="a separate critic is fitted by its own optimiser, and group_mean learns nothing"),
    Rule(("rl",), ("ppo.critic_init", "ppo.critic_learning_rate", "ppo.critic_epochs", "ppo.critic_minibatches"),
         lambda c, e: c.algorithm == "ppo" and c.ppo.critic == "separate", "algorithm=ppo ppo.critic=separate",
         _ppo_critic),
    Rule(("rl",), ("opd.lam", "opd.teacher", "opd.teacher_weights", "opd.reference", "opd.outcome_weight"),
         lambda c, e: c.algorithm == "opd", "algorithm=opd", _algorithm),
    Rule(("rl",), ("opd.teacher_model",), lambda c, e: c.algorithm == "opd" and c.opd.teacher_weights == "frozen",
         "algorithm=opd opd.teacher_weights=frozen",
         lambda c, e: f"algorithm={c.algorithm}" if c.algorithm != "opd" else "opd.teacher_weights=current"),
    Rule(("rl",), ("macro.rule", "macro.pooling"), lambda c, e: c.algorithm == "ppo" or c.macro.pool_advantages,
         "algorithm=ppo or macro.pool_advantages=true", lambda c, e: f"algorithm={c.algorithm} with "
                                                                    "macro.pool_advantages=false"),
    # the model and the evaluation hook
    Rule(("rl",), ("model.reference",), lambda c, e: c.beta > 0, "beta > 0", lambda c, e: f"beta={c.beta:g}",
         why="the reference is loaded for the KL term only"),
    Rule(("rl",), ("model.adapter_mode",), lambda c, e: c.model.adapter is not None, "model.adapter",
         lambda c, e: "no model.adapter", "give model.adapter (the MoL adapter), or leave {key} out"),
    Rule(("rl",), ("eval.data", "eval.sampling", "eval.kl_prompts"), lambda c, e: c.eval.every_steps > 0,
         "eval.every_steps > 0", lambda c, e: "eval.every_steps=0", "set eval.every_steps=N, or leave {key} out"),
    # eval's modes and the critic
    Rule(("eval",), EVAL_EPISODE, lambda c, e: c.mode == "interactive", "mode=interactive", lambda c, e: "mode=single"),
    Rule(("eval",), ("code_prompt", "math_prompt"), lambda c, e: c.mode == "single", "mode=single",
         lambda c, e: "mode=interactive", "set {key} under episode (episode.{key}) for interactive mode, or leave "
                                          "{key} out"),
    Rule(("collect", "rl", "eval"), ("episode.critique",),
         lambda c, e: _episodes(c) is None and "critique" in c.episode.feedback,
         "critique in episode.feedback (of agent episodes)", _no_critic,
         "list critique in episode.feedback, or leave {key} out"),
    # the sandbox: a remote tier's client keys, and the isolation keys a server sets for itself
    Rule(("collect", "rl", "eval"), SANDBOX_REMOTE, lambda c, e: c.sandbox.backend == "remote", "sandbox.backend=remote",
         lambda c, e: f"sandbox.backend={c.sandbox.backend}",
         "set sandbox.backend=remote (with sandbox.servers), or leave {key} out"),
    Rule(("collect", "rl", "eval"), SANDBOX_SERVER_SIDE, lambda c, e: c.sandbox.backend != "remote",
         "sandbox.backend=auto, bwrap or process", lambda c, e: "sandbox.backend=remote",
         "set it on each server (molrl sandbox serve --help), or leave {key} out",
         "a remote server isolates its jobs with its own settings"),
    # MoL's loss: the KL to the base, and where the base's targets come from
    Rule(("mol",), ("loss.kl_weight",), lambda c, e: c.loss.mode == "mol", "loss.mode=mol",
         lambda c, e: f"loss.mode={c.loss.mode}", why="the ce modes train on CE alone; their KL is only measured"),
    Rule(("mol",), ("loss.monitor_kl",), lambda c, e: c.loss.mode != "mol", "loss.mode=ce or ce_feedback",
         lambda c, e: "loss.mode=mol", why="loss.mode=mol always measures the KL it trains on"),
    Rule(("mol",), ("loss.kl_direction", "loss.temperature", "loss.base_targets"), lambda c, e: c.loss.needs_base,
         "loss.mode=mol or loss.monitor_kl=true", _no_base, why="nothing reads the base"),
    Rule(("mol",), ("loss.base_targets_dir", "loss.base_targets_check_steps"), lambda c, e: c.loss.cached_base,
         "loss.base_targets=hidden or topk", _live_base),
    Rule(("mol",), ("loss.base_topk",), lambda c, e: c.loss.cached_base and c.loss.base_targets == "topk",
         "loss.base_targets=topk", _live_base),
)
"""Every key group that acts only under a setting, for every stage."""


@dataclass(frozen=True)
class IdleKey:
    """A key set where it cannot act."""

    key: str
    """The dotted key."""
    value: Any
    """Its value."""
    rule: Rule
    """The rule that says where it acts."""
    idle: str
    """The setting of the config that leaves it idle."""

    @property
    def line(self) -> str:
        """What the error line says of it: the key, its value, the setting that leaves it idle and the fix."""
        return idle_line([self])


def idle_line(found: list[IdleKey]) -> str:
    """One line for idle keys: each rule's keys with their values, the setting that leaves them idle, where they act
    and the fix."""
    groups: dict[tuple[Rule, str], list[IdleKey]] = {}
    for item in found:
        groups.setdefault((item.rule, item.idle), []).append(item)
    parts = []
    for (rule, idle), items in groups.items():
        keys = [i.key for i in items]
        named = _joined([f"{i.key}={_shown(i.value)}" for i in items])
        them = keys[0] if len(keys) == 1 else "them"
        fix = (rule.fix or "set {where}, or leave {key} out").format(key=them, where=rule.where)
        why = f" ({rule.why})" if rule.why else ""
        verb, pronoun = ("does", "it is") if len(items) == 1 else ("do", "they are")
        parts.append(f"{named} {verb} nothing with {idle}: {pronoun} read only with {rule.where}{why}; {fix}")
    return "; ".join(parts)


def _joined(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


@functools.lru_cache(maxsize=None)
def rule_keys(rule: Rule, cls: type) -> tuple[str, ...]:
    """The leaf keys of ``cls`` a rule covers (a section's every key under it)."""
    leaves = ranges(cls)
    return tuple(sorted({leaf for leaf in leaves for key in rule.keys if leaf == key or leaf.startswith(key + ".")}))


def idle_keys(cfg: Any, stage: str, chosen: str | None = None) -> list[IdleKey]:
    """The keys ``cfg`` (a ``stage`` config) sets away from the stage's default where they cannot act: on the engines
    it may generate on, or on the engine ``chosen`` when one is."""
    on = frozenset({chosen}) if chosen is not None else engines(cfg)
    shown = chosen or getattr(cfg, "engine", "")
    cls = _stage_class(cfg)
    found: dict[str, IdleKey] = {}
    for rule in RULES:
        if stage not in rule.stages or rule.acts(cfg, on):
            continue
        for key in rule_keys(rule, cls):
            value = _value(cfg, key)
            if key in found or value == declared_default(cls, key):
                continue
            found[key] = IdleKey(key, value, rule, rule.idle(cfg, shown))
    return list(found.values())


def _stage_class(cfg: Any) -> type:
    """The config class of ``cfg`` (a watched or otherwise derived instance's first config class)."""
    return next(k for k in type(cfg).__mro__ if "__post_init__" in k.__dict__)


def _value(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def declared_default(cls: type, key: str) -> Any:
    """The value a stage's config class declares for dotted ``key`` (a section's as the stage resolves it: a task
    source's format decided), or ``MISSING`` for a key the class requires."""
    top, *rest = key.split(".")
    found = next(f for f in dataclasses.fields(cls) if f.name == top)
    if found.default is not dataclasses.MISSING:
        value = found.default
    elif found.default_factory is not dataclasses.MISSING:
        value = found.default_factory()
    else:
        return dataclasses.MISSING
    for part in [None, *rest]:
        if part is not None:
            value = getattr(value, part)
        value = value.resolved() if callable(getattr(value, "resolved", None)) else value
    return value


_TRYING: contextvars.ContextVar[bool] = contextvars.ContextVar("trying_engines", default=False)
_SHARED: contextvars.ContextVar[tuple[str, frozenset[str]] | None] = contextvars.ContextVar("shared_section",
                                                                                         default=None)
_NAMED: set[str] = set()


@contextlib.contextmanager
def shared_section(where: str, keys: set[str] | frozenset[str]) -> Iterator[None]:
    """While a config is built from a section several runs share (a pipeline's ``rl``): its ``keys`` idle in this
    run are named once in a log line under ``where``, not refused."""
    token = _SHARED.set((where, frozenset(keys)))
    try:
        yield
    finally:
        _SHARED.reset(token)


def from_section(key: str, section: frozenset[str]) -> bool:
    """Whether ``key`` is set by one of a section's flattened keys (the key itself, or a section above it)."""
    return any(key == given or key.startswith(given + ".") for given in section)


def check_idle(cfg: Any, stage: str) -> None:
    """Refuse (``ValueError``, one line) a ``stage`` config that sets a key where it cannot act; with engine=auto,
    also one that no engine auto may choose takes."""
    idle = idle_keys(cfg, stage)
    shared = _SHARED.get()
    if shared is not None:
        where, section = shared
        named = [i for i in idle if from_section(i.key, section)]
        if named and not _TRYING.get():
            _name_once(f"{where}: the shared section sets keys this run leaves idle (named, not refused: another "
                       f"run may read them): {idle_line(named)}")
        idle = [i for i in idle if not from_section(i.key, section)]
    if idle:
        raise ValueError(idle_line(idle))
    if getattr(cfg, "engine", None) == "auto":
        _check_auto(cfg)


def _check_auto(cfg: Any) -> None:
    """Refuse an engine=auto config that each engine auto may choose refuses, naming each one's reason."""
    refused = {}
    token = _TRYING.set(True)
    try:
        for engine in auto_engines():
            try:
                dataclasses.replace(cfg, engine=engine)
            except ValueError as err:
                refused[engine] = str(err)
    finally:
        _TRYING.reset(token)
    if len(refused) == len(auto_engines()):
        reasons = "; ".join(f"with engine={engine}: {why}" for engine, why in refused.items())
        raise ValueError(f"engine=auto may choose {' or '.join(auto_engines())}, and none takes this config: "
                         f"{reasons}")


def name_idle_after_choice(cfg: Any, stage: str, chosen: str, reason: str) -> None:
    """Name in one line the keys an engine=auto config sets that the engine ``chosen`` leaves idle."""
    if getattr(cfg, "engine", None) != "auto":
        return
    idle = idle_keys(cfg, stage, chosen)
    if idle:
        _name_once(f"{stage}: engine=auto chose {chosen} ({reason}), where {idle_line(idle)}")


def _name_once(line: str) -> None:
    """Log ``line`` once per process (a pipeline builds each stage's config more than once)."""
    if line not in _NAMED:
        _NAMED.add(line)
        log.warning("%s", line)
