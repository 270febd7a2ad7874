"""Seccomp deny-lists, compiled with libseccomp (ctypes, no extra package) and loaded as raw BPF.

Denied calls fail with EPERM rather than killing the process, so ordinary Python code sees a clean
``PermissionError``. Denied: creating sockets (network and local), tracing other processes,
mounting and namespaces, changing uid/gid, loading kernel code, POSIX message queues, watching
file activity (fanotify, inotify), and a few host-wide controls. ``clone3`` fails with ENOSYS instead, so libc falls back to plain ``clone``,
whose flags (unlike clone3's, passed in memory) the filter can inspect: threads and
``posix_spawn`` work, new namespaces do not.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os

DENIED_SYSCALLS = (
    # network and local sockets
    "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4",
    # other processes' memory and tracing
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    # mounts and namespaces
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns",
    "fsopen", "fsmount", "fsconfig", "move_mount", "open_tree", "mount_setattr",
    "open_by_handle_at", "name_to_handle_at",
    # kernel and host-wide state
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "bpf",
    "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key", "reboot", "swapon",
    "swapoff", "acct", "quotactl", "syslog", "iopl", "ioperm", "sethostname", "setdomainname",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "personality", "lookup_dcookie",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    # POSIX message queues outlive their task and cannot be listed to be cleaned up
    "mq_open",
    # watching file activity: through the read-only binds, when the host or another slot opens files
    "fanotify_init", "fanotify_mark", "inotify_init", "inotify_init1", "inotify_add_watch",
)
"""Syscalls that fail with EPERM in the worker and every task. The worker never needs them, so it
installs this filter once and every fork inherits it."""

UNIMPLEMENTED_SYSCALLS = ("clone3",)
"""Syscalls that fail with ENOSYS along with the deny-list: libc then falls back to an older call
the filter can inspect (clone3 -> clone)."""

IDENTITY_SYSCALLS = (
    "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setgroups",
    "setfsuid", "setfsgid", "capset",
)
"""Denied on top, in each task after it has dropped to its own uid (the worker needs them for that)."""

_SCMP_ACT_ALLOW = 0x7FFF0000
_SCMP_ACT_ERRNO = 0x00050000
_SCMP_CMP_MASKED_EQ = 7
# CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
_CLONE_NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


def load_library():
    """The libseccomp shared library, or None when the host has none."""
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _rules(lib, ctx, names: tuple[str, ...], clone_namespaces: bool) -> int:
    """Add EPERM rules for ``names`` (and, with ``clone_namespaces``, for namespace-creating clone
    and ENOSYS for clone3) to a libseccomp context."""
    eperm = _SCMP_ACT_ERRNO | errno.EPERM
    actions = [(name, eperm) for name in names]
    if clone_namespaces:
        actions += [(name, _SCMP_ACT_ERRNO | errno.ENOSYS) for name in UNIMPLEMENTED_SYSCALLS]
    rules = 0
    for name, action in actions:
        number = lib.seccomp_syscall_resolve_name(name.encode())
        if number < 0:  # not on this architecture
            continue
        if lib.seccomp_rule_add(ctx, action, number, 0) != 0:
            raise OSError(f"seccomp rule for {name} failed")
        rules += 1
    if not clone_namespaces:
        return rules
    clone = lib.seccomp_syscall_resolve_name(b"clone")
    # clone(flags) fails when any namespace flag is set (one rule per flag: rules are OR-ed)
    for flag in (1 << bit for bit in range(32) if _CLONE_NAMESPACE_FLAGS >> bit & 1):
        cmp = _ArgCmp(0, _SCMP_CMP_MASKED_EQ, flag, flag)
        if lib.seccomp_rule_add_array(ctx, eperm, clone, 1, ctypes.byref(cmp)) != 0:
            raise OSError("seccomp rule for clone failed")
        rules += 1
    return rules


def compile_filter(lib, names: tuple[str, ...] = DENIED_SYSCALLS, clone_namespaces: bool = True) -> bytes:
    """A deny-list as a raw BPF program, compiled once so each process only has to load it."""
    ctx = lib.seccomp_init(_SCMP_ACT_ALLOW)
    if not ctx:
        raise OSError("seccomp_init failed")
    read_fd, write_fd = os.pipe()
    try:
        _rules(lib, ctx, names, clone_namespaces)
        if lib.seccomp_export_bpf(ctx, write_fd) != 0:
            raise OSError("seccomp_export_bpf failed")
        os.close(write_fd)
        write_fd = -1
        chunks = []
        while chunk := os.read(read_fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        lib.seccomp_release(ctx)
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)


_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2


def load_filter(program: bytes) -> None:
    """Install a compiled filter in the calling process (irreversible), with no_new_privs."""
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.addressof(buf))
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")
