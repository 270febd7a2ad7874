"""The bounded schema of ``molrl_provenance.json`` (and of ``trained_on.json``, the record before it): what a file may
hold, checked once where it is read (``molrl.records.provenance.read_provenance``) and before one is written.

A file arrives from outside: a copy, a download, a hand edit. It is read within bounds, and each way it can be wrong is
one ``RecordError`` saying where in the record (``lineage[0].stage``) and what was found:

- size: at most ``MAX_BYTES``; the bytes UTF-8 (a byte-order mark is not JSON), no string holding a lone surrogate;
- JSON: one object, no ``NaN`` or ``Infinity``, no key twice; nesting past what the parser follows is refused as
  such, and any nesting past ``MAX_DEPTH`` is a value of the wrong type where it appears;
- types: ``base`` an object of ``model``, ``path`` and ``fingerprint`` strings; ``lineage`` a list of ``{stage,
  config, date}`` strings, ``stage`` one of ``STAGES``; ``tasks`` a list of ``{benchmark, split, id, key}``
  (``split`` and ``key`` may be null); ``keys`` a list of content keys (16 hex digits); ``texts`` (optional: records
  made before it lack it) an object from content key to a list of task texts; no other field. A name, id or date is at
  most ``MAX_NAME`` characters, a task's text ``MAX_TEXT``.

This module imports no torch.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

MAX_BYTES = 128 << 20
"""The largest record read (and written): tens of thousands of task texts fit."""
MAX_DEPTH = 3
"""How deep a record nests: the top object, a field's list or object, a lineage step or task or text list."""
MAX_NAME = 4096
"""The longest model name, path, fingerprint, stage, date, benchmark, split or id."""
MAX_TEXT = 1 << 20
"""The longest task text a record keeps (a longer one is cut to it when the record is made)."""
STAGES = ("mol", "rl", "export", "gguf", "trained")
"""The lineage steps a record may name (``trained``: a run recorded in ``trained_on.json``, its stage not kept)."""
FIELDS = ("base", "lineage", "tasks", "keys", "texts")
"""The fields of a record; all but ``texts`` required."""
BASE_FIELDS = ("model", "path", "fingerprint")
"""The fields ``base`` may hold."""
STEP_FIELDS = ("stage", "config", "date")
"""The fields of a lineage step."""
TASK_FIELDS = ("benchmark", "split", "id", "key")
"""The fields of a task trained on (``split`` and ``key`` may be null)."""
_KEY = re.compile(r"[0-9a-f]{16}")


class RecordError(ValueError):
    """A record file that breaks the schema: the message says where in it and what was found."""


def load_json(path: Path, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value in ``path``, read within bounds: at most ``MAX_BYTES``, UTF-8, no ``NaN``/``Infinity``, no key
    twice, nested no deeper than the parser follows (``max_depth``, how deep the file's record nests, is named)."""
    with path.open("rb") as handle:
        raw = handle.read(MAX_BYTES + 1) if path.stat().st_size <= MAX_BYTES else b""
    if path.stat().st_size > MAX_BYTES or len(raw) > MAX_BYTES:  # a file growing while read is caught by the second
        raise RecordError(f"larger than {MAX_BYTES >> 20} MiB, the most a record holds")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise RecordError(f"not UTF-8 (byte {err.start} is 0x{raw[err.start]:02x})") from None
    try:
        data = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_no_repeat)
    except RecursionError:
        raise RecordError(f"nested deeper than a JSON parser follows; a record nests at most {max_depth} deep") \
            from None
    except RecordError:  # a constant or a repeated key
        raise
    except ValueError as err:  # JSONDecodeError, a number too long to read
        raise RecordError(f"not JSON: {err}") from None
    return data


def check_record(data: Any) -> dict[str, Any]:
    """``data`` (a parsed ``molrl_provenance.json``) checked against the schema, ``texts`` filled in when absent."""
    _object(data, "the file", FIELDS, required=FIELDS[:-1])
    _object(data["base"], "base", BASE_FIELDS)
    for name in data["base"]:
        _string(data["base"][name], f"base.{name}")
    for i, step in enumerate(_list(data["lineage"], "lineage")):
        _object(step, f"lineage[{i}]", STEP_FIELDS, required=STEP_FIELDS)
        for name in STEP_FIELDS:
            _string(step[name], f"lineage[{i}].{name}")
        if step["stage"] not in STAGES:
            raise RecordError(f"lineage[{i}].stage is {_shown(step['stage'])}; expected one of {', '.join(STAGES)}")
    for i, task in enumerate(_list(data["tasks"], "tasks")):
        _object(task, f"tasks[{i}]", TASK_FIELDS, required=("benchmark", "id"))
        _string(task["benchmark"], f"tasks[{i}].benchmark")
        _string(task["id"], f"tasks[{i}].id")
        if task.get("split") is not None:
            _string(task["split"], f"tasks[{i}].split")
        if task.get("key") is not None:
            _key(task["key"], f"tasks[{i}].key")
    for i, key in enumerate(_list(data["keys"], "keys")):
        _key(key, f"keys[{i}]")
    texts = data.setdefault("texts", {})
    _object(texts, "texts", None)
    for key, items in texts.items():
        _key(key, f"texts key {_shown(key)}")
        for i, text in enumerate(_list(items, f"texts[{key}]")):
            _string(text, f"texts[{key}][{i}]", MAX_TEXT)
    return data


def check_legacy(data: Any) -> dict[str, dict[str, list[str]]]:
    """``data`` (a parsed ``trained_on.json``: ``{"benchmarks": {name: {split: [ids]}}}``) checked; its benchmarks."""
    _object(data, "the file", ("benchmarks",), required=("benchmarks",))
    _object(data["benchmarks"], "benchmarks", None)
    for name, splits in data["benchmarks"].items():
        _string(name, f"benchmarks key {_shown(name)}")
        _object(splits, f"benchmarks.{name}", None)
        for split, ids in splits.items():
            _string(split, f"benchmarks.{name} key {_shown(split)}")
            for i, task_id in enumerate(_list(ids, f"benchmarks.{name}.{split}")):
                if isinstance(task_id, bool) or not isinstance(task_id, (str, int)):
                    raise RecordError(f"benchmarks.{name}.{split}[{i}] is {_kind(task_id)}; expected a task id")
                _string(str(task_id), f"benchmarks.{name}.{split}[{i}]")
    return data["benchmarks"]


def _object(value: Any, where: str, fields: tuple[str, ...] | None, required: tuple[str, ...] = ()) -> None:
    """Refuse ``value`` unless it is an object with the ``required`` fields and no field outside ``fields``."""
    if not isinstance(value, dict):
        raise RecordError(f"{where} is {_kind(value)}; expected an object")
    missing = [name for name in required if name not in value]
    if missing:
        raise RecordError(f"{where} has no {missing[0]!r} field")
    other = [name for name in value if fields is not None and name not in fields]
    if other:
        raise RecordError(f"{where} has the field {_shown(other[0])}; expected only {', '.join(fields or ())}")


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise RecordError(f"{where} is {_kind(value)}; expected a list")
    return value


def _string(value: Any, where: str, limit: int = MAX_NAME) -> None:
    """Refuse ``value`` unless it is a string of at most ``limit`` characters that UTF-8 can hold."""
    if not isinstance(value, str):
        raise RecordError(f"{where} is {_kind(value)}; expected a string")
    if len(value) > limit:
        raise RecordError(f"{where} is {len(value)} characters long; at most {limit}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise RecordError(f"{where} holds a lone surrogate, which no text file holds") from None


def _key(value: Any, where: str) -> None:
    _string(value, where)
    if not _KEY.fullmatch(value):
        raise RecordError(f"{where} is {_shown(value)}; expected a content key (16 hex digits)")


def _kind(value: Any) -> str:
    """What a JSON value is, in words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, (int, float)):
        return f"a number ({_shown(value)})"
    if isinstance(value, str):
        return f"a string ({_shown(value)})"
    return "a list" if isinstance(value, list) else "an object"


def _shown(value: Any) -> str:
    """``value`` as a short, one-line repr."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _no_constant(name: str) -> Any:
    raise RecordError(f"{name} is not a number a record holds")


def _no_repeat(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data = dict(pairs)
    if len(data) < len(pairs):
        seen: set[str] = set()
        repeated = next(name for name, _ in pairs if name in seen or seen.add(name))
        raise RecordError(f"the key {_shown(repeated)} appears twice in one object")
    return data
