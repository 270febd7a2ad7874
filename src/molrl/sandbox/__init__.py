"""Run model-written code in a sandbox and report what it did; verdicts are decided by the caller.

``SandboxPool(cfg)`` keeps pre-forked workers (bubblewrap namespaces, rlimits, a distinct uid per
slot, a seccomp deny-list) and offers ``run``, ``run_many`` and ``run_tests``. See docs/sandbox.md
for the threat model.
"""

from molrl.sandbox.backend import Backend, LocalBackend
from molrl.sandbox.pool import SandboxPool
from molrl.sandbox.types import ExecJob, ExecResult, SandboxConfig, TestOutcome

__all__ = ["Backend", "ExecJob", "ExecResult", "LocalBackend", "SandboxConfig", "SandboxPool", "TestOutcome"]
