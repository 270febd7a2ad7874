"""Values crossing the sandbox boundary, serialised with their exact types.

``encode`` runs inside the sandbox on whatever the model's code returned; ``decode`` runs in the
caller and only ever builds plain builtins (never calls anything the sandbox defined), so a value
coming back cannot carry behaviour: an object whose ``__eq__`` always returns True, or an ``int``
subclass with a custom ``__eq__``, comes back as an ``Opaque`` record that equals nothing.
"""

from __future__ import annotations

import math
import sys
from collections import Counter, OrderedDict, defaultdict
from typing import Any

MAX_DEPTH = 64
"""Nesting beyond this is encoded as opaque (the caller never recurses without bound)."""
MAX_ITEMS = 200_000
"""Total number of encoded nodes per value; larger values are encoded as opaque."""
MAX_COLLIDING_PAIRS = 100_000
"""Pairs of items with equal hashes that one decoded set or dict may hold: building it costs a
comparison per pair, so a value made to collide (multiples of 2**61 - 1 all hash to 0) would
take quadratic time in the caller. Beyond this the value is refused as malformed."""

_DICT_TYPES = (dict, OrderedDict, defaultdict, Counter)
_BUILTIN_TYPES = {t.__name__: t for t in (int, float, complex, str, bytes, bool, list, tuple, dict, set, frozenset, object)}


class Opaque:
    """A returned value that has no exact plain-data form; it is equal to nothing."""

    __slots__ = ("type_name", "text")

    def __init__(self, type_name: str, text: str):
        self.type_name = type_name
        self.text = text

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"<opaque {self.type_name}: {self.text}>"


class EncodeBudget(Exception):
    """The value is too large or too deep to encode."""


def _numpy_scalar(value: Any) -> Any:
    """The builtin equivalent of a numpy scalar, or None when ``value`` is not one."""
    np = sys.modules.get("numpy")
    if np is not None and type(value).__module__ == "numpy" and isinstance(value, np.generic):
        item = value.item()
        if type(item) in (bool, int, float, complex, str, bytes):
            return item
    return None


def _type_name(value: Any) -> str:
    try:
        return f"{type(value).__module__}.{type(value).__qualname__}"
    except Exception:  # a hostile metaclass
        return "?"


def encode(value: Any, _depth: int = 0, _budget: list[int] | None = None) -> dict:
    """``value`` as JSON-able data tagged with its exact type (opaque when it has no such form)."""
    budget = [MAX_ITEMS] if _budget is None else _budget
    try:
        return _encode(value, _depth, budget)
    except EncodeBudget:
        if _depth:
            raise
        return {"t": "opaque", "type": _type_name(value), "repr": "value too large or too deep"}


def _encode(value: Any, depth: int, budget: list[int]) -> dict:
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        raise EncodeBudget()
    kind = type(value)
    if value is None:
        return {"t": "none"}
    if kind is bool:
        return {"t": "bool", "v": value}
    if kind is int:
        return {"t": "int", "v": int.__repr__(value)}
    if kind is float:
        return {"t": "float", "v": float.__repr__(value)}
    if kind is complex:
        return {"t": "complex", "re": float.__repr__(value.real), "im": float.__repr__(value.imag)}
    if kind is str:
        return {"t": "str", "v": str.__str__(value)}
    if kind is bytes:
        return {"t": "bytes", "v": bytes.hex(value)}
    if kind in (list, tuple, set, frozenset):
        items = [_encode(item, depth + 1, budget) for item in kind.__iter__(value)]
        return {"t": kind.__name__, "v": items}
    if kind in _DICT_TYPES:
        pairs = [[_encode(k, depth + 1, budget), _encode(v, depth + 1, budget)] for k, v in dict.items(value)]
        return {"t": "dict", "v": pairs}
    if kind is type and value in _BUILTIN_TYPES.values():
        return {"t": "type", "v": value.__name__}
    scalar = _numpy_scalar(value)
    if scalar is not None:
        return _encode(scalar, depth, budget)
    try:
        text = repr(value)[:200]
    except BaseException:  # noqa: BLE001 - a hostile __repr__
        text = "?"
    return {"t": "opaque", "type": _type_name(value), "repr": text}


def decode(data: Any, _depth: int = 0) -> Any:
    """The plain value ``encode`` described; malformed data raises ``ValueError``."""
    if _depth > MAX_DEPTH + 1 or not isinstance(data, dict):
        raise ValueError("malformed encoded value")
    tag = data.get("t")
    v = data.get("v")
    if tag == "none":
        return None
    if tag == "bool" and isinstance(v, bool):
        return v
    if tag == "int" and isinstance(v, str) and len(v) <= 5000:
        return int(v)
    if tag == "float" and isinstance(v, str):
        return float(v)
    if tag == "complex":
        return complex(float(data["re"]), float(data["im"]))
    if tag == "str" and isinstance(v, str):
        return v
    if tag == "bytes" and isinstance(v, str):
        return bytes.fromhex(v)
    if tag in ("list", "tuple", "set", "frozenset") and isinstance(v, list):
        items = [decode(item, _depth + 1) for item in v]
        if tag in ("set", "frozenset"):
            _check_hashes(items, tag)
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
    if tag == "dict" and isinstance(v, list):
        pairs = [(decode(k, _depth + 1), decode(val, _depth + 1)) for k, val in v]
        _check_hashes([k for k, _ in pairs], "dict")
        return dict(pairs)
    if tag == "type" and v in _BUILTIN_TYPES:
        return _BUILTIN_TYPES[v]
    if tag == "opaque":
        return Opaque(str(data.get("type", "?")), str(data.get("repr", ""))[:200])
    raise ValueError(f"malformed encoded value with tag {tag!r}")


def _check_hashes(items: list, kind: str) -> None:
    """Refuse items whose equal hashes would make building a set or dict of them quadratic."""
    if len(items) < 2:
        return
    groups = Counter(map(hash, items))  # hash values are ints that hash to themselves: no collisions here
    pairs = sum(n * (n - 1) // 2 for n in groups.values() if n > 1)
    if pairs > MAX_COLLIDING_PAIRS:
        raise ValueError(f"{kind} of {len(items)} items with {len(items) - len(groups)} hash collisions "
                         f"({pairs} colliding pairs, at most {MAX_COLLIDING_PAIRS} accepted)")


def is_nan(value: Any) -> bool:
    """True for a float NaN."""
    return type(value) is float and math.isnan(value)
