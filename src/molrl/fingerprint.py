"""A cheap hash of the contents of a file or folder: what the re-run rule (``molrl.rerun``) compares a run's inputs by,
so that an input replaced under the same name is noticed."""

from __future__ import annotations

import hashlib
from pathlib import Path

_WHOLE_FILE = 16 << 20
_PIECE = 1 << 20


def fingerprint(path: Path) -> str:
    """A hash of the contents of a file or folder (its files, by relative name; hidden files and temporaries left
    out; a run folder holding ``adapter/`` stands for that adapter). Files up to 16 MiB are hashed whole; a larger
    one (model weights) by its size and its first, middle and last MiB, so a multi-GB folder costs milliseconds:
    another file of the same size that differs only elsewhere would pass, which other trained weights
    practically never do. Modification times are left out: a copy or a touch keeps the contents."""
    path = Path(path)
    if path.is_dir() and (path / "adapter" / "adapter_config.json").is_file() \
            and not (path / "adapter_config.json").is_file():
        path = path / "adapter"
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and not any(
        part.startswith(".") or ".tmp-" in part or ".old-" in part for part in p.relative_to(path).parts))
    for file in files:
        digest.update(f"{file.relative_to(path) if file != path else ''}\0".encode())
        digest.update(_file_digest(file))
    return digest.hexdigest()


def _file_digest(file: Path) -> bytes:
    size = file.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with file.open("rb") as handle:
        if size <= _WHOLE_FILE:
            digest.update(handle.read())
        else:
            for start in (0, size // 2, size - _PIECE):
                handle.seek(start)
                digest.update(handle.read(_PIECE))
    return digest.digest()
