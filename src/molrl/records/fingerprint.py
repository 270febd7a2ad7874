"""A cheap hash of the contents of a file or folder: what the re-run rule (``molrl.records.rerun``) compares a run's inputs by,
so that an input replaced under the same name is noticed. A model named on the hub (``org/name``) is the snapshot of
the local hub cache its ``refs/main`` points to (``hub_snapshot``), fingerprinted like a folder."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
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


_HUB_NAME = re.compile(r"(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*")  # org/name, or a bare name (gpt2)


@dataclass(frozen=True)
class HubSnapshot:
    """The files of a hub model in the local cache: the commit ``refs/main`` points to, and its snapshot folder."""

    name: str
    commit: str
    folder: Path

    def __str__(self) -> str:
        return f"{self.name}@{self.commit}"


def hub_snapshot(name: str, revision: str = "main") -> HubSnapshot | None:
    """The cached snapshot the hub name ``name`` (``org/name``, or a bare name) loads, found offline in the hub cache
    (``huggingface_hub.snapshot_download`` with ``local_files_only``): the commit ``REVISION`` names and its folder;
    None for a local path, an uncached name or a broken ref."""
    if not _HUB_NAME.fullmatch(name) or Path(name).expanduser().exists():
        return None
    from huggingface_hub import constants, snapshot_download

    try:
        folder = Path(snapshot_download(name, revision=revision, cache_dir=constants.HF_HUB_CACHE,
                                        local_files_only=True))
    except (OSError, ValueError):  # not cached (LocalEntryNotFoundError), a name the hub refuses (HFValidationError)
        return None
    return HubSnapshot(name, folder.name, folder)


def model_fingerprint(name: str) -> dict[str, str] | None:
    """``{"path", "fingerprint"}`` of a model given by folder, file or cached hub name (``path``: the resolved folder,
    or ``org/name@commit``); None for what is neither (``tiny:...``, a name not in the cache)."""
    path = Path(name).expanduser()
    if path.exists():
        return {"path": str(path.resolve()), "fingerprint": fingerprint(path)}
    snapshot = hub_snapshot(name)
    if snapshot is None:
        return None
    return {"path": str(snapshot), "fingerprint": fingerprint(snapshot.folder)}
