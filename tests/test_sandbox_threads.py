"""Threads and spawned programs work in the sandbox within its process limit; bombs still stop."""

from __future__ import annotations

import os
import platform

import pytest

from molrl.sandbox import SandboxConfig, SandboxPool

from test_sandbox_attacks import live_processes

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="process limits per uid need root")


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(workers=1, timeout_s=30.0, max_processes=16, cache_size=0)) as p:
        yield p


@pytest.fixture
def uids(pool) -> set[int]:
    return {u for slot in pool.backend.slots for u in (slot.uid, slot.uid + 1)}


WORKING = {
    "thread": ("import threading\nout = []\nt = threading.Thread(target=lambda: out.append(6 * 7))\n"
               "t.start()\nt.join()\nprint(out)\n", "[42]\n"),
    "thread pool executor": ("from concurrent.futures import ThreadPoolExecutor\nwith ThreadPoolExecutor(4) as ex:\n"
                             "    print(sum(ex.map(abs, range(-100, 0))))\n", "5050\n"),
    "posix_spawn and subprocess": (
        "import os, subprocess\n"
        "pid = os.posix_spawn('/bin/echo', ['echo', 'spawned'], {})\n"
        "print(os.waitpid(pid, 0)[1])\n"
        "print(subprocess.run(['/bin/echo', 'sub'], capture_output=True, text=True).stdout, end='')\n",
        "spawned\n0\nsub\n"),
    "numpy": ("import numpy as np\nprint(int(np.arange(10).sum()))\n", "45\n"),
    "the devices honest code uses": (
        "import os, subprocess\n"
        "subprocess.run(['/bin/echo', 'quiet'], stdout=subprocess.DEVNULL, check=True)\n"
        "print(len(os.urandom(8)), len(open('/dev/urandom', 'rb').read(8)), len(open('/dev/random', 'rb').read(8)))\n"
        "print(open('/dev/zero', 'rb').read(2), open('/dev/null', 'w').write('gone'))\n"
        "print(subprocess.run(['bash', '-c', 'cat <(echo through-dev-fd)'], capture_output=True, text=True).stdout, end='')\n",
        "8 8 8\nb'\\x00\\x00' 4\nthrough-dev-fd\n"),
}


@pytest.mark.parametrize("name", WORKING)
def test_threads_and_spawned_programs_work(pool, name):
    code, stdout = WORKING[name]
    result = pool.run(code)
    assert (result.status, result.stdout) == ("ok", stdout), result.stderr


def test_threads_beyond_the_process_limit_are_refused(pool):
    code = (
        "import threading, time\nstarted = 0\n"
        "try:\n"
        "    for _ in range(100):\n"
        "        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
        "        started += 1\n"
        "except RuntimeError as err:\n"
        "    print(started < 16, err)\n"
    )
    result = pool.run(code)
    assert result.stdout == "True can't start new thread\n", result.stderr


def test_a_thread_bomb_is_stopped_and_reaped(pool, uids):
    code = (
        "import threading, os\n"
        "def bomb():\n"
        "    while True:\n"
        "        try:\n"
        "            threading.Thread(target=bomb).start()\n"
        "            os.fork()\n"
        "        except (RuntimeError, OSError):\n"
        "            pass\n"
        "bomb()\n"
    )
    result = pool.run(code, timeout_s=1.0)
    assert result.status == "timeout"
    assert live_processes(uids) == []
    assert pool.run("print('after')").stdout == "after\n"


CLONE_SYSCALL = {"x86_64": 56, "aarch64": 220}.get(platform.machine())


@pytest.mark.skipif(CLONE_SYSCALL is None, reason="clone's syscall number is not known here")
def test_a_namespace_is_still_refused_to_threads_and_clone(pool):
    code = (
        "import ctypes, os, threading\nlibc = ctypes.CDLL(None, use_errno=True)\nout = []\n"
        "def try_unshare():\n"
        "    out.append(libc.unshare(0x10000000))  # CLONE_NEWUSER\n"
        "t = threading.Thread(target=try_unshare)\nt.start()\nt.join()\n"
        f"out.append(libc.syscall({CLONE_SYSCALL}, 0x10000000 | 17, 0, 0, 0, 0))  # clone(CLONE_NEWUSER | SIGCHLD)\n"
        "print(out, ctypes.get_errno())\n"
    )
    result = pool.run(code)
    assert result.stdout == "[-1, -1] 1\n", result.stderr
