"""Reading and writing JSON-lines files: one reader for traces, predictions and metrics logs.

What a file may hold, and what the reader makes of it:
  * gzip, bzip2 or xz compression, recognised by the file's first bytes whatever it is called,
    is read through; another archive format (zip, zstd) is an error saying to unpack it;
  * a UTF-8 byte-order mark (Windows editors write one) is skipped;
  * bytes that are not UTF-8 make that line unusable: ``Line.error`` says so, with the column;
  * a final line without a newline is marked incomplete (``Line.complete``): a killed writer
    leaves one, and each caller decides whether that is damage or a tail to drop;
  * a record holding a lone surrogate (``"\\ud800"`` with no partner, in a key or a value at any
    depth) is a bad line, as malformed JSON is: no tokenizer or UTF-8 file takes one, so it would
    fail later with no file and line, or pass unchecked into a command's output.
Lines are split at ``\\n`` only, so a U+2028 inside a JSON string stays inside its record.

Writing (``json_line``): text is written as UTF-8 except what UTF-8 cannot hold, a surrogate
(``chr(0xD800)``, which a program's output can carry), which is written as the visible text
``\\ud800`` (a backslash, then the code point), so a writer never fails on text and never writes a
line that the reader rejects.
"""

from __future__ import annotations

import bz2
import gzip
import json
import logging
import lzma
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator

from molrl.errors import DataError, MolrlError
from molrl.records.writes import open_output

log = logging.getLogger(__name__)

_BOM = "\ufeff"
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_DECOMPRESSORS: dict[bytes, tuple[str, Callable[[Path], IO[bytes]]]] = {
    b"\x1f\x8b": ("gzip", lambda p: gzip.open(p, "rb")),
    b"BZh": ("bzip2", lambda p: bz2.open(p, "rb")),
    b"\xfd7zXZ\x00": ("xz", lambda p: lzma.open(p, "rb")),
}
_ARCHIVES = {b"PK\x03\x04": "a zip archive: unzip it", b"\x28\xb5\x2f\xfd": "zstd-compressed: zstd -d it"}


@dataclass(frozen=True)
class Line:
    """One non-blank line of a JSON-lines file, decoded."""

    path: str
    """The file it came from."""
    number: int
    """1-based line number."""
    text: str
    """The line without its newline (invalid bytes replaced when ``error`` is set)."""
    complete: bool
    """False for a final line with no newline: what a writer killed mid-line leaves."""
    error: str | None = None
    """Why the line cannot be read as text (not UTF-8), or None."""

    def json(self) -> Any:
        """The parsed record; raises ``DataError`` naming file, line and fix when it is not one."""
        if self.error is not None:
            raise DataError(self.path, self.number, self.error)
        try:
            record = json.loads(self.text)
        except json.JSONDecodeError as err:
            if not self.complete:
                raise DataError(self.path, self.number, "truncated final line (no newline): the writer was stopped "
                                "mid-write; delete this line or re-run the step that wrote it") from None
            raise DataError(self.path, self.number,
                            f"malformed JSON ({err.msg} at column {err.colno}); fix or delete the line") from None
        # a lone surrogate can only come from a \uD800-\uDFFF escape: the decoded text holds none itself
        found = lone_surrogate(record) if _SURROGATE_ESCAPE.search(self.text) else None
        if found is not None:
            raise DataError(self.path, self.number, f"{found}; fix the file (a lone surrogate is not text: "
                            "remove it or write the character it was meant to be)")
        return record


def lone_surrogate(record: Any, where: str = "") -> str | None:
    """Where a parsed JSON value holds a lone surrogate, as ``lone surrogate U+D800 in messages[1].content``; else None.

    A high surrogate followed by a low one in the text is a pair (``json.loads`` makes it one character),
    so whatever surrogate is left in a string, key or value, at any depth, is a lone one.
    """
    if isinstance(record, str):
        hit = _SURROGATE.search(record)
        if hit is None:
            return None
        return f"lone surrogate U+{ord(hit.group()):04X} in {where or 'the record'} at character {hit.start() + 1}"
    if isinstance(record, dict):
        for key, value in record.items():
            inner = f"{where}.{key}" if where else str(key)
            found = lone_surrogate(key, f"a key of {where or 'the record'}") or lone_surrogate(value, inner)
            if found is not None:
                return found
    elif isinstance(record, list):
        for index, value in enumerate(record):
            found = lone_surrogate(value, f"{where}[{index}]")
            if found is not None:
                return found
    return None


def read_lines(path: str | Path) -> Iterator[Line]:
    """The non-blank lines of ``path``, decompressed and decoded; raises ``MolrlError`` on an unreadable file."""
    path = Path(path)
    handle = _open(path)
    number = 0
    try:
        with handle:
            for number, raw in enumerate(handle, start=1):
                line = _decode(str(path), number, raw)
                if line is not None:
                    yield line
    except (OSError, EOFError, zlib.error, lzma.LZMAError) as err:
        # gzip.BadGzipFile is an OSError; a compressed file cut short raises EOFError
        raise DataError(str(path), number + 1, f"the compressed data is damaged or cut short ({err}); "
                        "decompress it by hand to see how much is intact, or write the file again") from None


def _open(path: Path) -> IO[bytes]:
    try:
        with path.open("rb") as probe:
            head = probe.read(6)
    except FileNotFoundError:
        raise MolrlError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise MolrlError(f"{path}: is a directory; expected a JSON-lines file") from None
    for magic, (_name, opener) in _DECOMPRESSORS.items():
        if head.startswith(magic):
            return opener(path)
    for magic, what in _ARCHIVES.items():
        if head.startswith(magic):
            raise MolrlError(f"{path}: is {what} and pass the .jsonl file inside")
    return path.open("rb")


def _decode(path: str, number: int, raw: bytes) -> Line | None:
    complete = raw.endswith(b"\n")
    body = raw[:-1] if complete else raw
    try:
        text, error = body.decode("utf-8"), None
    except UnicodeDecodeError as err:
        column = len(body[: err.start].decode("utf-8", errors="replace")) + 1
        text = body.decode("utf-8", errors="replace")
        error = (f"not UTF-8 text (byte 0x{body[err.start]:02x} at column {column}); save the file as UTF-8 "
                 "(e.g. iconv -f latin1 -t utf-8 IN > OUT) or fix the line")
    text = text.lstrip(_BOM)  # at a file's start, or where files with one were concatenated
    if not text.strip():
        return None
    return Line(path, number, text, complete, error)


def repair_torn_tail(path: str | Path) -> None:
    """Cut a final line left unfinished by a killed writer, keeping it in ``<path>.torn``, with a warning."""
    path = Path(path)
    if not path.is_file() or _ends_clean(path):
        return
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    log.warning("%s:%d: the last line was cut off mid-write (the run was killed); it is moved to %s.torn",
                path, data.count(b"\n", 0, keep) + 1, path.name)
    with path.with_name(path.name + ".torn").open("ab") as handle:
        handle.write(data[keep:] + b"\n")
    with path.open("r+b") as handle:
        handle.truncate(keep)
        os.fsync(handle.fileno())


def _ends_clean(path: Path) -> bool:
    """Whether the file is empty or ends with a newline (reads one byte, not the file)."""
    with path.open("rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        return size == 0 or os.pread(handle.fileno(), 1, size - 1) == b"\n"


def read_records(path: str | Path) -> list[Any]:
    """Every record of a file this program appends to (metrics, completions), for reading back.

    A final line cut off mid-write (a kill during a log write) is skipped with a warning; damage
    anywhere else is a ``DataError`` naming the file and line.
    """
    records = []
    for line in read_lines(path):
        try:
            records.append(line.json())
        except DataError:
            if line.complete:
                raise
            log.warning("%s:%d: skipping the last line, cut off mid-write (the run was killed)", line.path, line.number)
    return records


def json_line(record: Any, default: Callable[[Any], Any] | None = None) -> str:
    """``record`` as one line of JSON (no newline) that always encodes as UTF-8: surrogates become text ``\\ud800``.

    Raises ``TypeError`` / ``ValueError`` for what JSON cannot hold (an object ``default`` does not turn
    into data, a circular reference).
    """
    text = json.dumps(record, ensure_ascii=False, default=default)
    # outside strings JSON is ASCII, so a surrogate here sits in a string: an escaped backslash and the code
    # point read back as the visible text \ud800, never as a surrogate the reader would reject
    return _SURROGATE.sub(lambda m: f"\\\\u{ord(m.group()):04x}", text)


def write_jsonl(path: str | Path, records: Iterable[dict[str, Any]]) -> int:
    """Write JSON records one per line, whole or not at all (a FIFO or device: streamed in place, by
    ``molrl.records.writes``' rule for output paths); returns the number written."""
    n = 0
    with open_output(path) as out:
        for record in records:
            out.write((json_line(record) + "\n").encode("utf-8"))
            n += 1
    return n
