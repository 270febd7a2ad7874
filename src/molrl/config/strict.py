"""Every config object refuses an attribute it does not have, as the YAML loader refuses a key it does not know.

A dataclass accepts any attribute: ``cfg.rollout.turns = 3``, an old name, would run and leave
``cfg.episode.max_turns`` at 1. ``seal(root)`` (called once under each stage's config class) gives every non-frozen
section class reachable from ``root`` a ``__setattr__`` that refuses a name that is not one of its fields, in one line
naming the class, the key's new name when a stage renamed it (its ``RENAMED_KEYS``) and the keys it has. A frozen
section already refuses every assignment; a name starting with ``_`` (private state, a watcher's) is let through.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Iterator

_MOVED = "_molrl_moved_keys"
"""The class attribute holding, per sealed class, its old attribute names -> where each went."""


def sections(root: type, prefix: str = "") -> Iterator[tuple[type, str]]:
    """``root`` and every dataclass reachable through its fields' types (a union's or a list's too), each with the
    dotted prefix it sits under (the first path found)."""
    seen: set[type] = set()
    todo = [(root, prefix)]
    while todo:
        cls, where = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        yield cls, where
        for name, tp in typing.get_type_hints(cls).items():
            for inner in _dataclasses_in(tp):
                todo.append((inner, f"{where}{name}."))


def _dataclasses_in(tp: Any) -> Iterator[type]:
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        yield tp
    for arg in typing.get_args(tp):
        yield from _dataclasses_in(arg)


def seal(root: type) -> type:
    """Make ``root`` and its section classes refuse an unknown attribute; returns ``root``."""
    renamed = getattr(root, "RENAMED_KEYS", {})
    for cls, where in sections(root):
        if cls.__dataclass_params__.frozen:
            continue
        moved = dict(cls.__dict__.get(_MOVED, {}))
        for old, (new, _) in renamed.items():
            if old.startswith(where) and "." not in old[len(where):]:
                moved.setdefault(old[len(where):], f"{root.__name__}'s {old} is now {new}")
        setattr(cls, _MOVED, moved)
        cls.__setattr__ = _refuse_unknown
    return root


def _refuse_unknown(self: Any, name: str, value: Any) -> None:
    cls = type(self)
    if name.startswith("_") or name in cls.__dataclass_fields__ or isinstance(getattr(cls, name, None), property):
        object.__setattr__(self, name, value)
        return
    moved = next((c.__dict__[_MOVED][name] for c in cls.__mro__ if name in c.__dict__.get(_MOVED, {})), None)
    hint = f" ({moved})" if moved else ""
    raise AttributeError(f"{cls.__name__} has no key {name!r}{hint}; its keys: {', '.join(cls.__dataclass_fields__)}")
