"""Which uid the harness gives its child: one no process and no account uses, where the harness can (embedded in
the harness program by ``molrl.sandbox.remote.harness`` and run there; standard library only)."""

from __future__ import annotations

import os
import random
import sys

FRESH_UID_RANGES = ((2**31, 2**32 - 2), (100_000, 2**31))
"""Where a uid of the child's own is looked for, in order: above every account and local molrl pool (pools take the
lowest free blocks from 1e6 up), else above ordinary accounts; only inside this user namespace's uid map, and only one
no process uses now."""


def fresh_uid(cleanup) -> int | None:
    """A uid for the child that no process and no account uses, or None where the child must share this one.

    Only root can give the child another uid, and only an interpreter every uid can read still imports modules
    after the switch.
    """
    if os.geteuid() != 0 or not _readable_by_all():
        return None
    mapped = _mapped_uids()
    accounts = _account_uids()
    for low, high in FRESH_UID_RANGES:
        spans = [(max(low, a), min(high, b)) for a, b in mapped if min(high, b) > max(low, a)]
        for _ in range(8 if spans else 0):
            a, b = random.choice(spans)
            uid = random.randrange(a, b)
            if uid not in accounts and not cleanup.scan_proc((uid,), -1):
                return uid
    return None


def _readable_by_all() -> bool:
    """Whether every uid can run this interpreter and read its installation."""
    paths = {os.path.dirname(os.path.realpath(sys.executable)), os.path.realpath(sys.prefix),
             os.path.realpath(sys.base_prefix)}
    for path in paths:
        node = path
        while True:
            try:
                if not os.stat(node).st_mode & 0o001:
                    return False
            except OSError:
                return False
            if node == os.path.dirname(node):
                break
            node = os.path.dirname(node)
    return bool(os.stat(os.path.realpath(sys.executable)).st_mode & 0o004)


def _mapped_uids() -> list[tuple[int, int]]:
    """The uids this user namespace maps, as [first, past-last) spans (the whole range where /proc says nothing)."""
    try:
        with open("/proc/self/uid_map") as fh:
            rows = [line.split() for line in fh]
    except OSError:
        return [(0, 2**32 - 1)]
    return [(int(inside), int(inside) + int(count)) for inside, _, count in rows]


def _account_uids() -> set[int]:
    """The uids of /etc/passwd's accounts."""
    try:
        with open("/etc/passwd") as fh:
            rows = [line.split(":") for line in fh]
    except OSError:
        return set()
    return {int(fields[2]) for fields in rows if len(fields) > 2 and fields[2].isdigit()}
