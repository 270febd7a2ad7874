"""Comparisons that decide test verdicts, run in the caller on plain decoded values only."""

from __future__ import annotations

import math
from typing import Any

from molrl.sandbox.runtime.codec import Opaque


def values_equal(expected: Any, got: Any, rel_tol: float = 1e-9, abs_tol: float = 0.0) -> bool:
    """Python ``==`` on plain values, except that a float expected value matches within the tolerances.

    The tolerance applies only where the expected value is a float: an integer expected value is
    matched exactly, as the benchmark's own ``assert candidate(10) == 55`` does, so a float near
    an integer (``55.000000000000014`` from Binet's formula) is wrong while ``55.0`` is right.
    Containers must have the same type (as ``[1] == (1,)`` is False in Python); an ``Opaque`` value
    (something the sandbox could not express as plain data) equals nothing.
    """
    if isinstance(got, Opaque) or isinstance(expected, Opaque):
        return False
    numbers = (int, float)
    if type(expected) is float and isinstance(got, numbers):
        if type(got) is bool:
            return expected == got
        try:
            return math.isclose(float(expected), float(got), rel_tol=rel_tol, abs_tol=abs_tol)
        except OverflowError:  # an int beyond float range is no float's value: 10**400 vs 7.5
            return False
    if type(expected) in (list, tuple) and type(got) is type(expected):
        return len(expected) == len(got) and all(
            values_equal(e, g, rel_tol, abs_tol) for e, g in zip(expected, got)
        )
    if type(expected) is dict and type(got) is dict:
        return expected.keys() == got.keys() and all(
            values_equal(v, got[k], rel_tol, abs_tol) for k, v in expected.items()
        )
    try:
        return bool(expected == got)
    except Exception:  # noqa: BLE001 - e.g. comparing huge ints with floats
        return False


def normalise_output(text: str) -> str:
    """Whole-output normal form for stdio tests: unix newlines, no trailing spaces or blank lines."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "\n".join(line.rstrip() for line in lines).strip("\n")
