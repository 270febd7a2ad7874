"""The sandbox's configuration, job and result types."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, Literal, Protocol, Sequence

from molrl.config.ranges import Range, Seconds

Status = Literal["ok", "runtime_error", "timeout", "memory_limit", "output_limit", "sandbox_error"]


@dataclass
class SandboxConfig:
    """How model-written code is confined and how fast it is run."""

    workers: Annotated[int, Range(0, 1024)] = 0
    """Worker slots run in parallel (0: two per CPU core, which hides each job's round trip); with
    backend=remote, requests in flight at once (0: 8 per server)."""
    timeout_s: Seconds = 10.0
    """Wall-clock limit of one execution, in seconds."""
    memory_mb: Annotated[int, Range(1, 1 << 24)] = 1024
    """Address-space limit of each task process, in MiB (includes the ~100 MiB of preloaded modules)."""
    max_output_kb: Annotated[int, Range(0, 1 << 20)] = 64
    """How much of stdout and of stderr comes back (the rest is counted, and flagged truncated)."""
    max_file_mb: Annotated[int, Range(0, 1 << 20)] = 16
    """Largest file a task may write, stdout and stderr included; reaching it is output_limit."""
    max_processes: Annotated[int, Range(1, 4096)] = 32
    """Processes a task may have at once (RLIMIT_NPROC on the slot's own uid)."""
    slot_memory_mb: Annotated[int, Range(0, 1 << 24)] = 0
    """Memory cap of a whole slot (worker, task and its children) via a cgroup where the host
    allows one (0: 2 * memory_mb + 256)."""
    tmpfs_mb: Annotated[int, Range(1, 1 << 20)] = 256
    """Size of each slot's private writable /tmp (bwrap backend)."""
    backend: Literal["auto", "bwrap", "process", "remote"] = "auto"
    """auto: bubblewrap when it works here, else plain processes (with a warning naming what is lost);
    remote: the sandbox servers in ``servers`` (``molrl sandbox serve``, or a SandboxFusion-style run_code
    service), which isolate as they are set up to (docs/sandbox.md)."""
    servers: list[str] = field(default_factory=list)
    """backend=remote: base URLs of the sandbox servers (``http://host:port``); jobs go to the one with the
    fewest outstanding."""
    protocol: Literal["auto", "molrl", "run_code"] = "auto"
    """backend=remote: how to talk to the servers. molrl: ``molrl sandbox serve``'s batch endpoint (jobs run as
    the local pool runs them); run_code: SandboxFusion's ``POST /run_code``, each job wrapped in a harness that
    keeps the verdict here; auto: molrl where the server says it is one, else run_code."""
    request_grace_s: Seconds = 30.0
    """backend=remote: seconds a request may take past its jobs' time limit (queueing, the network) before the
    client gives up on it and sends it elsewhere."""
    retries: Annotated[int, Range(0, 16)] = 2
    """backend=remote: times a job is sent again after a sandbox or connection error (never after the program's
    own failure)."""
    server_failures: Annotated[int, Range(1, 1000)] = 3
    """backend=remote: failures in a row that set a server aside (a circuit breaker); it is probed again after
    ``server_cooldown_s``."""
    server_cooldown_s: Seconds = 30.0
    """backend=remote: seconds a server set aside waits before its next health probe."""
    max_error_rate: Annotated[float, Range(0, 1)] = 0.1
    """Share of executions the sandbox could not run (``sandbox_error``) past which a run stops; such a row is
    never a verdict (left out of the loss and of eval's counts). Checked once 32 rows have been graded."""
    seccomp: bool = True
    """Install the seccomp deny-list (no sockets, ptrace, mounts, namespaces, uid changes)."""
    preimport: list[str] = field(
        default_factory=lambda: ["numpy", "math", "re", "collections", "itertools", "functools", "heapq", "json", "random", "string", "bisect", "typing"]
    )
    """Modules each worker imports once so tasks start warm (missing ones are skipped)."""
    cache_size: Annotated[int, Range(0, 1 << 24)] = 2048
    """Results kept, keyed by hash of (code, inputs, limits); 0 disables the cache. Outcomes over
    32 KiB are not kept, so the cache stays under ~64 MiB."""
    float_rel_tol: Annotated[float, Range(0, 1)] = 1e-9
    """Relative tolerance when a returned value is compared with an expected float (an expected int is matched exactly)."""
    float_abs_tol: Annotated[float, Range(0, 1)] = 0.0
    """Absolute tolerance when a returned value is compared with an expected float (an expected int is matched exactly)."""
    max_result_kb: Annotated[int, Range(1, 1 << 20)] = 4096
    """Largest block of encoded return values a task may send back."""
    worker_grace_s: Seconds = 5.0
    """Extra seconds past the deadline before a silent worker is declared hung and replaced."""

    def __post_init__(self) -> None:
        if self.backend == "remote":
            from molrl.sandbox.remote.protocol import check_servers

            check_servers(list(self.servers))


@dataclass
class ExecJob:
    """One program to run: code, its stdin, and optional overrides of the pool's limits."""

    code: str
    """The program text."""
    stdin: str | None = None
    """Text fed on standard input."""
    timeout_s: float | None = None
    """Overrides SandboxConfig.timeout_s."""
    memory_mb: int | None = None
    """Overrides SandboxConfig.memory_mb."""


@dataclass
class TestOutcome:
    """How one test of a task went; the verdict was reached outside the process that ran the code."""

    index: int
    """Position of the test in Task.tests."""
    kind: str
    """call / stdio / assert."""
    passed: bool
    """True only when a result came back and matched; a missing result is a fail."""
    got: Any = None
    """call: the returned value serialised with its exact type; stdio: the stdout (first KB)."""
    error: str | None = None
    """Why it failed: the exception raised, 'no result', 'wrong answer', ..."""

    __test__ = False


@dataclass
class ExecResult:
    """What happened when a program ran in the sandbox."""

    status: Status
    """ok / runtime_error / timeout / memory_limit / output_limit / sandbox_error."""
    exit_code: int | None = None
    """Process exit code (negative: killed by that signal, -9 at a deadline); None if never collected."""
    stdout: str = ""
    """The first max_output_kb of standard output."""
    stderr: str = ""
    """The first max_output_kb of standard error."""
    stdout_bytes: int = 0
    """Total bytes written to stdout."""
    stderr_bytes: int = 0
    """Total bytes written to stderr."""
    truncated: bool = False
    """True when stdout or stderr was longer than what came back."""
    duration_s: float = 0.0
    """Wall-clock time of the execution."""
    tests: list[TestOutcome] = field(default_factory=list)
    """Per-test outcomes (run_tests only)."""
    error: str | None = None
    """For sandbox_error, what went wrong in the sandbox itself."""
    cached: bool = False
    """True when this result came from the cache."""
    info: dict[str, Any] = field(default_factory=dict)
    """Diagnostics: backend, milliseconds from deadline or exit to all processes reaped, strays killed."""

    @property
    def passed(self) -> int:
        """Number of tests passed."""
        return sum(t.passed for t in self.tests)

    def to_json(self) -> str:
        """The result as a JSON string."""
        return json.dumps(asdict(self), indent=2, default=repr)


class TestedTask(Protocol):
    """What the pool reads of a task whose tests it runs (``molrl.task_types.Task`` is one): the sandbox sits below
    the task record and names only this."""

    __test__ = False  # not a pytest test class
    id: str
    entry_point: str | None
    tests: Sequence[Any]
    setup_code: str
    meta: dict[str, Any]
