"""The declared range of every config value, and the one check that applies them.

A config field's type carries its range as an ``Annotated`` marker: ``Range`` for a number (``Count``, ``Seed``,
``Probability``, ``LearningRate``, ... or a range of its own), ``OneOf`` for a name from a fixed list (optimiser,
schedule, dtype, LoRA target modules), ``Creatable`` for a run directory. ``check_values`` (and ``molrl.config``'s
loader, key by key) refuses a value outside its marker in one line naming key, value and what is allowed; every
float is finite, every integer compared as it is (never through a float), and no string or path holds a NUL byte.
``ranges`` lists every key of a config with its markers, for the tests that enumerate them.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from pathlib import Path
from typing import Annotated, Any, Callable, Literal

from molrl.config.renames import unoptional
from molrl.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a config number may take: ``low`` to ``high`` (each end closed unless marked open), plus the
    special values in ``also`` (e.g. -1 for "not set")."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False
    also: tuple[float, ...] = ()

    def allows(self, value: float) -> bool:
        """Whether ``value`` is one this range admits (NaN and infinities never are)."""
        if value in self.also:
            return True
        if not isinstance(value, int) and not math.isfinite(value):  # an int compares exactly, never as a float
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def describe(self, integer: bool) -> str:
        """``an integer in [1, 1000000]`` or ``a number in (0, 1]``, with the special values."""
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        ends = f"{left}{_number(self.low)}, {_number(self.high)}{right}"
        extra = "".join(f" or {_number(v)}" for v in self.also)
        return f"{'an integer' if integer else 'a number'} in {ends}{extra}"


def _number(value: float) -> str:
    """1000000 rather than 1e+06; 1e-09 as it is."""
    return str(int(value)) if value == int(value) and abs(value) < 1e16 else f"{value:g}"


@dataclasses.dataclass(frozen=True)
class OneOf:
    """A string that must be one of ``names`` (a list of such strings: each, and at least one); ``live`` gives the
    names when they are a registry's, read at each check (``molrl.engines.registry``: an engine registered later is
    allowed too)."""

    names: tuple[str, ...]
    live: Callable[[], tuple[str, ...]] | None = None

    def allowed(self) -> tuple[str, ...]:
        """The names allowed now."""
        return self.live() if self.live is not None else self.names

    def describe(self) -> str:
        """The allowed names, for an error message."""
        return "one of " + ", ".join(self.allowed())


@dataclasses.dataclass(frozen=True)
class Creatable:
    """A directory path a run can create or reuse: no part of it is an existing file."""

    def problem(self, path: Path) -> str | None:
        """Why ``path`` cannot be a run directory, or None when it can."""
        path = Path(path).expanduser()
        if path.exists() and not path.is_dir():
            return "it exists and is not a directory"
        for folder in (path.absolute(), *path.absolute().parents):  # the folder, or the nearest one it is made in
            if folder.exists():
                if not folder.is_dir():
                    return f"{folder} is not a directory"
                if not os.access(folder, os.W_OK | os.X_OK):
                    return f"{folder} is not writable by this user: make it writable, or choose another"
                return None
        return None


MAX_COUNT = 10**9
"""Upper bound of counts, steps and lengths: far above any run, far below what overflows a tensor's index."""
MAX_SEED = 2**32 - 1
"""Seeds are what numpy and torch accept: 0 to 2**32 - 1."""
MAX_THREADS = 1024
"""More CPU threads than this is a typo (each is a real OS thread)."""

Count = Annotated[int, Range(1, MAX_COUNT)]
"""A length or a count (tokens, steps, samples, workers): 1 or more."""
Size = Annotated[int, Range(0, MAX_COUNT)]
"""A size or count where 0 means none, off or automatic."""
Weight = Annotated[float, Range(0, 1e6)]
"""A loss term's weight or a coefficient: 0 or more (0 turns the term off)."""
Positive = Annotated[float, Range(0, 1e6, low_open=True)]
"""A scale, clip range or tolerance that must be above 0."""
Probability = Annotated[float, Range(0, 1)]
"""A probability or a fraction: 0 to 1."""
TopP = Annotated[float, Range(0, 1, low_open=True)]
"""Nucleus sampling mass: above 0, at most 1."""
Dropout = Annotated[float, Range(0, 1, high_open=True)]
"""A dropout probability: 0 or more, below 1."""
Temperature = Annotated[float, Range(0, 100, low_open=True)]
"""A softmax temperature of a loss: above 0."""
SamplingTemperature = Annotated[float, Range(0.01, 100, also=(0,))]
"""A sampling temperature: 0 (greedy decoding), or 0.01 or more (below it, logits / temperature overflows)."""
RolloutTemperature = Annotated[float, Range(0.01, 100)]
"""The sampling temperature of RL rollouts: 0.01 or more (their log-probs are taken at it, so never greedy)."""
LearningRate = Annotated[float, Range(0, 10, low_open=True)]
"""A learning rate: above 0."""
Seconds = Annotated[float, Range(0, 7 * 24 * 3600, low_open=True)]
"""A time limit in seconds: above 0, at most a week."""
Seed = Annotated[int, Range(0, MAX_SEED)]
"""A random seed: 0 to 2**32 - 1."""
Threads = Annotated[int, Range(1, MAX_THREADS)]
"""CPU threads: 1 to 1024."""
RunDir = Annotated[Path, Creatable()]
"""A run's output directory: created if missing, never an existing file."""

OPTIMIZERS = ("adamw_torch", "adamw_torch_fused", "adafactor", "sgd", "adagrad", "rmsprop")
"""Optimiser names of transformers that run with molrl's dependencies (no bitsandbytes, GaLore or torchao)."""
SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
              "inverse_sqrt")
"""Learning-rate schedules of transformers that need no settings beyond the warm-up."""
DTYPES = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16")
"""Weights dtypes a model is loaded in (``molrl.models.DTYPES``)."""
MODULE_NAMES = (
    "all-linear", "q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "gate_proj", "up_proj", "down_proj",
    "gate_up_proj", "lm_head", "embed_tokens", "c_attn", "c_proj", "c_fc", "query_key_value", "dense",
    "dense_h_to_4h", "dense_4h_to_h", "fc1", "fc2", "out_proj", "Wqkv", "query", "key", "value",
    "w1", "w2", "w3", "wq", "wk", "wv", "wo",
)
"""LoRA target module names of the causal-LM architectures transformers ships (Llama, Qwen, Mistral, Gemma, Phi,
GPT-2, GPT-NeoX, Falcon, ...), and ``all-linear``."""

Optimizer = Annotated[str, OneOf(OPTIMIZERS)]
"""An optimiser name of ``OPTIMIZERS``."""
Scheduler = Annotated[str, OneOf(SCHEDULERS)]
"""A learning-rate schedule of ``SCHEDULERS``."""
Dtype = Annotated[str, OneOf(DTYPES)]
"""A weights dtype of ``DTYPES``."""
TargetModules = Annotated[list[str], OneOf(MODULE_NAMES)]
"""LoRA target modules: one or more names of ``MODULE_NAMES``."""


def check_values(cfg: Any, where: str = "config", prefix: str = "") -> None:
    """The range rule of ``load_config`` applied to a config dataclass built in Python."""
    hints = typing.get_type_hints(type(cfg), include_extras=True)
    for f in dataclasses.fields(cfg):
        _check_range(hints[f.name], getattr(cfg, f.name), f"{prefix}{f.name}", where, deep=True)


def _check_range(tp: Any, value: Any, key: str, where: str, deep: bool = False) -> None:
    """``value`` within the markers of its type (``Range``, ``OneOf``, ``Creatable``), also inside a list, a mapping
    or an optional; every float finite. ``deep`` also enters sections (``load_config`` checks each as it builds it)."""
    if dataclasses.is_dataclass(value):
        if deep:
            check_values(value, where, f"{key}.")
        return
    if isinstance(value, (str, Path)) and "\0" in str(value):  # the OS refuses it in any path, with a traceback
        raise ConfigError(f"{where}: {key}={_shown(str(value))} holds a NUL byte (\\x00), which no path or name may "
                          "hold; remove it")
    base, markers = _markers(tp)
    for marker in markers:
        allowed = _violation(marker, value, base)
        if allowed is not None:
            raise ConfigError(f"{where}: {key}={_shown(value)} is out of range; allowed: {allowed}")
    args = typing.get_args(base)
    if isinstance(value, dict):
        for name, item in value.items():
            _check_range(args[1] if len(args) == 2 else Any, item, f"{key}.{name}", where, deep)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_range(args[0] if args else Any, item, f"{key}[{i}]", where, deep)
    elif isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: {key}={value} is out of range; allowed: a finite number")


def _markers(tp: Any) -> tuple[Any, tuple[Any, ...]]:
    """The type under ``Optional`` and ``Annotated``, and the ``Annotated`` markers."""
    tp = unoptional(tp)
    if typing.get_origin(tp) is Annotated:
        return unoptional(typing.get_args(tp)[0]), tp.__metadata__
    return tp, ()


def _violation(marker: Any, value: Any, base: Any) -> str | None:
    """What ``marker`` allows, when ``value`` is outside it; None when inside (or when ``value`` is None)."""
    if value is None:
        return None
    if isinstance(marker, Range) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return None if marker.allows(value) else marker.describe(base is int)
    if isinstance(marker, OneOf):
        items = value if isinstance(value, (list, tuple)) else [value]
        ok = bool(items) and all(item in marker.allowed() for item in items)
        return None if ok else marker.describe() + (" (at least one)" if isinstance(value, (list, tuple)) else "")
    if isinstance(marker, Creatable):
        problem = marker.problem(value)
        return None if problem is None else f"a directory that can be created ({problem})"
    return None


def _allowed(tp: Any) -> str | None:
    """The description of the ``Range`` of a number key (or of its list's or mapping's items), if it has one."""
    base, markers = _markers(tp)
    for marker in markers:
        if isinstance(marker, Range):
            return marker.describe(base is int)
    args = typing.get_args(base)
    return _allowed(args[-1]) if typing.get_origin(base) in (list, dict, tuple) and args else None


def choices(tp: Any) -> str | None:
    """``one of a, b, c`` for a ``Literal`` key (an optional one's too), else None."""
    base = unoptional(_markers(tp)[0])
    return "one of " + ", ".join(map(str, typing.get_args(base))) if typing.get_origin(base) is Literal else None


def _shown(value: Any) -> str:
    """A value as an error line shows it (a long one cut, a path whole)."""
    if isinstance(value, Path):
        return str(value)
    text = str(value) if isinstance(value, float) else repr(value)
    return text if len(text) <= 120 else text[:100] + f"... ({len(text)} characters)"


def ranges(cls: type, prefix: str = "") -> dict[str, tuple[Any, tuple[Any, ...]]]:
    """Every leaf key of a config dataclass (sections entered, dotted) with its bare type and its markers."""
    out: dict[str, tuple[Any, tuple[Any, ...]]] = {}
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        base, markers = _markers(hints[f.name])
        if dataclasses.is_dataclass(base):
            out.update(ranges(base, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = (base, markers)
    return out
