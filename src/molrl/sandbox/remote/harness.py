"""One molrl raw job carried over a run_code server (SandboxFusion's ``POST /run_code``), the verdict kept here.

A run_code server runs one Python program and returns its output; it knows nothing of molrl's jobs.
``run_code_request(job, nonce)`` is the request body: its ``code`` is the harness program (``harness_program.py``, the
same text for every job, with molrl's sandbox runtime and the child program embedded, since the server has no molrl)
and its ``stdin`` carries the job and the nonce, so neither is ever written to a file on the server. The harness runs
the job as a local worker does and writes one line, ``MOLRL-HARNESS <nonce> <outcome JSON>``, the raw outcome
``SandboxPool`` judges. ``outcome_from_reply(job, nonce, reply)`` returns that outcome, or raises ``HarnessError``
for any reply that is not the harness's well-formed report to this request: a server that did not run the program,
stopped it, or answered with something else never yields a verdict.

Only what the harness guarantees whatever the model's code does is checked here (the outcome's shape, the verdicts'
indices); what the code controls (its output, its result records) is judged by ``SandboxPool`` as from a local worker,
so no program can turn its own run into a sandbox error by writing something odd.
"""

from __future__ import annotations

import base64
import functools
import hmac
import json
import math
import re
import secrets
import zlib
from pathlib import Path
from typing import Any

from molrl.sandbox.command import RUNTIME_DIR, THREAD_ENV

TAG = "MOLRL-HARNESS"
"""The first word of the harness's result line: ``MOLRL-HARNESS <nonce> <outcome JSON>``."""
TIME_MARGIN_S = 5.0
"""Seconds the server's ``run_timeout`` allows past the job's own deadline: the harness's start and its clean-up (the
job's deadline itself is kept by the harness)."""
MEMORY_MARGIN_MB = 256
"""MiB the server's ``memory_limit_MB`` allows past the job's ``memory_mb``: the harness's own interpreter (the child's
address space is limited to the job's ``memory_mb`` by the harness)."""
COMPILE_TIMEOUT_S = 10.0
"""The request's ``compile_timeout`` (Python compiles nothing ahead)."""
RUNTIME_MODULES = ("codec", "seccomp", "cleanup", "task", "zygote", "worker")
"""The sandbox runtime modules the harness embeds, each after the modules it imports."""
STATUSES = ("ok", "runtime_error", "timeout", "memory_limit", "output_limit", "sandbox_error")
"""The statuses a raw outcome may have."""
NONCE = re.compile(r"[0-9a-f]{32,128}")
"""A nonce: at least 128 bits, in lower-case hex (``new_nonce`` makes one)."""
MARK = '"@MOLRL_RUNTIME@"'
"""The literal of ``harness_program.py`` that its embedded runtime replaces."""
HERE = Path(__file__).resolve().parent


class HarnessError(ValueError):
    """A run_code reply that is not the harness's well-formed report for this request (one line says what)."""


def new_nonce() -> str:
    """A fresh random nonce for one request (128 bits, hex)."""
    return secrets.token_hex(16)


@functools.lru_cache(maxsize=1)
def harness_program() -> str:
    """The harness program's text: ``harness_program.py`` with the runtime modules and the child program embedded."""
    runtime = {"modules": {name: (RUNTIME_DIR / f"{name}.py").read_text() for name in RUNTIME_MODULES},
               "order": list(RUNTIME_MODULES), "child": (HERE / "harness_child.py").read_text(),
               "uids": (HERE / "harness_uids.py").read_text(), "env": THREAD_ENV}
    template = (HERE / "harness_program.py").read_text()
    if template.count(MARK) != 1:
        raise RuntimeError(f"{HERE / 'harness_program.py'} holds {MARK} {template.count(MARK)} times; expected once")
    return template.replace(MARK, json.dumps(_packed(runtime)))


def _packed(obj: Any) -> str:
    """``obj`` as zlib-compressed JSON in base64 (ASCII letters, digits, '+', '/' and '=' only)."""
    return base64.b64encode(zlib.compress(json.dumps(obj, separators=(",", ":")).encode(), 6)).decode()


def run_code_request(job: dict, nonce: str) -> dict:
    """The ``POST /run_code`` body that runs ``job`` (a raw job of ``SandboxPool``) in the harness, under ``nonce``."""
    if not isinstance(nonce, str) or not NONCE.fullmatch(nonce):
        raise ValueError(f"nonce {nonce!r:.40} is not 32 to 128 lower-case hex digits; make one with new_nonce()")
    return {
        "code": harness_program(), "language": "python", "stdin": _packed({"nonce": nonce, "job": job}) + "\n",
        "run_timeout": float(job["timeout_s"]) + TIME_MARGIN_S, "compile_timeout": COMPILE_TIMEOUT_S,
        "memory_limit_MB": int(job["memory_mb"]) + MEMORY_MARGIN_MB, "files": {}, "fetch_files": [],
    }


def outcome_from_reply(job: dict, nonce: str, reply: Any) -> dict:
    """The raw outcome the harness reported in ``reply`` to ``run_code_request(job, nonce)``; else ``HarnessError``."""
    if not isinstance(reply, dict):
        raise HarnessError(f"run_code reply is a JSON {type(reply).__name__}, not an object")
    run = reply.get("run_result")
    if not isinstance(run, dict):
        raise HarnessError(f"run_code reply has no run_result (status {reply.get('status')!r}: "
                           f"{str(reply.get('message'))[:200]!r}): the server did not run the harness")
    stdout = run.get("stdout")
    if not isinstance(stdout, str):
        raise HarnessError(f"run_code reply's run_result.stdout is a JSON {type(stdout).__name__}, not a string")
    lines = [line for line in stdout.split("\n") if line.startswith(TAG)]
    if not lines:
        raise HarnessError(_no_result(reply, run, stdout, job))
    if len(lines) > 1:
        raise HarnessError(f"run_code reply has {len(lines)} harness result lines; the harness writes exactly one")
    parts = lines[0].rstrip("\r").split(" ", 2)
    if len(parts) != 3 or parts[0] != TAG:
        raise HarnessError(f"run_code reply's harness result line does not read '{TAG} <nonce> <outcome>'")
    if not hmac.compare_digest(parts[1].encode(), nonce.encode()):
        raise HarnessError(f"run_code reply's harness result carries nonce {parts[1][:40]!r}, not this request's"
                           f"{_stderr_tail(run)}")
    try:
        outcome = json.loads(parts[2])
    except (ValueError, RecursionError) as err:
        raise HarnessError(f"run_code reply's harness result is not JSON ({str(err)[:100]})") from None
    problem = outcome_problem(outcome, job)
    if problem:
        raise HarnessError(f"run_code reply's harness result is malformed: {problem}")
    return outcome


def _no_result(reply: dict, run: dict, stdout: str, job: dict) -> str:
    """Why a reply without a result line has none, in one line."""
    if run.get("status") == "TimeLimitExceeded":
        limit = float(job["timeout_s"])
        return (f"run_code server stopped the harness at its time limit ({limit + TIME_MARGIN_S:g} s, the job's "
                f"{limit:g} s + {TIME_MARGIN_S:g}) before it reported{_stderr_tail(run)}")
    return (f"run_code reply has no harness result (status {reply.get('status')}, stdout {len(stdout.encode())} "
            f"bytes, return code {run.get('return_code')}): the server did not run the harness to its end"
            f"{_stderr_tail(run)}")


def _stderr_tail(run: dict) -> str:
    """'; stderr: <its last line>' when the reply's stderr has one, else ''."""
    stderr = run.get("stderr")
    tail = stderr.strip().splitlines()[-1][-200:] if isinstance(stderr, str) and stderr.strip() else ""
    return f"; stderr: {tail!r}" if tail else ""


REQUIRED = ("status", "exit_code", "stdout", "stderr", "stdout_bytes", "stderr_bytes", "truncated", "duration_s",
            "events", "verdicts")
"""The fields of every harness outcome."""
OPTIONAL = ("error", "stray_processes", "isolation")
"""The fields a harness outcome may add."""


def outcome_problem(outcome: Any, job: dict) -> str | None:
    """What is wrong with a harness outcome for ``job`` (None: nothing); checks only what the harness guarantees."""
    if not isinstance(outcome, dict):
        return f"a JSON {type(outcome).__name__}, not an object"
    missing = [key for key in REQUIRED if key not in outcome]
    unknown = sorted(set(outcome) - set(REQUIRED) - set(OPTIONAL))
    if missing or unknown:
        return f"missing {', '.join(missing) or 'nothing'}; unknown {', '.join(unknown) or 'nothing'}"
    limit = int(job["max_output_kb"]) << 10
    checks = [
        ("status", outcome["status"] in STATUSES, f"one of {'/'.join(STATUSES)}"),
        ("exit_code", outcome["exit_code"] is None or _is_int(outcome["exit_code"]), "an integer or null"),
        *((key, isinstance(outcome[key], str) and len(outcome[key]) <= limit, f"a string of at most {limit} characters")
          for key in ("stdout", "stderr")),
        *((key, _is_int(outcome[key]) and outcome[key] >= 0, "a count of bytes")
          for key in ("stdout_bytes", "stderr_bytes")),
        ("truncated", isinstance(outcome["truncated"], bool), "true or false"),
        ("duration_s", _is_number(outcome["duration_s"]) and math.isfinite(outcome["duration_s"])
         and outcome["duration_s"] >= 0, "a finite number of seconds"),
        ("events", isinstance(outcome["events"], list) and all(isinstance(e, dict) for e in outcome["events"]),
         "a list of objects"),
        ("error", isinstance(outcome.get("error", ""), str), "a string"),
        ("stray_processes", _is_int(outcome.get("stray_processes", 0)) and outcome.get("stray_processes", 0) >= 0,
         "a count of processes"),
        ("isolation", isinstance(outcome.get("isolation", {}), dict)
         and all(isinstance(v, bool) for v in outcome.get("isolation", {}).values()), "an object of true/false flags"),
    ]
    for key, ok, what in checks:
        if not ok:
            return f"{key} {json.dumps(outcome.get(key))[:80]} is not {what}"
    return _verdicts_problem(outcome["verdicts"], job)


def _verdicts_problem(verdicts: Any, job: dict) -> str | None:
    """What is wrong with the verdict records for ``job`` (None: nothing)."""
    sources = (job.get("judge") or {}).get("sources") or []
    if not isinstance(verdicts, list) or not all(isinstance(v, dict) for v in verdicts):
        return "verdicts is not a list of objects"
    if verdicts and not job.get("judge"):
        return f"{len(verdicts)} verdict(s) for a job without assert tests"
    seen: set[int] = set()
    for v in verdicts:
        if v.get("e") == "judge_error" and isinstance(v.get("error"), str):
            continue
        index = v.get("i")
        if v.get("e") != "verdict" or not _is_int(index) or not isinstance(v.get("passed"), bool) \
                or not isinstance(v.get("error", ""), str):
            return (f"verdict record {json.dumps(v)[:120]} is not {{e: verdict, i, passed, error?}} "
                    "or {e: judge_error, error}")
        if not 0 <= index < len(sources) or index in seen:
            why = "twice" if index in seen else "out of range"
            return f"verdict for test {index}, of {len(sources)} assert tests, given {why}"
        seen.add(index)
    return None


def _is_int(value: Any) -> bool:
    """An int that is not a bool."""
    return type(value) is int


def _is_number(value: Any) -> bool:
    """An int or float that is not a bool."""
    return type(value) in (int, float)
