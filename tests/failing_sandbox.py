"""A sandbox that fails on purpose: a real local backend whose every k-th outcome comes back a sandbox error."""

from __future__ import annotations

from molrl.sandbox import Backend, LocalBackend

LOST = "server unreachable (test)"
"""The error every failed outcome carries."""


class FailingBackend(Backend):
    """Runs jobs on ``inner`` and turns the outcome of every ``every``-th job of each call into a sandbox error (1:
    every job), as a dead worker or an unreachable sandbox server would."""

    name = "failing"

    def __init__(self, inner: Backend, every: int):
        self.inner, self.every = inner, every

    def execute(self, jobs: list[dict]) -> list[dict]:
        outs = self.inner.execute(jobs)
        return [{"status": "sandbox_error", "error": LOST} if i % self.every == self.every - 1 else out
                for i, out in enumerate(outs)]

    def close(self) -> None:
        self.inner.close()


def fail_every(monkeypatch, every: int) -> None:
    """Make every ``SandboxPool`` built without a backend (as the stages build theirs) fail every ``every``-th job."""
    import molrl.sandbox.pool as pool

    monkeypatch.setattr(pool, "LocalBackend", lambda cfg: FailingBackend(LocalBackend(cfg), every))
