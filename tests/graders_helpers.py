"""What the grader tests share: a module-scoped sandbox pool and a fenced completion."""

from __future__ import annotations

import pytest

from molrl.sandbox import SandboxConfig, SandboxPool


@pytest.fixture(scope="module")
def pool():
    """A real two-worker sandbox pool for one test module."""
    with SandboxPool(SandboxConfig(workers=2, timeout_s=10.0)) as p:
        yield p


def fenced(code: str) -> str:
    """A completion that answers with ``code`` in a python fence."""
    return f"Here you go:\n```python\n{code}\n```\n"
