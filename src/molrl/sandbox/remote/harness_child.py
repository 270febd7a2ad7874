"""The task side of molrl's run_code harness: the model's code, in a fresh interpreter the harness starts.

The harness (``harness_program.py``) runs this text as ``python -I -c TEXT JOB_FD RESULT_FD REQ_FD RESP_FD`` (REQ_FD and
RESP_FD are -1 without assert tests), with the job's stdin, stdout and stderr files as fds 0-2. It is exec'd, never
forked from the harness, so nothing of the harness's memory (the nonce, the test programs) is in this process. From
JOB_FD it reads one JSON message: the task's job (code, module name, setup code, the calls' arguments and the limits;
never an expected value or a test program), the paths it reopens its stdio and work dir by, the uid to run as (None:
the harness's own) and the text of the molrl sandbox runtime modules it runs (``codec``, ``task``). It then confines
itself as a local task process does (``task.confine``: its own session, stdio reopened, every other fd closed,
rlimits, the uid), keeps no capability and no way to gain one, dies with the harness, and, sharing the harness's uid,
becomes non-dumpable (a concurrent job's process of that uid can then neither read its memory nor open its fds). Then
``task.run_task``: result records on RESULT_FD, then the judge's calls served over REQ_FD and RESP_FD.

Standard library only: the server that runs it has no molrl installed. The harness also executes this text (not as
``__main__``) for ``install_runtime``.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import signal
import sys
import types

PACKAGE = "molrl_sandbox_runtime"
"""The package the embedded runtime modules are installed as (their relative imports resolve inside it)."""

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 1, 4, 24, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
LINUX_CAPABILITY_VERSION_3 = 0x20080522


def install_runtime(sources: dict[str, str], order: list[str]) -> types.ModuleType:
    """Install molrl's sandbox runtime modules from their text, in ``order`` (each after what it imports)."""
    package = types.ModuleType(PACKAGE)
    package.__path__ = []
    sys.modules[PACKAGE] = package
    for name in order:
        module = types.ModuleType(f"{PACKAGE}.{name}")
        module.__package__ = PACKAGE
        module.__file__ = f"molrl/sandbox/runtime/{name}.py"
        sys.modules[module.__name__] = module
        setattr(package, name, module)
        exec(compile(sources[name], module.__file__, "exec"), module.__dict__)
    return package


def read_message(fd: int) -> dict:
    """The one JSON message the harness writes on ``fd`` before closing its end."""
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return json.loads(b"".join(chunks))


def forbid_new_privileges() -> None:
    """Empty the capability bounding and ambient sets and set no_new_privs: no later exec grants a privilege.

    Runs before the uid changes (dropping from the bounding set needs CAP_SETPCAP); a process left at uid 0 would
    otherwise regain every capability by exec'ing any program.
    """
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == errno.EINVAL:
            break  # past the kernel's last capability


def drop_capabilities() -> None:
    """Empty the effective, permitted and inheritable capability sets (a task still at uid 0 keeps no capability)."""
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # two 32-bit halves of (effective, permitted, inheritable), all empty
    _libc.capset(header, data)


def main(argv: list[str]) -> None:
    """Read the job, confine this process, and run the model's code and calls (see the module docstring)."""
    job_fd, result_fd, req_fd, resp_fd = (int(arg) for arg in argv)
    message = read_message(job_fd)
    task = install_runtime(message["runtime"], ["codec", "task"]).task
    serve = (req_fd, resp_fd) if req_fd >= 0 else None
    forbid_new_privileges()
    task.confine(message["job"], message["uid"], None, {result_fd, *(serve or ())}, message["io"])
    drop_capabilities()
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after the uid change, which clears it
    if os.getppid() != message["harness"]:  # the harness died before that: nobody reads this job
        os._exit(1)
    if message["uid"] is None:  # a concurrent job's process of the same uid must not read this one's memory or fds
        _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    task.finish(task.run_task(message["job"], result_fd, serve))


if __name__ == "__main__":
    main(sys.argv[1:])
