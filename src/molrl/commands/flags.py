"""Command-line flags as shorthands of config keys: ``--out DIR`` is ``output_dir=DIR``, as ``model=PATH`` is
``model.path=PATH``.

A command lists its flags in one table (flag -> key); ``flag_items`` turns the flags given into ``key=value``
overrides, put before the explicit ones. A flag and its key given different values on one command line are refused
in one line naming both; the same value twice is one setting.
"""

from __future__ import annotations

import argparse
from typing import Any, Sequence

from molrl.errors import ConfigError


def flag_items(table: dict[str, str], args: argparse.Namespace) -> list[tuple[str, str]]:
    """(the flag as written, its ``key=value``) for each flag of ``table`` (its attribute -> its key) that ``args``
    holds."""
    out = []
    for attr, key in table.items():
        value = getattr(args, attr)
        if value is not None:
            out.append((f"--{attr.replace('_', '-')} {value}", f"{key}={value}"))
    return out


def refuse_clashes(cls: type, flagged: Sequence[tuple[str, str]], overrides: Sequence[str]) -> None:
    """Refuse an explicit override that sets a flag's key (under any of its names) to another value."""
    from molrl.config import override_key

    for written, item in flagged:
        key, value = override_key(cls, item)
        for other in overrides:
            other_key, other_value = override_key(cls, other)
            same = _within(other_key, other_value, key)
            if other_key and same is not _ABSENT and same != value:
                raise ConfigError(f"command line: {written} and {other} set {'.'.join(key)} to different values; "
                                  f"keep one of them")


_ABSENT = object()


def _within(key: tuple[str, ...], value: Any, inner: tuple[str, ...]) -> Any:
    """What setting ``key`` to ``value`` sets ``inner`` to: the value itself, or the part of a section given whole
    (``model={path: M}`` for ``model.path``); ``_ABSENT`` where it leaves ``inner`` alone."""
    if inner[: len(key)] != key:
        return _ABSENT
    for part in inner[len(key):]:
        if not isinstance(value, dict) or part not in value:
            return _ABSENT
        value = value[part]
    return value
