"""Renamed config keys: old names read under the new ones, in a YAML file, an override and a saved config.

A config class may list keys it renamed in ``RENAMED_KEYS`` (old name -> (new name, how an old value
converts); either name may be dotted, for a key that moved into or out of a section, and ``*`` stands for each
entry of a mapping: ``custom.*`` -> ``data.*.spec``). ``molrl.config``
reads every mapping and override through ``renamed`` and ``renamed_path``: old configs keep loading, with
one line naming the new keys. ``current_names`` reads a saved config the same way, quietly, so a run saved
under the old names is the same run under the new ones.

A class may list in ``JOINED_KEYS`` old keys that are read together as other keys (``Joined``: rl's ``engine_mode:
server`` with ``engine_server_url: URL`` is ``engine: vllm_server`` with ``engine_servers: [URL]``): its ``convert``
returns the new keys' values and the note, or refuses in one line where the old keys meant something the new ones
cannot say.

A class may also list in ``RETIRED_KEYS`` keys it dropped because they never had an effect (old name -> why): an old
config that sets one still loads, the key named in the same line, and a saved run that holds one is the same run. A
key the stage only ever took one way (``Retired``: rl's ``lora.enabled`` true) loads so, and any other value is refused
as it always was. An old key given beside its new name with the same value (a saved config that held both) is read once;
a section given under both names (rl's ``rollout.episode`` beside ``episode``) is one section, key by key.
"""

from __future__ import annotations

import dataclasses
import logging
import types
import typing
from pathlib import Path
from typing import Any

from molrl.errors import ConfigError

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Retired:
    """A ``RETIRED_KEYS`` entry for a key whose only values the stage took are ``only`` (others were refused)."""

    why: str
    """Why the key is gone, and what to set instead."""
    only: tuple[Any, ...]
    """The values a saved or old config may hold, dropped as they load; any other is refused."""


@dataclasses.dataclass(frozen=True)
class Joined:
    """A ``JOINED_KEYS`` entry: old keys read together as new ones."""

    old: tuple[str, ...]
    """The old keys (top-level or dotted), any of which may be given."""
    convert: Any
    """``(given, data, where) -> (new keys' values, note)``: ``given`` the old keys given, ``data`` the config's mapping
    (read, never changed); raises ``ConfigError`` in one line where no faithful reading exists."""


def joined(cls: type, data: dict[str, Any], where: str) -> list[str]:
    """Read the old keys of ``cls.JOINED_KEYS`` that ``data`` holds as their new keys, in place; the notes."""
    notes = []
    for entry in getattr(cls, "JOINED_KEYS", ()):
        given = {key: _pop(data, key) for key in entry.old if _has(data, key)}
        if not given:
            continue
        new, note = entry.convert(given, data, where)
        for key, value in new.items():
            _put(data, key, value)
        notes.append(note)
    return notes


def retired_why(entry: str | Retired, key: str, value: Any, where: str) -> str:
    """Why retired ``key`` (set to ``value`` in ``where``) is dropped; a value it never took is refused."""
    if isinstance(entry, str):
        return entry
    if value not in entry.only:
        raise ConfigError(f"{where}: {key}={value!r}: {entry.why}; remove it")
    return entry.why


def unoptional(tp: Any) -> Any:
    """``X`` for ``X | None`` (and ``Optional[X]``); any other type as it is."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def renamed(cls: type, data: dict[str, Any], prefix: str, where: str, note: bool = True) -> dict[str, Any]:
    """``data`` with each old key of ``cls.RENAMED_KEYS`` moved to its new name, its value converted; ``note``
    logs one line naming them."""
    data = _copy_sections(_expanded(cls, data))
    table, retired = _concrete(getattr(cls, "RENAMED_KEYS", {}), data), getattr(cls, "RETIRED_KEYS", {})
    together = [key for entry in getattr(cls, "JOINED_KEYS", ()) for key in entry.old]
    if not any(_has(data, old) for old in (*retired, *table, *together)):
        return data
    moved = []
    for old, entry in retired.items():
        if _has(data, old):
            why = retired_why(entry, f"{prefix}{old}", _pop(data, old), where)
            moved.append(f"{prefix}{old} dropped ({why})")
    for old, (new, convert) in table.items():
        if not _has(data, old):
            continue
        value = _pop(data, old)
        try:
            converted = convert(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: {prefix}{old}={value!r} cannot be read as {prefix}{new}; "
                              f"set {prefix}{new}") from None
        if _has(data, new):
            if _get(data, new) == converted:
                moved.append(f"{prefix}{old} (the same as {prefix}{new})")
                continue
            clash = _clash(converted, _get(data, new))
            if clash is not None:
                raise ConfigError(f"{where}: {prefix}{old}{clash} is the old name of {prefix}{new}{clash} and both are "
                                  f"set; keep {prefix}{new}{clash}")
            converted = _merged(_get(data, new), converted)  # a section given under both names, no key twice
            _pop(data, new)
        try:
            _put(data, new, converted)
        except ValueError:
            raise ConfigError(f"{where}: {prefix}{old}={value!r} cannot be read as {prefix}{new}; "
                              f"set {prefix}{new}") from None
        moved.append(_moved(f"{prefix}{old}", f"{prefix}{new}", value, converted))
    moved += joined(cls, data, where)
    if note:
        note_renames(where, moved)
    return data


def _clash(old: Any, new: Any) -> str | None:
    """Where a value given under an old name differs from the one under its new name: ``""`` for the value itself,
    ``".key"`` for the first key of a section that both hold with different values, None where the two sections
    hold different keys only (they merge)."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return None if old == new else ""
    for key in old.keys() & new.keys():
        inner = _clash(old[key], new[key])
        if inner is not None:
            return f".{key}{inner}"
    return None


def _merged(new: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    """Section ``new`` with the keys of ``old`` (given under the section's old name) that it does not hold."""
    out = dict(new)
    for key, value in old.items():
        out[key] = _merged(out[key], value) if isinstance(out.get(key), dict) and isinstance(value, dict) else \
            out.get(key, value)
    return out


def _concrete(table: dict[str, tuple[str, Any]], data: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """``table`` with each key that names a mapping's entries by ``*`` (``custom.*`` -> ``data.*.spec``) written out
    for the entries ``data`` holds (``custom.qa`` -> ``data.qa.spec``)."""
    out = {}
    for old, (new, convert) in table.items():
        if "*" not in old:
            out[old] = (new, convert)
            continue
        section = old.partition(".*")[0]
        entries = _get(data, section) if _has(data, section) else None
        if entries == {}:  # an empty old mapping (a saved config's default) moves nothing: read as absent
            _pop(data, section)
        for name in entries if isinstance(entries, dict) else ():
            out[old.replace("*", str(name))] = (new.replace("*", str(name)), convert)
    return out


def _matches(old_parts: list[str], parts: list[str]) -> bool:
    """Whether an override's key ``parts`` start with the renamed key ``old_parts`` (``*`` matching any name)."""
    return len(parts) >= len(old_parts) and all(o in ("*", p) for o, p in zip(old_parts, parts))


def renamed_path(cls: type, parts: list[str], value: Any, item: str, moved: list[str]) -> tuple[list[str], Any]:
    """An override's key ``parts`` (and its value) under the current names of ``cls`` and of its sections; no parts
    for a retired key (``RETIRED_KEYS``), which is dropped."""
    done: list[str] = []
    while parts and dataclasses.is_dataclass(cls):
        for old, entry in getattr(cls, "RETIRED_KEYS", {}).items():
            if parts[: len(old.split("."))] == old.split("."):
                key = ".".join(done + old.split("."))
                moved.append(f"{key} dropped ({retired_why(entry, key, value, f'override {item!r}')})")
                return [], value
        for old, (new, convert) in getattr(cls, "RENAMED_KEYS", {}).items():
            old_parts = old.split(".")
            if not _matches(old_parts, parts):
                continue
            if "*" in old_parts:
                new = new.replace("*", parts[old_parts.index("*")])
            before = value
            if len(parts) == len(old_parts):
                try:
                    value = convert(value)
                except (TypeError, ValueError):
                    raise ConfigError(f"override {item!r}: {value!r} cannot be read as {'.'.join(done + [new])}; "
                                      f"set {'.'.join(done + [new])}") from None
            renamed_parts = [*new.split("."), *parts[len(old_parts):]]
            moved.append(_moved(".".join(done + parts), ".".join(done + renamed_parts), before, value))
            parts = renamed_parts
            break
        head, parts = parts[0], parts[1:]
        done.append(head)
        cls = field_class(cls, head)
    return done + parts, value


def _moved(old: str, new: str, value: Any, converted: Any) -> str:
    return f"{old} -> {new}" if converted == value else f"{old}={value!r} -> {new}={converted!r}"


def note_renames(where: str, moved: list[str]) -> None:
    """One line naming the old keys read under their new names (once per distinct line)."""
    fix = "rename them (remove the dropped ones)" if any(" dropped (" in m for m in moved) else "rename them"
    line = f"{where}: old key names, read as the new ones: {', '.join(moved)}; {fix} to silence this"
    if moved and line not in _NOTED:
        _NOTED.add(line)
        log.warning("%s", line)


_NOTED: set[str] = set()
"""The rename notes logged so far in this process: the pipeline builds each stage's config more than once, and its
old keys are noted once."""


def current_names(cls: type, data: Any) -> Any:
    """A config as saved (plain data) with every old key of ``cls`` and of its sections under its current name,
    quietly: how a run saved before a rename compares with the same run now."""
    return current(cls, data, "", "saved config", note=False)


def current(cls: type, data: Any, prefix: str, where: str, note: bool) -> Any:
    if not isinstance(data, dict) or not dataclasses.is_dataclass(cls):
        return data
    data = dict(renamed(cls, data, prefix, where, note))
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in data:
            data[f.name] = current(section_class(f) or unoptional(hints[f.name]), data[f.name], f"{prefix}{f.name}.",
                                   where, note)
    return data


def field_class(cls: type, name: str) -> Any:
    """The type whose current names field ``name`` of dataclass ``cls`` is read under: its ``section_class`` or its
    declared type."""
    found = next((f for f in dataclasses.fields(cls) if f.name == name), None)  # type: ignore[arg-type]
    return (section_class(found) if found is not None else None) or unoptional(typing.get_type_hints(cls).get(name))


def section_class(f: dataclasses.Field) -> type | None:
    """The config class a mapping field holds the settings of (its ``metadata["config"]``, ``"module:Class"``, read
    on use): a pipeline's ``rl`` section is read under ``RlConfig``'s current names file by file, so a user file's
    old name overrides its base's new one as any key does."""
    spec = f.metadata.get("config")
    if not spec:
        return None
    import importlib

    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _expanded(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with each block given by its shorthand (``model: PATH``) written out (``molrl.config.blocks``)."""
    if not dataclasses.is_dataclass(cls):
        return data
    hints = typing.get_type_hints(cls)
    out = data
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in data:
            value = shorthand(unoptional(hints[f.name]), data[f.name])
            if value is not data[f.name]:
                out = dict(out) if out is data else out
                out[f.name] = value
    return out


def shorthand(cls: Any, value: Any) -> Any:
    """``value`` as section ``cls``: a plain string (or path) given for a block with a ``SHORTHAND`` key becomes
    ``{SHORTHAND: value}`` (``model: PATH`` -> ``model: {path: PATH}``), and so does each value of a mapping of such
    blocks (eval's ``data: {NAME: FILE}``); anything else as it is."""
    if typing.get_origin(cls) is dict and isinstance(value, dict):
        entry = (typing.get_args(cls) or (None, None))[-1]
        if getattr(entry, "SHORTHAND", None) is not None:
            expanded = {k: shorthand(entry, v) for k, v in value.items()}
            return value if expanded == value else expanded
        return value
    key = getattr(cls, "SHORTHAND", None)
    if key is not None and isinstance(value, (str, Path)):
        return {key: str(value)}
    return value


def _has(data: dict[str, Any], dotted: str) -> bool:
    *sections, key = dotted.split(".")
    for name in sections:
        data = data.get(name)
        if not isinstance(data, dict):
            return False
    return key in data


def _get(data: dict[str, Any], dotted: str) -> Any:
    """The value of a dotted key (``_has`` it)."""
    for name in dotted.split("."):
        data = data[name]
    return data


def _pop(data: dict[str, Any], dotted: str) -> Any:
    """Remove a dotted key (``_has`` it), and a section it leaves empty."""
    name, _, rest = dotted.partition(".")
    if not rest:
        return data.pop(name)
    value = _pop(data[name], rest)
    if not data[name]:
        del data[name]
    return value


def _put(data: dict[str, Any], dotted: str, value: Any) -> None:
    *sections, key = dotted.split(".")
    for name in sections:
        data = data.setdefault(name, {})
        if not isinstance(data, dict):
            raise ValueError(f"{name} is a value, not a section")
    data[key] = value


def _copy_sections(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``data`` whose nested mappings are copies too (renaming moves keys between them)."""
    return {k: _copy_sections(v) if isinstance(v, dict) else v for k, v in data.items()}
