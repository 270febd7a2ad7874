"""Typed configs: dataclasses loaded from YAML, overridden with ``key.sub=value``.

Every stage declares a dataclass whose fields carry a one-line docstring (the string literal
right after the field). ``load_config`` builds it from a YAML file plus command-line overrides,
checking every key, type and range; errors name the key and where it came from. ``save_config``
writes the resolved config next to a stage's outputs.

Every value is checked against its field's declared range (``molrl.config.ranges``) as the config is built, before
a stage loads anything; ``check_values`` applies the same rule to a config built in Python. YAML files are read
under a size cap, as UTF-8, by YAML 1.2's core schema (``molrl.config.yaml_io``: no base-60 numbers, no yes/no booleans),
refusing a key given twice in one mapping and nesting past a bounded depth.

A class may list keys it renamed in ``RENAMED_KEYS`` (old name -> new name, and how an old value
converts): old configs keep loading, with one line naming the new keys (``molrl.config.renames``).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import inspect
import stat
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, Literal, Sequence, TypeVar

import yaml

from molrl.config.ranges import OneOf, _allowed, _check_range, _markers, _shown, check_values, choices
from molrl.config.ranges import Count, Weight  # noqa: F401  (where stages found them first)
from molrl.config.yaml_io import NotYaml, parse_yaml
from molrl.config.renames import current, note_renames, renamed, renamed_path, shorthand, unoptional
from molrl.errors import ConfigError
from molrl.records.writes import write_text

T = TypeVar("T")


def load_config(cls: type[T], path: str | Path | None = None, overrides: Sequence[str] = (),
                overrides_from: str = "command-line overrides") -> T:
    """Build ``cls`` from the YAML file at ``path`` (optional) and ``key.sub=value`` overrides (``overrides_from``
    names where they came from in messages)."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        data = _read_yaml(Path(path), (), cls)
    moved: list[str] = []
    spelled: dict[tuple[str, ...], tuple[str, Any, bool]] = {}  # key set -> (as written, its value, an old name)
    for item in overrides:
        written = _apply_override(data, item, cls, moved)
        if written is not None:
            _one_name_per_key(spelled, *written, overrides_from)
    note_renames(overrides_from, moved)
    where = source if not overrides else f"{source} + {overrides_from}"
    return _build(cls, data, prefix="", where=where)


def build_config(cls: type[T], data: dict[str, Any], where: str) -> T:
    """``cls`` from plain data (``where`` names it in errors), as a YAML file's mapping is built."""
    return _build(cls, data, prefix="", where=where)


def _read_yaml(path: Path, chain: tuple[Path, ...], cls: type) -> dict[str, Any]:
    """The mapping in ``path`` under ``cls``'s current key names; a top-level ``extends: other.yaml`` (relative to
    ``path``) is read first and ``path``'s keys are merged over it: sections key by key, every other value (lists
    too) replaced. Each file is renamed before the merge, so a file under old names still overrides its base."""
    loaded = parse_yaml(_read_text(path, chain), str(path))
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: top level must be a mapping of keys, got {type(loaded).__name__}")
    parent = loaded.pop("extends", None)
    loaded = current(cls, loaded, "", str(path), note=True)
    if parent is None:
        return loaded
    if not isinstance(parent, str) or not parent:
        raise ConfigError(f"{path}: extends must be one file name, relative to {path.parent}; got {parent!r}")
    base_path = (path.parent / parent).resolve()
    if base_path in chain or base_path == path.resolve():
        raise ConfigError(f"{path}: extends {parent} closes a cycle ({' -> '.join(str(c) for c in (*chain, path))})")
    return _merged(_read_yaml(base_path, (*chain, path.resolve()), cls), loaded)


MAX_CONFIG_BYTES = 1 << 20
"""Largest config file read (a config is a few KiB; this refuses /dev/zero and the like)."""
MAX_FLOAT_INT = 10**300
"""Largest integer a number key converts to a float (``float()`` overflows near 1.8e308); past it, out of range."""


def _read_text(path: Path, chain: tuple[Path, ...]) -> str:
    """The UTF-8 text of a regular config file of at most ``MAX_CONFIG_BYTES``."""
    where = f" (extended by {chain[-1]})" if chain else ""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found{where}") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the config file{where}: {err.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise ConfigError(f"{path}: {kind}{where}; a config is a YAML file")
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the config file{where}: {err.strerror}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: over {MAX_CONFIG_BYTES >> 20} MiB{where}; a config is a small YAML file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        byte = raw[err.start]
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte {byte:#04x}); save the file as UTF-8") from None


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def save_config(cfg: Any, path: str | Path) -> None:
    """Write a resolved config dataclass as YAML (atomically)."""
    write_text(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))


def to_dict(cfg: Any) -> Any:
    """Plain-data form of a config (Paths become strings)."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    if isinstance(cfg, dict):
        return {k: to_dict(v) for k, v in cfg.items()}
    if isinstance(cfg, Path):
        return str(cfg)
    return cfg


def field_docs(cls: type) -> dict[str, str]:
    """The docstrings of a dataclass's fields (inherited ones too), read from source, each whole."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_own_field_docs(klass))
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def describe(cls: type, prefix: str = "", base: Any = None) -> list[str]:
    """Lines ``key: default  # doc`` for every field, nested sections flattened with dots, each at the default its
    parent declares (``base``: eval's ``sampling.temperature`` is 0.7); a doc of several lines goes on in
    ``    # ...`` lines below its key, then the values the key allows."""
    lines = []
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    ranged = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            section = getattr(base, f.name) if base is not None else _factory_default(f)
            lines += describe(tp, prefix=f"{prefix}{f.name}.", base=section)
            continue
        default = getattr(base, f.name) if base is not None else f.default if f.default is not dataclasses.MISSING \
            else (f.default_factory() if f.default_factory is not dataclasses.MISSING else "<required>")  # type: ignore[misc]
        first, *more = [line for line in docs.get(f.name, "").splitlines() if line.strip()] or [""]
        lines.append(f"{prefix}{f.name}: {to_dict(default)!r}  # {first}")
        lines += [f"    # {line}" for line in more]
        allowed = _allowed(ranged[f.name]) or choices(ranged[f.name]) or next(
            (m.describe() for m in _markers(ranged[f.name])[1] if isinstance(m, OneOf)), None)
        lines += [f"    # allowed: {allowed}"] if allowed else []
    return lines


def _one_name_per_key(spelled: dict[tuple[str, ...], tuple[str, Any, bool]], key: tuple[str, ...], written: str,
                      value: Any, old_name: bool, where: str) -> None:
    """Refuse an old and a new name of one key given different values among one set of overrides, as a YAML file
    refuses them (``molrl.config.renames.renamed``); ``spelled`` records each key's spelling."""
    if key in spelled:
        other, other_value, other_old = spelled[key]
        if other != written and (old_name or other_old) and other_value != value:
            old, new = (written, other) if old_name else (other, written)
            raise ConfigError(f"{where}: {old} is the old name of {new} and both are set; keep {new}")
    spelled[key] = (written, value, old_name)


def override_key(cls: type, item: str) -> tuple[tuple[str, ...], Any]:
    """The key one ``key.sub=value`` override sets, under ``cls``'s current names with a block's shorthand written
    out (``model=PATH``: ``model.path``), and its value; an empty key for a retired one."""
    written = _apply_override({}, item, cls, [])
    return (written[0], written[2]) if written is not None else ((), None)


def _apply_override(data: dict[str, Any], item: str, cls: type | None = None,
                    moved: list[str] | None = None) -> tuple[tuple[str, ...], str, Any, bool] | None:
    """Set one ``key.sub=value`` in ``data``, the key under ``cls``'s current names (old ones added to ``moved``);
    returns the key it set (a block's shorthand written out), the key as written, the value and whether it was an
    old name (None for a retired key, which is dropped)."""
    moved = moved if moved is not None else []
    noted = len(moved)
    if "=" not in item:
        raise ConfigError(f"override {item!r}: expected key.sub=value")
    key, raw = item.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override {item!r}: empty key segment")
    try:
        value = parse_yaml(raw, f"override {key.strip()}=...") if raw.strip() else ""
    except NotYaml:
        value = raw
    if cls is not None:
        parts, value = renamed_path(cls, parts, value, item, moved)
        if not parts:  # a retired key: read and dropped
            return None
    node, section = data, cls
    for part in parts[:-1]:
        child = node.get(part)
        section = _section_type(section, part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict) and section is not None:
            child = node[part] = shorthand(section, child)  # model=PATH, then model.dtype=...
        if not isinstance(child, dict):
            raise ConfigError(f"override {item!r}: {part!r} is a value, not a section")
        node = child
    short = getattr(_section_type(section, parts[-1]), "SHORTHAND", None)
    if short is not None and isinstance(node.get(parts[-1]), dict) and not isinstance(value, dict):
        node[parts[-1]] = {**node[parts[-1]], short: value}  # data.mbpp=FILE over a written-out block sets its path
    else:
        node[parts[-1]] = value
    full = (*parts, short) if short is not None and not isinstance(value, dict) else tuple(parts)
    return full, key.strip(), value, len(moved) > noted


def _section_type(cls: Any, key: str) -> Any:
    """The type of section ``key`` of ``cls``: a dataclass's field that is a dataclass, or an entry of a mapping of
    dataclasses (``data.NAME`` of eval); None for anything else."""
    if typing.get_origin(cls) is dict:
        tp = (typing.get_args(cls) or (None, None))[-1]
    elif cls is not None and dataclasses.is_dataclass(cls):
        tp = unoptional(typing.get_type_hints(cls).get(key))
    else:
        return None
    return tp if dataclasses.is_dataclass(tp) or typing.get_origin(tp) is dict else None


def _build(cls: type[T], data: Any, prefix: str, where: str, base: Any = None) -> T:
    """``cls`` from ``data``; a key ``data`` leaves out takes ``base``'s value (the section's default as its parent
    declares it, e.g. ``RlConfig.episode``'s one solution), else the class's own default."""
    name = prefix.rstrip(".") or "<top>"
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: {name} must be a mapping, got {type(data).__name__}")
    data = renamed(cls, data, prefix, where)
    hints = typing.get_type_hints(cls)
    ranged = typing.get_type_hints(cls, include_extras=True)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        inside = [f"'{prefix}{key}'" for key in keys_named(cls, unknown[0])]
        hint = f"; did you mean {' or '.join(inside)}?" if inside else ""
        raise ConfigError(
            f"{where}: unknown key '{prefix}{unknown[0]}'{hint}; known keys in {name}: {', '.join(sorted(fields))}"
        )
    kwargs = {}
    for key, value in data.items():
        try:
            kwargs[key] = _coerce(hints[key], value, f"{prefix}{key}", where,
                                  getattr(base, key) if base is not None else _factory_default(fields[key]))
        except ConfigError as err:
            allowed = _allowed(ranged[key])
            if allowed and "allowed:" not in str(err):
                raise ConfigError(f"{err}; allowed: {allowed}") from None
            raise
        _check_range(ranged[key], kwargs[key], f"{prefix}{key}", where)  # before __post_init__ reads the value
    if base is not None:  # a section given in part keeps the rest of its declared default
        kwargs.update({k: copy.deepcopy(getattr(base, k)) for k in fields if k not in kwargs})
    try:
        return cls(**kwargs)
    except TypeError as err:
        raise ConfigError(f"{where}: {name}: {err}") from None
    except ValueError as err:  # __post_init__ validation
        raise ConfigError(f"{where}: {name}: {err}") from None


def keys_named(cls: Any, name: str, prefix: str = "") -> list[str]:
    """The dotted keys inside the sections of ``cls`` (nested too) whose last part is ``name``: where a key given at
    the wrong level lives (``max_new_tokens`` -> ``sampling.max_new_tokens``)."""
    found = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        section = unoptional(hints[f.name])
        if dataclasses.is_dataclass(section):
            found += [f"{prefix}{f.name}.{name}"] if name in {g.name for g in dataclasses.fields(section)} else []
            found += keys_named(section, name, f"{prefix}{f.name}.")
    return found


def _factory_default(f: dataclasses.Field) -> Any:
    """A section field's default made by its ``default_factory`` (None for any other field)."""
    if f.default_factory is dataclasses.MISSING:  # type: ignore[misc]
        return None
    made = f.default_factory()  # type: ignore[misc]
    return made if dataclasses.is_dataclass(made) else None


def _coerce(tp: Any, value: Any, key: str, where: str, base: Any = None) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, prefix=key + ".", where=where,
                      base=base if dataclasses.is_dataclass(base) and isinstance(base, tp) else None)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        if len([a for a in args if a is not type(None)]) == 1:  # an optional: its one type's own error
            return _coerce(unoptional(tp), value, key, where, base)
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(arg, value, key, where, base)
            except ConfigError:
                pass
        raise ConfigError(f"{where}: {key}={_shown(value)} matches none of {_type_name(tp)}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{where}: {key}={value!r}; expected one of {', '.join(map(repr, args))}")
        return value
    if origin in (list, Sequence, tuple):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: {key} must be a list, got {value!r}")
        inner = args[0] if args else Any
        out = [_coerce(inner, v, f"{key}[{i}]", where) for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: {key} must be a mapping, got {value!r}")
        inner = args[1] if len(args) == 2 else Any
        return {str(k): _coerce(inner, v, f"{key}.{k}", where) for k, v in value.items()}
    return _coerce_scalar(tp, value, key, where)


def _coerce_scalar(tp: Any, value: Any, key: str, where: str) -> Any:
    """``value`` as the scalar type ``tp`` (Any, bool, int, float, str or Path), or a ConfigError naming ``key``."""
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: {key} must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: {key} must be an integer, got {value!r}")
    if tp is float:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_FLOAT_INT:
            raise ConfigError(f"{where}: {key}={_shown(value)} is out of range")  # float() would overflow
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{where}: {key} must be a number, got {value!r}")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{where}: {key} must be a string, got {value!r}")
    if tp is Path:
        if isinstance(value, (str, Path)):
            return Path(value)
        raise ConfigError(f"{where}: {key} must be a path, got {value!r}")
    raise ConfigError(f"{where}: {key}: unsupported config type {_type_name(tp)}")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")
