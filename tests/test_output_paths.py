"""One rule for what an output path may already be (``molrl.records.writes.resolve_output``), over every file kind and every
writer: a regular file is replaced whole (or appended to), a FIFO or character device is written in place and stays
what it is, a socket or block device is refused in one line, and a symbolic link is followed to what it names.

Device nodes are made with ``os.mknod`` inside the test's temporary folder, never under /dev. The character device
has /dev/null's numbers (1, 3); the block device's numbers name no disk (loop device 999), so a writer that wrongly
opened it would fail rather than write to a disk.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
from pathlib import Path

import pytest

from molrl.records import writes
from molrl.errors import MolrlError
from molrl.records.jsonl import write_jsonl
from molrl.traces.schema import Trace, append_trace

TRACE = Trace(messages=[{"role": "user", "content": "task"}, {"role": "assistant", "content": "answer"}])


def _make(kind: str, path: Path) -> None:
    """Put a file of ``kind`` at ``path`` (``new``: nothing)."""
    if kind == "file":
        path.write_text("old\n")
    elif kind == "folder":
        path.mkdir()
        (path / "old.txt").write_text("old\n")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "char":
        _mknod(path, stat.S_IFCHR, 1, 3)
    elif kind == "block":
        _mknod(path, stat.S_IFBLK, 7, 999)
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.close()  # the socket file stays


def _mknod(path: Path, kind: int, major: int, minor: int) -> None:
    try:
        os.mknod(path, kind | 0o666, os.makedev(major, minor))
    except PermissionError:
        pytest.skip("making a device node needs CAP_MKNOD")


KINDS = ["new", "file", "folder", "fifo", "char", "block", "socket"]
"""Every kind of thing an output path can already be (a symbolic link to each is enumerated too)."""


WRITERS = {
    "write_text": (lambda p: writes.write_text(p, "new\n"), "file"),
    "write_bytes": (lambda p: writes.write_bytes(p, b"new\n"), "file"),
    "write_jsonl": (lambda p: write_jsonl(p, [{"new": 1}]), "file"),
    "append_text": (lambda p: writes.append_text(p, "new\n", sync=True), "append"),
    "append_trace": (lambda p: append_trace(p, TRACE), "append"),
    "write_folder": (None, "folder"),
}
"""Every writer of an output path: a whole file, an appended log, or a whole folder."""


def _write_folder(path: Path) -> None:
    with writes.write_folder(path) as tmp:
        (tmp / "new.txt").write_text("new\n")


def _expected(kind: str, role: str) -> str:
    """What the rule makes of a write: ``written`` (a file or folder holds the new content), ``stream`` (written in
    place, still the same special file) or ``refused``."""
    if kind in ("block", "socket"):
        return "refused"
    if role == "folder":  # an existing folder holds old.txt, which the new one does not write again
        return "written" if kind == "new" else "refused"
    if kind == "folder":
        return "refused"
    return "stream" if kind in ("fifo", "char") else "written"


def _run(writer: str, path: Path) -> tuple[str, str]:
    """Write ``path`` with ``writer``; (what happened, what a FIFO's reader got)."""
    write, _role = WRITERS[writer]
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK) if path.exists() and stat.S_ISFIFO(path.stat().st_mode) else None
    try:
        try:
            (write or _write_folder)(path)
        except MolrlError as err:
            return "refused", str(err)
        got = ""
        if reader is not None:
            got = os.read(reader, 65536).decode()
        return "done", got
    finally:
        if reader is not None:
            os.close(reader)


@pytest.mark.parametrize("link", [False, True], ids=["direct", "symlink"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("writer", WRITERS)
def test_every_writer_meets_every_file_kind_by_the_one_rule(tmp_path, writer, kind, link):
    target = tmp_path / "real" / "out"
    target.parent.mkdir()
    _make(kind, target)
    named = target
    if link:
        named = tmp_path / "link"
        named.symlink_to(target)
    mode_before = os.lstat(target).st_mode if kind != "new" else None
    role = WRITERS[writer][1]
    outcome, detail = _run(writer, named)
    expected = _expected(kind, role)
    if expected == "refused":
        assert outcome == "refused"
        assert detail.startswith(f"{named}") and "\n" not in detail  # one line naming the path given
        assert "give" in detail  # and the fix
    else:
        assert outcome == "done", detail
    if link:
        assert named.is_symlink() and os.readlink(named) == str(target)  # the link stays a link
    if kind != "new":
        assert stat.S_IFMT(os.lstat(target).st_mode) == stat.S_IFMT(mode_before)  # never replaced by another kind
    if expected == "stream" and kind == "fifo":
        assert detail.endswith("\n") and detail.strip()  # the reader got the lines
    if expected == "written":
        _check_written(target, writer, role, kind)
    if expected == "refused" and kind == "file":
        assert target.read_text() == "old\n"
    assert sorted(p.name for p in target.parent.iterdir()) == (["out"] if kind != "new" or expected != "refused"
                                                               else [])  # no temporary left


def _check_written(target: Path, writer: str, role: str, kind: str) -> None:
    if role == "folder":
        assert sorted(p.name for p in target.iterdir()) == [writes.WHOLE, "new.txt"]
        return
    text = target.read_text()
    new = {"write_jsonl": '{"new": 1}\n', "append_trace": TRACE.to_json() + "\n"}.get(writer, "new\n")
    assert text == (("old\n" if kind == "file" and role == "append" else "") + new)


def test_the_rule_covers_every_file_type_the_system_has():
    types = {getattr(stat, name) for name in dir(stat) if name.startswith("S_IF") and name != "S_IFMT"
             and getattr(stat, name)}
    assert set(writes._KINDS) | set(writes._REFUSED) == types


def test_a_symlink_loop_is_refused_in_one_line(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(MolrlError, match=rf"^{re.escape(str(loop))}.*: is a symbolic link that never reaches a file"):
        writes.write_text(loop, "x")


def test_a_dangling_symlink_creates_its_target_and_stays_a_link(tmp_path):
    link, target = tmp_path / "link", tmp_path / "made" / "out.txt"
    link.symlink_to(target)
    writes.write_text(link, "new\n")
    assert link.is_symlink() and target.read_text() == "new\n"


def _convert(tmp_path: Path, rejects: Path) -> None:
    from molrl.cli import main

    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"messages": [{"role": "user", "content": "t"}, {"role": "assistant", "content": "a"}]})
                   + "\n{not json\n")
    assert main(["traces", "convert", "--from", "openai", str(src), str(tmp_path / "out.jsonl"),
                 "--rejects", str(rejects)]) == 0


def test_traces_convert_rejects_to_a_character_device_keeps_it_a_device(tmp_path, monkeypatch):
    monkeypatch.setattr("molrl.cli.setup_logging", lambda verbose=False: None)
    null = tmp_path / "null"
    _mknod(null, stat.S_IFCHR, 1, 3)  # /dev/null's numbers, made here: the rejects go nowhere
    _convert(tmp_path, null)  # before: the rejects file was renamed over it, a regular file
    assert stat.S_ISCHR(os.lstat(null).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "null", "out.jsonl"]  # no temporary, no lock


def test_traces_convert_rejects_to_a_fifo_streams_them(tmp_path, monkeypatch):
    monkeypatch.setattr("molrl.cli.setup_logging", lambda verbose=False: None)
    fifo = tmp_path / "rejects"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        _convert(tmp_path, fifo)
        (line,) = os.read(reader, 65536).decode().splitlines()
    finally:
        os.close(reader)
    assert json.loads(line)["line"] == 2 and stat.S_ISFIFO(os.lstat(fifo).st_mode)


ALLOWED = {
    ("demo/base.py", ".save_pretrained"): "the demo's base model, whole when the marker written after it says so",
    ("demo/expert.py", "os.replace"): "the demo's expert traces, made under a temporary name in its own work folder",
    ("demo/run.py", "os.replace"): "the demo's replay traces, made under a temporary name in its own work folder",
    ("demo/pretrained_base.py", "os.replace"): "the warm-up's work folder, moved into the model folder made from it",
    ("engines/adapters.py", ".save_pretrained"): "the engine's merged copy, in a temporary folder the engine made",
    ("engines/policy.py", ".save_pretrained"): "the adapter handed to the in-process engine, in its own work folder",
    ("engines/server/policy.py", ".save_pretrained"): "the adapter published to the engine servers, in their work "
                                                      "folder",
    ("graders/math_worker.py", ".open('wb')"): "the worker's own stdout",
    ("records/jsonl.py", ".open('ab')"): "repair_torn_tail: a log's torn last line kept beside it",
    ("records/jsonl.py", ".open('r+b')"): "repair_torn_tail: the log cut back to its last whole line, in place",
    ("sandbox/cgroup.py", ".write_text"): "the kernel's cgroup control files",
    ("sandbox/runtime/worker.py", "open('w')"): "a sandboxed program's stdin, in its scratch folder",
}
"""Writes in the package that do not go through ``molrl.records.writes``, each with why it need not."""


def _writes_outside_the_rule() -> set[tuple[str, str]]:
    """(module, call) for every call in the package that writes or renames a path other than through ``molrl.records.writes``
    (a ``save_pretrained`` into a ``write_folder`` block counts as through it)."""
    import ast

    src = Path(__file__).resolve().parents[1] / "src" / "molrl"
    found = set()
    for file in sorted(src.rglob("*.py")):
        if file.name == "writes.py":
            continue
        tree = ast.parse(file.read_text())
        inside = {id(n) for w in ast.walk(tree) if isinstance(w, ast.With) and any(
            isinstance(i.context_expr, ast.Call) and getattr(i.context_expr.func, "id", getattr(
                i.context_expr.func, "attr", None)) == "write_folder" for i in w.items) for n in ast.walk(w)}
        for node in ast.walk(tree):
            what = _write_call(node) if isinstance(node, ast.Call) else None
            if what and not (what == ".save_pretrained" and id(node) in inside):
                found.add((str(file.relative_to(src)), what))
    return found


def _write_call(call) -> str | None:
    import ast

    fn, mode = call.func, None
    base = getattr(getattr(fn, "value", None), "id", None)
    for arg in [*call.args, *(k.value for k in call.keywords if k.arg == "mode")]:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and set(arg.value) <= set("rwabxt+") \
                and set(arg.value) & set("wax+"):
            mode = arg.value
    if isinstance(fn, ast.Name):
        return f"open({mode!r})" if fn.id == "open" and mode else None
    if not isinstance(fn, ast.Attribute):
        return None
    if fn.attr == "replace" and base == "os" or fn.attr == "move" and base == "shutil":
        return f"{base}.{fn.attr}"
    if fn.attr in ("rename", "write_text", "write_bytes", "save_pretrained") and base != "writes":
        return f".{fn.attr}"
    return f".open({mode!r})" if fn.attr in ("open", "fdopen") and base != "os" and mode else None


def test_every_write_in_the_package_goes_through_the_one_rule():
    unexplained = _writes_outside_the_rule() - set(ALLOWED)
    assert not unexplained, ("write these through molrl.records.writes (write_text / write_bytes / write_folder / "
                             f"append_text), or add them to ALLOWED with why: {sorted(unexplained)}")
