"""Records which config keys a run reads: every dataclass instance of a config tree is given a subclass of its own
class whose attribute reads are noted under the key's dotted path (``tests/test_keys_honoured.py``)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import sys
from typing import Any, Callable

GENERIC = ("/dataclasses.py", "/copy.py", "/copyreg.py", "<string>", "/molrl/config/__init__.py", "/molrl/config/ranges.py",
           "/molrl/config/renames.py", "/reprlib.py", "/pprint.py")
"""Callers that read every field of a config alike (copies, equality, repr, to_dict, range checks): their reads say
nothing about what a stage honours."""


class Reads:
    """The keys read through the watched configs."""

    run: set[str] | None = None
    """The keys read while one run goes on (``one_run``), through any ``Reads``: a config copied into another type
    is watched by the ``Reads`` that patched the copy, whichever stage's run reads it."""

    @staticmethod
    @contextlib.contextmanager
    def one_run():
        """The keys read, through any ``Reads``, while the block runs."""
        keys: set[str] = set()
        Reads.run = keys
        try:
            yield keys
        finally:
            Reads.run = None

    def __init__(self) -> None:
        self.keys: set[str] = set()
        self.quiet = 0
        self.subclasses: dict[tuple[type, str], type] = {}

    @contextlib.contextmanager
    def paused(self):
        """Reads inside this block are not noted (a copy of the config into another type)."""
        self.quiet += 1
        try:
            yield
        finally:
            self.quiet -= 1

    def watch(self, obj: Any, path: str = "") -> Any:
        """``obj`` with every config dataclass under it recording its reads (in place); returns it."""
        if isinstance(obj, (list, tuple)):
            for item in obj:
                self.watch(item, path)
        elif isinstance(obj, dict):
            for key, value in obj.items():
                self.watch(value, f"{path}{key}.")
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type) and "_reads_path" not in type(obj).__dict__:
            for f in dataclasses.fields(obj):
                self.watch(object.__getattribute__(obj, f.name), f"{path}{f.name}.")
            object.__setattr__(obj, "__class__", self.recording(type(obj), path))
        return obj

    def recording(self, cls: type, path: str) -> type:
        """The subclass of ``cls`` whose instances note reads under ``path``: equal to, copied and pickled as
        ``cls``'s."""
        if (cls, path) in self.subclasses:
            return self.subclasses[(cls, path)]
        names, reads = {f.name for f in dataclasses.fields(cls)}, self

        def plain(obj: Any) -> Any:
            new = object.__new__(cls)
            try:
                state = dict(object.__getattribute__(obj, "__dict__"))
            except AttributeError:  # a slotted config holds its fields only
                state = {}
            for name in names:
                state[name] = object.__getattribute__(obj, name)
            for name, value in state.items():
                object.__setattr__(new, name, value)
            return new

        def getattribute(obj: Any, name: str) -> Any:
            if name in names and not reads.quiet and not sys._getframe(1).f_code.co_filename.endswith(GENERIC):
                reads.keys.add(path + name)
                if Reads.run is not None:
                    Reads.run.add(path + name)
            return cls.__getattribute__(obj, name)

        def deepcopy(obj: Any, memo: dict) -> Any:
            dup = copy.deepcopy(plain(obj), memo)
            object.__setattr__(dup, "__class__", type(obj))
            return dup

        def eq(a: Any, b: Any) -> bool:
            return plain(a) == (plain(b) if isinstance(b, cls) and "_reads_path" in type(b).__dict__ else b)

        ns = {"__getattribute__": getattribute, "__deepcopy__": deepcopy, "__eq__": eq, "__hash__": cls.__hash__,
              "__reduce_ex__": lambda obj, protocol: (copy.copy, (plain(obj),)), "_reads_path": path}
        if "__slots__" in cls.__dict__:
            ns["__slots__"] = ()
        sub = self.subclasses[(cls, path)] = type(cls.__name__, (cls,), ns)
        return sub

    def through(self, monkeypatch: Any, function: Callable) -> None:
        """Make ``function`` (a config's copy into another type, e.g. ``episode_config``) read quietly and hand on
        its result watched under its first argument's path, wherever a module holds it."""
        def wrapper(source: Any, *args: Any, **kwargs: Any) -> Any:
            with self.paused():
                result = function(source, *args, **kwargs)
            path = type(source).__dict__.get("_reads_path")
            return self.watch(result, path) if path is not None else result

        for module in list(sys.modules.values()):
            if getattr(module, function.__name__, None) is function:
                monkeypatch.setattr(module, function.__name__, wrapper)
