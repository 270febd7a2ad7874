"""The RL algorithms by name: each a module with an ``Algorithm`` subclass (``molrl.rl.algorithms.base``).

The names are written once, in ``molrl.rl.algorithms.names``; ``ALGORITHMS`` maps each to its class, importing the
class's module when first asked. Adding one is a module, a line in ``names.ENTRIES`` and its config section
(``molrl.rl.config``); the trainer does not change.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Iterator

from molrl.rl.algorithms.names import ENTRIES


class _Algorithms(Mapping):
    """Name -> ``Algorithm`` subclass, over ``names.ENTRIES``; a class is imported when first looked up."""

    def __getitem__(self, name: str) -> type:
        entry = ENTRIES[name]
        return getattr(importlib.import_module(f"{__name__}.{entry.module}"), entry.cls)

    def __iter__(self) -> Iterator[str]:
        return iter(ENTRIES)

    def __len__(self) -> int:
        return len(ENTRIES)


ALGORITHMS = _Algorithms()
"""Algorithm name (``RlConfig.algorithm``) -> its class."""


def __getattr__(name: str) -> Any:
    if name == "Algorithm":  # the base class, imported when asked for (it needs torch)
        return importlib.import_module(f"{__name__}.base").Algorithm
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ALGORITHMS", "Algorithm"]
