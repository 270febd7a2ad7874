"""What crosses the wire to a sandbox server, and the checks a reply must pass before anything in it is read.

molrl's own server (``molrl sandbox serve``) speaks two protocols:

* ``POST /molrl/v1/execute``: a batch of the pool's raw jobs (``SandboxPool._job``) in, their raw outcomes out, run
  exactly as the local pool runs them. Verdicts are still decided in the caller (``SandboxPool._judge``): call tests
  send only arguments and get encoded values back; stdio tests never send the expected output.
* ``POST /run_code``: SandboxFusion's protocol, one program a request (``molrl.sandbox.remote.harness`` carries a raw
  job over it to any server of that protocol).

Every reply is checked here before the caller reads it (``check_outcomes``): a server that hangs, sends malformed JSON
or claims success without running anything gives a one-line error and no verdict. Each molrl batch carries one
*canary* job whose outcome the caller knows in advance (``canary_job``, ``canary_error``): a server that answers
without running the jobs fails it, and the whole reply is set aside.
"""

from __future__ import annotations

import random
from typing import Any

from molrl.errors import MolrlError
from molrl.sandbox.runtime import codec

PROTOCOL_VERSION = 1
"""The version of the molrl batch protocol; a server of another version is refused at the start."""
PING = "/v1/ping"
"""Health probe (SandboxFusion's): answers ``pong``."""
INFO = "/molrl/v1/info"
"""molrl's server: what it is, its limits and slots (``server_info``)."""
EXECUTE = "/molrl/v1/execute"
"""molrl's batch endpoint."""
RUN_CODE = "/run_code"
"""SandboxFusion's one-program endpoint."""
SERVER_NAME = "molrl-sandbox"

STATUSES = ("ok", "runtime_error", "timeout", "memory_limit", "output_limit", "sandbox_error")
STARTED_STATUSES = ("ok", "runtime_error", "memory_limit", "output_limit")
"""Statuses a job reaches only once its task process has started (it emits a ``started`` record first)."""

LIMIT_KEYS = ("timeout_s", "memory_mb", "max_output_kb", "max_file_mb", "max_processes", "max_result_kb")
"""The limits that travel with each job; the server refuses a job past its own ceiling for any of them."""
JOB_KEYS = {"code": str, "stdin": str, "module_name": str, "setup_code": str, "calls": list, "judge": (dict, type(None)),
            "timeout_s": (int, float), "memory_mb": int, "max_output_kb": int, "max_file_mb": int,
            "max_processes": int, "max_result_kb": int}
"""Every key of a raw job and its type (``SandboxPool._job`` builds them)."""


def check_servers(servers: list[str]) -> list[tuple[str, str, int]]:
    """(url, host, port) of each server URL; ``MolrlError`` naming a bad or repeated one."""
    from urllib.parse import urlsplit

    if not servers:
        raise MolrlError("sandbox.backend=remote needs sandbox.servers: [http://HOST:PORT, ...], the sandbox servers "
                         "to run code on (start each with molrl sandbox serve --port PORT)")
    if len(set(servers)) != len(servers):
        raise MolrlError(f"sandbox.servers={list(servers)} names a server twice; list each once")
    out = []
    for url in servers:
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme != "http" or not parts.hostname or port is None or parts.path not in ("", "/"):
            raise MolrlError(f"sandbox.servers: {url!r} is not a server URL; give http://HOST:PORT, as molrl sandbox "
                             "serve prints")
        out.append((url.rstrip("/"), parts.hostname, port))
    return out


class ProtocolError(ValueError):
    """A request or reply that breaks the protocol; its text is the one line logged."""


def read_info(info: dict) -> tuple[int, int, dict[str, float]]:
    """(slots, queue limit, ceilings) of a molrl server's ``GET /molrl/v1/info`` reply (a missing one: 1 slot, a queue
    of 2, no ceiling); ``ProtocolError`` naming the first field of the wrong type or range."""
    slots, queue, ceilings = info.get("slots", 1), info.get("queue_limit", 2), info.get("ceilings") or {}
    for name, value in (("slots", slots), ("queue_limit", queue)):
        if type(value) is not int or value < 1:
            raise ProtocolError(f"info {name}={value!r}; expected an int of 1 or more")
    if not isinstance(ceilings, dict):
        raise ProtocolError(f"info ceilings is {type(ceilings).__name__}; expected an object")
    for key, value in ceilings.items():
        if key not in LIMIT_KEYS or isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not 0 < value < float("inf"):
            raise ProtocolError(f"info ceiling {key}={value!r}; expected one of {', '.join(LIMIT_KEYS)} above 0")
    return slots, max(queue, 2), {k: float(v) for k, v in ceilings.items()}


def job_error(job: Any, ceilings: dict[str, float]) -> str | None:
    """Why ``job`` cannot run on a server with these limit ceilings, or None."""
    if not isinstance(job, dict):
        return f"a job is a JSON object, got {type(job).__name__}"
    missing = sorted(set(JOB_KEYS) - set(job))
    unknown = sorted(set(job) - set(JOB_KEYS))
    if missing or unknown:
        return f"job keys: missing {missing}, unknown {unknown}"
    for key, types in JOB_KEYS.items():
        if not isinstance(job[key], types) or isinstance(job[key], bool):
            return f"job key {key} is {type(job[key]).__name__}"
    for key in LIMIT_KEYS:
        if not 0 < job[key] <= ceilings[key]:
            if job[key] <= 0:
                return f"job asks {key}={job[key]}; limits are positive"
            flag = key.replace("_", "-")
            return f"job asks {key}={job[key]}, past this server's ceiling {ceilings[key]} (molrl sandbox serve --{flag})"
    if job["module_name"] not in ("__main__", "solution"):
        return f"job module_name={job['module_name']!r}; expected __main__ or solution"
    for call in job["calls"]:
        if not (isinstance(call, dict) and isinstance(call.get("fn"), str)
                and (isinstance(call.get("args_source"), str) or "args" in call)):
            return "a call is {fn, args} or {fn, args_source}"
    judge = job["judge"]
    if judge is not None and not (isinstance(judge.get("sources"), list) and all(isinstance(s, str) for s in judge["sources"])
                                  and isinstance(judge.get("entry_point"), (str, type(None)))):
        return "judge is {entry_point, sources: [str]}"
    return None


def outcome_error(job: dict, out: Any) -> str | None:
    """Why ``out`` cannot be the raw outcome of ``job``, or None (read only what the caller later reads)."""
    if not isinstance(out, dict):
        return f"an outcome is a JSON object, got {type(out).__name__}"
    status = out.get("status")
    if status not in STATUSES:
        return f"outcome status {status!r} is not one of {', '.join(STATUSES)}"
    for key, types in (("stdout", str), ("stderr", str), ("events", list), ("verdicts", list)):
        if key in out and not isinstance(out[key], types):
            return f"outcome {key} is {type(out[key]).__name__}"
    for key in ("stdout_bytes", "stderr_bytes", "duration_s"):
        if key in out and (not isinstance(out[key], (int, float)) or isinstance(out[key], bool) or out[key] < 0):
            return f"outcome {key}={out[key]!r}"
    if "exit_code" in out and not (out["exit_code"] is None or type(out["exit_code"]) is int):
        return f"outcome exit_code={out['exit_code']!r}"
    records = list(out.get("events", [])) + list(out.get("verdicts", []))
    if not all(isinstance(e, dict) for e in records):
        return "an outcome record is not a JSON object"
    if status in STARTED_STATUSES and not any(e.get("e") == "started" for e in out.get("events", [])):
        return f"outcome status {status} without the task's started record: the job did not run"
    if status == "sandbox_error" and not isinstance(out.get("error"), str):
        return "a sandbox_error outcome without its error"
    return None


def check_outcomes(jobs: list[dict], reply: Any) -> list[dict]:
    """The outcomes of a molrl batch reply, each checked against its job; ``ProtocolError`` on the first wrong one."""
    outcomes = reply.get("outcomes") if isinstance(reply, dict) else None
    if not isinstance(outcomes, list):
        raise ProtocolError(f"the reply has no outcomes list (got {_shape(reply)})")
    if len(outcomes) != len(jobs):
        raise ProtocolError(f"{len(outcomes)} outcomes for {len(jobs)} jobs")
    for i, (job, out) in enumerate(zip(jobs, outcomes)):
        error = outcome_error(job, out)
        if error:
            raise ProtocolError(f"outcome {i}: {error}")
    return outcomes


def canary_job(rng: random.Random, base: dict, judged: bool = True, timeout_s: float = 5.0) -> tuple[dict, dict]:
    """A job whose outcome is known here, and what it must show: its stdout, a call's value and (``judged``) two
    verdicts.

    It prints a product, defines ``f(x) = x + a`` and is called once; judged, one passing and one failing assert judge
    it too (a request with assert tests carries this one), so a server that answers without running it, or that
    passes everything, is caught. ``timeout_s`` is its time limit: long enough that a loaded server runs it in time.
    """
    a, b = rng.randrange(10**6, 10**7), rng.randrange(10**6, 10**7)
    code = f"print({a} * {b})\n\ndef f(x):\n    return x + {a}\n"
    job = dict(base, code=code, stdin="", module_name="solution", setup_code="",
               calls=[{"fn": "f", "args": codec.encode((2,))}],
               judge={"entry_point": "f", "sources": [f"assert f(1) == {a + 1}", f"assert f(1) == {a + 2}"]}
               if judged else None,
               timeout_s=float(timeout_s))
    return job, {"stdout": f"{a * b}\n", "value": a + 2, "verdicts": [True, False] if judged else []}


def canary_error(expect: dict, out: dict) -> str | None:
    """Why the canary's outcome is not what running it gives, or None."""
    if out.get("status") != "ok":
        return f"the canary job ended {out.get('status')} ({out.get('error') or 'no error given'})"
    if out.get("stdout") != expect["stdout"]:
        return "the canary job's stdout is wrong: the server did not run it"
    calls = [e for e in out.get("events", []) if e.get("e") == "call"]
    try:
        value = codec.decode(calls[0]["value"]) if calls else None
    except (ValueError, TypeError, KeyError, OverflowError):
        value = None
    if value != expect["value"] or type(value) is not int:
        return "the canary job's call returned the wrong value: the server did not run it"
    verdicts = [e.get("passed") for e in out.get("verdicts", []) if e.get("e") == "verdict"]
    if verdicts != expect["verdicts"]:
        return f"the canary's asserts came back {verdicts}, not {expect['verdicts']}: the server does not judge them"
    return None


def _shape(value: Any) -> str:
    if isinstance(value, dict):
        return "an object with keys " + ", ".join(sorted(map(str, value))[:8])
    return type(value).__name__
