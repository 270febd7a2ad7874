"""Nothing of one job reaches the next on the same slot: memory, SysV IPC, files, uids, cgroups."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from molrl.sandbox import SandboxConfig, SandboxPool
from molrl.tasks import Task, TestCase

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the isolation suite needs root (distinct uids)")

# Reads every private writable mapping of the process (heap, anonymous arenas, stack): where an
# earlier job's messages would linger if the process had ever held them, live or freed.
MEMORY_SCAN = r'''
import ctypes, re

def scan(pattern):
    found = set()
    with open("/proc/self/maps") as fh:
        maps = fh.read().splitlines()
    for line in maps:
        fields = line.split()
        name = fields[5] if len(fields) > 5 else ""
        if fields[1][:2] != "rw" or name not in ("", "[heap]", "[stack]"):
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        for at in range(start, end, 8 << 20):  # 8 MiB at a time, overlapping by 4 KiB
            chunk = ctypes.string_at(at, min(end - at, (8 << 20) + 4096))
            found.update(m.decode() for m in re.findall(pattern, chunk))
    return sorted(found)
'''

# Returns whatever `call` records of an earlier job it can find, as live objects or as JSON bytes.
COPYCAT = MEMORY_SCAN + r'''
import gc, json
seen = [0]

def plain(v):
    t = v.get("t")
    if t == "list":
        return [plain(x) for x in v["v"]]
    if t == "int":
        return int(v["v"])
    return v["v"] if t == "str" else None

def harvest(i):
    for o in gc.get_objects():
        if type(o) is dict and o.get("e") == "call" and o.get("i") == i and "value" in o:
            return plain(o["value"])
    for raw in scan(rb'\{"e":"call","i":%d,"value":\{[^\n]*?\}\}(?=\n|,\{|\])' % i):
        try:
            return plain(json.loads(raw)["value"])
        except ValueError:
            pass
    raise LookupError("nothing to copy")

def f(*args):
    seen[0] += 1
    return harvest(seen[0] - 1)
'''


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(workers=1, timeout_s=30.0, memory_mb=512, cache_size=0)) as p:
        yield p


@pytest.mark.parametrize("earlier_head,later_head", [("", ""), ("", "import numpy\n"), ("import numpy\n", "")],
                         ids=["lean-lean", "lean-warm", "warm-lean"])
def test_a_task_finds_no_trace_of_earlier_jobs_in_its_memory(pool, earlier_head, later_head):
    """Neither zygote (lean, or warm for code naming a preimported module) ever holds a job."""
    mark = uuid.uuid4().hex
    earlier = Task(id="earlier", prompt="", kind="code", entry_point="f", tests=[
        TestCase("call", args=[f"ZQJARGS{mark}"], expected="?"),
        TestCase("stdio", stdin=f"ZQJSTDN{mark}\n", stdout="?")])
    honest = earlier_head + f"# ZQJCODE{mark}\nimport sys\ndef f(x):\n    return x.replace('ARGS', 'RSLT')\nprint(sys.stdin.read().replace('STDN', 'STDO'))\n"
    first = pool.run_tests(honest, earlier)
    assert first.tests[0].got["v"] == f"ZQJRSLT{mark}"  # the earlier job really ran and returned it
    scanner = later_head + MEMORY_SCAN + "def f():\n    return scan(rb'ZQJ(?:CODE|ARGS|STDN|STDO|RSLT)[0-9a-f]{32}')\n"
    later = pool.run_tests(scanner, Task(id="later", prompt="", kind="code", entry_point="f",
                                         tests=[TestCase("call", args=[], expected=[])]))
    assert later.status == "ok" and later.tests[0].got["t"] == "list", later.tests[0].error
    found = [item["v"] for item in later.tests[0].got["v"]]
    assert [m for m in found if mark in m] == []


def copycat_scores(pool, task: Task, honest: str) -> tuple[int, int]:
    """(tests the honest sibling passed, tests the copycat graded next on the same slot passed)."""
    copycat = COPYCAT + f"{task.entry_point} = f\n"
    return pool.run_tests(honest, task).passed, pool.run_tests(copycat, task).passed


def test_a_copycat_cannot_reuse_a_siblings_results(pool):
    task = Task(id="t", prompt="", kind="code", entry_point="f",
                tests=[TestCase("call", args=[n], expected=n * n + 12345) for n in (3, 71, 802)])
    assert copycat_scores(pool, task, "def f(n):\n    return n * n + 12345\n") == (3, 0)


def test_a_copycat_fails_humaneval_after_an_honest_sibling(pool, shared_data):
    from molrl.tasks import load_tasks

    tasks = {t.id: t for t in load_tasks(shared_data / "humaneval" / "HumanEval.jsonl.gz", "humaneval")}
    scores = {tid: copycat_scores(pool, tasks[tid], tasks[tid].reference) for tid in ("HumanEval/1", "HumanEval/10", "HumanEval/12")}
    assert scores == {"HumanEval/1": (4, 0), "HumanEval/10": (5, 0), "HumanEval/12": (3, 0)}


def sysv(call: str) -> str:
    """Code that calls one SysV IPC function through ctypes and prints its result."""
    return f"import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nprint({call})\n"


IPC_CREAT, IPC_PRIVATE = 0o1000, 0


def test_sysv_shared_memory_left_by_a_task_is_gone_for_the_next(pool):
    key = 0x5EED
    leak = sysv(f"libc.shmget({key}, 1 << 30, {IPC_CREAT} | 0o666)") + (
        "libc.shmat.restype = ctypes.c_void_p\n"
        "addr = libc.shmat(libc.shmget(%d, 0, 0), None, 0)\n"
        "ctypes.memset(addr, 1, 1 << 30)  # 1 GiB really held by the segment, not by this process\n" % key)
    leaked = pool.run(leak, memory_mb=1600)
    assert leaked.status == "ok" and int(leaked.stdout.split()[0]) >= 0, leaked.stderr
    probe = pool.run(sysv(f"libc.shmget({key}, 0, 0), open('/proc/sysvipc/shm').read().count(chr(10))"))
    assert probe.stdout == "-1 1\n"  # not found; the listing has its header line only
    honest = [pool.run("x = bytearray(300 << 20)\nprint(len(x) >> 20)", memory_mb=512) for _ in range(4)]
    assert [(r.status, r.stdout) for r in honest] == [("ok", "300\n")] * 4


def test_sysv_message_queues_and_semaphores_left_by_a_task_are_gone(pool):
    leak = sysv(f"libc.msgget(0xBEEF, {IPC_CREAT} | 0o666), libc.semget(0xCAFE, 4, {IPC_CREAT} | 0o666), "
                f"libc.msgget({IPC_PRIVATE}, {IPC_CREAT} | 0o600)")
    leaked = pool.run(leak)
    assert leaked.status == "ok" and "-1" not in leaked.stdout
    probe = pool.run(sysv("libc.msgget(0xBEEF, 0), libc.semget(0xCAFE, 0, 0), "
                          "[len(open(f'/proc/sysvipc/{k}').readlines()) for k in ('msg', 'sem', 'shm')]"))
    assert probe.stdout == "-1 -1 [1, 1, 1]\n"


def test_posix_shared_memory_and_tmp_files_left_by_a_task_are_gone(pool):
    leak = (
        "import os\n"
        "for d in ('/dev/shm', '/tmp', '/var/tmp', '.'):\n"
        "    try:\n"
        "        open(os.path.join(d, 'left-behind'), 'w').write('x')\n"
        "    except OSError:\n"
        "        pass\n"
    )
    assert pool.run(leak).status == "ok"
    probe = pool.run("import os\nprint([d for d in ('/dev/shm', '/tmp', '/var/tmp', '.') if os.path.exists(os.path.join(d, 'left-behind'))])")
    assert probe.stdout == "[]\n"


def test_posix_message_queues_are_refused(pool):
    code = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print(libc.mq_open(b'/leak', 0o100 | 0o2, 0o600, None), ctypes.get_errno())\n")
    assert pool.run(code).stdout == "-1 1\n"  # EPERM: there is nothing to clean up between tasks


def slot_ids(pool: SandboxPool) -> list[tuple[int, str | None]]:
    return [(slot.uid, str(slot.cgroup.path) if slot.cgroup.path else None) for slot in pool.backend.slots]


def test_nine_pools_alive_at_once_share_no_uid_or_cgroup():
    pools = []
    try:
        for _ in range(10):
            pools.append(SandboxPool(SandboxConfig(workers=1, cache_size=0)))
        uids = [u for p in pools for s in p.backend.slots for u in (s.uid, s.uid + 1)]
        cgroups = [path for p in pools for _, path in slot_ids(p) if path]
        assert len(set(uids)) == len(uids) == 20 and len(set(cgroups)) == len(cgroups)
        fork = "import os\npids = [os.fork() for _ in range(3)]\nif 0 in pids:\n    os._exit(0)\nprint('forked')\n"
        assert [p.run(fork).stdout for p in (pools[0], pools[8], pools[9])] == ["forked\n"] * 3
    finally:
        for p in pools:
            p.close()


HOLD_A_POOL = (
    "import sys\nfrom molrl.sandbox import SandboxConfig, SandboxPool\n"
    "with SandboxPool(SandboxConfig(workers=2, cache_size=0)) as p:\n"
    "    print(*[s.uid for s in p.backend.slots], flush=True)\n"
    "    sys.stdin.read()\n"
)


def test_pools_in_other_processes_share_no_uids():
    held = [subprocess.Popen([sys.executable, "-c", HOLD_A_POOL], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for _ in range(2)]
    try:
        theirs = [int(u) for proc in held for u in proc.stdout.readline().split()]
        with SandboxPool(SandboxConfig(workers=2, cache_size=0)) as mine:
            ours = [s.uid for s in mine.backend.slots]
    finally:
        for proc in held:
            proc.communicate("", timeout=60)
    blocks = [{u, u + 1} for u in theirs + ours]
    assert len(theirs) == 4 and len(set().union(*blocks)) == 2 * len(blocks)


def test_zombies_of_orphans_never_count_against_the_next_task(pool):
    # each job's child exits first and is left unwaited: its zombie re-parents to the slot
    leave_zombie = "import os, time\nif os.fork() == 0:\n    os._exit(0)\ntime.sleep(0.05)\nprint('left')\n"
    left = pool.run_many([f"# {i}\n{leave_zombie}" for i in range(pool.cfg.max_processes + 8)])
    assert {(r.status, r.stdout) for r in left} == {("ok", "left\n")}
    fork = "import os\nkids = [os.fork() for _ in range(4)]\nif 0 in kids:\n    os._exit(0)\nprint('forked')\n"
    assert pool.run(fork).stdout == "forked\n"
