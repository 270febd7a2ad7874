"""``SandboxPool``: run programs and task tests in the sandbox, with verdicts decided here.

Only inputs enter the sandbox: call arguments, stdin, and for assert-style tests the test program
(run by a separate judge process). Return values come back serialised with their exact types and
are compared in this process; expected values never leave it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import OrderedDict

from molrl.sandbox.backend import Backend, LocalBackend
from molrl.sandbox.compare import normalise_output, values_equal
from molrl.sandbox.runtime import codec
from molrl.sandbox.types import ExecJob, ExecResult, SandboxConfig, TestedTask, TestOutcome

log = logging.getLogger(__name__)


def open_backend(cfg: SandboxConfig) -> Backend:
    """The backend ``cfg.backend`` names: the servers of ``cfg.servers`` for remote, else this host's slots."""
    if cfg.backend == "remote":
        from molrl.sandbox.remote.client import RemoteBackend

        return RemoteBackend(cfg)
    return LocalBackend(cfg)


class SandboxPool:
    """A pool of sandboxed workers; use as a context manager or call ``close()``.

    >>> with SandboxPool(SandboxConfig(workers=1)) as pool:        # doctest: +SKIP
    ...     pool.run("print(6 * 7)").stdout
    '42\\n'
    """

    def __init__(self, cfg: SandboxConfig | None = None, backend: Backend | None = None):
        self.cfg = cfg or SandboxConfig()
        self.backend = backend or open_backend(self.cfg)
        self._cache: OrderedDict[str, dict] = OrderedDict()
        self._lock = threading.Lock()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers and remove their temporary files."""
        self.backend.close()

    # -- plain programs -------------------------------------------------------------------------

    def run(self, code: str, stdin: str | None = None, timeout_s: float | None = None,
            memory_mb: int | None = None) -> ExecResult:
        """Run one program as ``__main__``; its output and status."""
        return self.run_many([ExecJob(code, stdin, timeout_s, memory_mb)])[0]

    def run_many(self, jobs: list[ExecJob | dict | str]) -> list[ExecResult]:
        """Run programs in parallel (``ExecJob``, dicts of its fields, or bare code strings)."""
        raw = []
        for job in jobs:
            if isinstance(job, str):
                job = ExecJob(job)
            elif isinstance(job, dict):
                job = ExecJob(**job)
            raw.append(self._job(job.code, stdin=job.stdin, timeout_s=job.timeout_s, memory_mb=job.memory_mb))
        return [self._result(out) for out in self._execute(raw)]

    # -- task tests -------------------------------------------------------------------------------

    def run_tests(self, code: str, task: TestedTask) -> ExecResult:
        """Run ``code`` against every test of ``task``; per-test outcomes in ``tests``."""
        return self.run_tests_many([(code, task)])[0]

    def run_tests_many(self, pairs: list[tuple[str, TestedTask]]) -> list[ExecResult]:
        """``run_tests`` for many (code, task) pairs at once, all jobs in parallel."""
        plans = [self._plan(code, task) for code, task in pairs]
        flat = [job for plan in plans for job, _ in plan]
        outs = iter(self._execute(flat))
        results = []
        for (code, task), plan in zip(pairs, plans):
            pieces = [(next(outs), tests) for _, tests in plan]
            results.append(self._judge(task, pieces))
        return results

    def _plan(self, code: str, task: TestedTask) -> list[tuple[dict, list[int]]]:
        """The jobs that run ``task``'s tests, each with the test indices it covers."""
        timeout = task.meta.get("timeout_s")
        calls, sources, call_idx, assert_idx, plan = [], [], [], [], []
        for i, test in enumerate(task.tests):
            if test.kind == "call":
                call = {"fn": task.entry_point, "args": codec.encode(tuple(test.args))}
                if test.args_source:
                    call = {"fn": task.entry_point, "args_source": test.args_source}
                calls.append(call)
                call_idx.append(i)
            elif test.kind == "assert":
                sources.append(test.source)
                assert_idx.append(i)
            else:
                plan.append((self._job(code, stdin=test.stdin, timeout_s=timeout), [i]))
        if calls or sources:
            judge = {"entry_point": task.entry_point, "sources": sources} if sources else None
            job = self._job(code, timeout_s=timeout, module_name="solution", setup_code=task.setup_code,
                            calls=calls, judge=judge)
            plan.insert(0, (job, call_idx + assert_idx))
        return plan

    def _judge(self, task: TestedTask, pieces: list[tuple[dict, list[int]]]) -> ExecResult:
        """Decide every test's verdict from the raw outcomes (here, outside the sandbox)."""
        outcomes: dict[int, TestOutcome] = {}
        for out, indices in pieces:
            _log_unreadable(task.id, out)
            calls = {e["i"]: e for e in out.get("events", []) if e.get("e") == "call" and isinstance(e.get("i"), int)}
            verdicts = {e["i"]: e for e in out.get("verdicts", []) if e.get("e") == "verdict" and isinstance(e.get("i"), int)}
            judge_error = next((e for e in out.get("verdicts", []) if e.get("e") == "judge_error"), None)
            n_calls = sum(task.tests[i].kind == "call" for i in indices)
            for pos, i in enumerate(indices):
                test = task.tests[i]
                if test.kind == "call":
                    outcomes[i] = self._check_call(i, test.expected, calls.get(pos), out)
                elif test.kind == "assert":
                    verdict = verdicts.get(pos - n_calls)
                    passed = bool(verdict and verdict.get("passed") is True)
                    error = None if passed else (verdict or judge_error or {}).get("error") or _missing(out)
                    outcomes[i] = TestOutcome(i, "assert", passed, None, error)
                else:
                    got = out.get("stdout", "")
                    passed = out.get("status") == "ok" and not out.get("truncated") and \
                        normalise_output(got) == normalise_output(test.stdout)
                    outcomes[i] = TestOutcome(i, "stdio", passed, got[:1024], None if passed else _missing(out) or "wrong output")
        failed = [out for out, _ in pieces if out.get("status") != "ok"]  # a job the sandbox could not run comes first:
        failed.sort(key=lambda out: out.get("status") != "sandbox_error")  # its tests have no verdict
        main = failed[0] if failed else pieces[0][0] if pieces else {"status": "ok"}
        result = self._result(main)
        result.tests = [outcomes[i] for i in sorted(outcomes)]
        result.duration_s = max((out.get("duration_s", 0.0) for out, _ in pieces), default=0.0)
        return result

    def _check_call(self, i: int, expected, event: dict | None, out: dict) -> TestOutcome:
        if event is None:
            return TestOutcome(i, "call", False, None, _missing(out))
        if "value" not in event:
            return TestOutcome(i, "call", False, None, str(event.get("error", "no result"))[:1000])
        try:
            got = codec.decode(event["value"])
        except (ValueError, TypeError, KeyError, OverflowError) as err:
            return TestOutcome(i, "call", False, event["value"], f"unreadable result: {err}")
        passed = values_equal(expected, got, self.cfg.float_rel_tol, self.cfg.float_abs_tol)
        return TestOutcome(i, "call", passed, event["value"], None if passed else "wrong answer")

    # -- plumbing ---------------------------------------------------------------------------------

    def _job(self, code: str, *, stdin=None, timeout_s=None, memory_mb=None, module_name="__main__",
             setup_code="", calls=None, judge=None) -> dict:
        cfg = self.cfg
        return {
            "code": code, "stdin": stdin or "", "module_name": module_name, "setup_code": setup_code,
            "calls": calls or [], "judge": judge,
            "timeout_s": float(timeout_s or cfg.timeout_s), "memory_mb": int(memory_mb or cfg.memory_mb),
            "max_output_kb": cfg.max_output_kb, "max_file_mb": cfg.max_file_mb,
            "max_processes": cfg.max_processes, "max_result_kb": cfg.max_result_kb,
        }

    def _execute(self, jobs: list[dict]) -> list[dict]:
        """Outcomes of ``jobs``: from the cache, else run once per distinct job."""
        keys = [hashlib.sha256(json.dumps(job, sort_keys=True).encode()).hexdigest() for job in jobs]
        todo: dict[str, dict] = {}
        with self._lock:
            for key, job in zip(keys, jobs):
                if key not in self._cache and key not in todo:
                    todo[key] = job
        fresh = dict(zip(todo, self.backend.execute(list(todo.values())))) if todo else {}
        outs = []
        with self._lock:
            for key in keys:
                if key in fresh:
                    outs.append(dict(fresh[key], cached=False))
                    continue
                self._cache.move_to_end(key)
                outs.append(dict(self._cache[key], cached=True))
            for key, out in fresh.items():
                if self.cfg.cache_size and out.get("status") != "sandbox_error" and _small(out):
                    self._cache[key] = out
            while len(self._cache) > self.cfg.cache_size:
                self._cache.popitem(last=False)
        return outs

    def _result(self, out: dict) -> ExecResult:
        info = {k: out[k] for k in ("start_ms", "reap_ms", "stray_processes") if k in out}
        info["backend"] = getattr(self.backend, "name", "backend")
        return ExecResult(
            status=out.get("status", "sandbox_error"), exit_code=out.get("exit_code"),
            stdout=out.get("stdout", ""), stderr=out.get("stderr", ""),
            stdout_bytes=out.get("stdout_bytes", 0), stderr_bytes=out.get("stderr_bytes", 0),
            truncated=bool(out.get("truncated")), duration_s=out.get("duration_s", 0.0),
            error=out.get("error"), cached=bool(out.get("cached")), info=info,
        )


CACHE_ENTRY_BYTES = 32 << 10
"""Outcomes larger than this (long output, big return values) are not cached."""


def _small(out: dict) -> bool:
    """Whether an outcome is small enough to keep in the cache (bounds its memory)."""
    size = len(out.get("stdout", "")) + len(out.get("stderr", ""))
    return size < CACHE_ENTRY_BYTES and len(json.dumps(out.get("events", []))) < CACHE_ENTRY_BYTES - size


def _missing(out: dict) -> str:
    """Why a test has no result: the run's status and its last error line, or its unreadable records."""
    status = out.get("status", "sandbox_error")
    for event in out.get("events", []):
        if event.get("e") in ("load_error", "setup_error", "exit"):
            return f"no result ({status}; {event.get('error') or 'exit ' + str(event.get('code'))})"
    bad = _unreadable(out)
    if bad:
        return f"no result ({status}; unreadable record: {bad[0]})"
    return f"no result ({status}{': ' + out['error'] if out.get('error') else ''})"


def _unreadable(out: dict) -> list[str]:
    """What was wrong with each result record the sandbox could not read."""
    return [f"record {e.get('record')}: {e.get('error')}" for e in out.get("events", []) if e.get("e") == "unreadable"]


def _log_unreadable(task_id: str, out: dict) -> None:
    bad = _unreadable(out)
    if bad:
        log.warning("sandbox: task %s: %d unreadable record(s) on the result pipe, their rows fail: %s",
                    task_id, len(bad), "; ".join(bad)[:500])
