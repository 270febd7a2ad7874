"""Adapter-only sync to the servers, and the check that they hold the expected base.

After each optimiser step the trainer's main process saves the adapter under ``engine_sync_dir`` (a path every server
reads: a shared filesystem on a cluster) in a folder of a new name, and loads it on every live server under that name
(``/v1/load_lora_adapter``); the previous adapter is unloaded, and its folder removed, once no request samples from it
(``ServerPool.when_unused``). Every other process waits until the servers list the new name (``AdapterSync.follow``).

The main process sees only its own requests. With several processes, another may still sample from the previous
adapter when the main one loads the next: under one-step-off overlap its rows for the next step were submitted under
the previous adapter and are collected only at that step. So with several processes the main one keeps one adapter
more (``keep_behind=1``): the adapter two loads back is unloaded, which no process can still use, since every process
collected its rows on it before the training step whose gradients they all share ended.
Names carry a tag drawn once per run, so a resumed run never meets an adapter an earlier one left loaded.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from molrl.engines.server.client import ServerFailed
from molrl.engines.server.pool import ServerPool
from molrl.errors import MolrlError
from molrl.records.writes import plain_name

log = logging.getLogger(__name__)

LOAD_WAIT_S = 600.0
"""Seconds a process other than the main one waits for the servers to list a new adapter."""


def adapter_name(tag: str, count: int) -> str:
    """The name the ``count``-th adapter of a run tagged ``tag`` is loaded under."""
    return f"molrl-{tag}-{count}"


def adapter_folder(folder: Path, name: str) -> Path:
    """Where the adapter ``name`` is saved under ``folder`` (and removed from, once unloaded): refused in one line
    unless the name is one plain folder name (``molrl.records.writes.plain_name``), so no adapter is written or deleted
    outside ``folder``."""
    if not plain_name(name):
        raise MolrlError(f"adapter name {name!r}: not one plain folder name, so its folder would lie outside {folder}; "
                         "give a name that is not '.' or '..' and holds no '/', '\\' or NUL")
    return Path(folder) / name


def same_model(served: str, expected: str) -> bool:
    """Whether a server's model (its path or hub name as it was started) is ``expected``: equal as given, or the same
    folder once both are resolved."""
    if served == expected:
        return True
    a, b = Path(served).expanduser(), Path(expected).expanduser()
    return a.exists() and b.exists() and a.resolve() == b.resolve()


def base_card(url: str, cards: list[dict[str, Any]]) -> dict[str, Any]:
    """The base model's card among a server's ``/v1/models`` cards (the one with no parent)."""
    for card in cards:
        if not card.get("parent"):
            return card
    raise MolrlError(f"engine server {url}: /v1/models lists no base model; is it a vLLM server (molrl serve)?")


def check_base(url: str, cards: list[dict[str, Any]], expected: str) -> str:
    """The served base's name, after checking that it is ``expected``; otherwise an error naming both."""
    card = base_card(url, cards)
    served = str(card.get("root") or card.get("id"))
    if not (same_model(served, expected) or same_model(str(card.get("id")), expected)):
        raise MolrlError(f"engine server {url} serves {served}, but this run's policy is on {expected}: start the "
                         f"server with molrl serve --model {expected} (or point engine_servers at one that does)")
    return str(card.get("id"))


class AdapterSync:
    """The adapters a run loads on the servers of ``pool``: saved under ``folder``, named by ``tag``."""

    def __init__(self, pool: ServerPool, folder: Path, tag: str, keep_behind: int = 0):
        self.pool, self.folder, self.tag = pool, Path(folder), tag
        self.count = 0
        self.current: str | None = None
        """The name requests sample from now."""
        self.owner = False
        """This process loaded ``current`` (and unloads it)."""
        self.keep_behind = keep_behind
        """How many adapters before the previous one stay loaded (0: one process; 1: several, see the module)."""
        self.retired: list[str] = []
        """Adapters this process loaded and no longer samples from, oldest first, not yet handed to the unload."""

    def next_name(self) -> str:
        """Advance to the next adapter's name (every process counts alike)."""
        self.count += 1
        return adapter_name(self.tag, self.count)

    def publish(self, name: str, save: Callable[[Path], None]) -> None:
        """Save the adapter (``save`` writes it into the folder it is given) and load it on every live server under
        ``name``; the previous one is unloaded once unused."""
        path = adapter_folder(self.folder, name).resolve()
        save(path)
        self.pool.call_everywhere(f"loading adapter {name}", lambda c: c.load_adapter(name, str(path)))
        self.switch(name, owner=True)

    def follow(self, name: str) -> None:
        """On a process other than the main one: wait until every live server lists ``name``, then sample from it. A
        server that cannot be reached is taken out of this process's pool, as the main process takes it out of its
        own when the load fails there (a server whose answer is refused, likewise)."""
        deadline = time.monotonic() + LOAD_WAIT_S
        while True:
            listed = True
            for client in self.pool.live():
                try:
                    cards = client.models()
                except ServerFailed as err:
                    self.pool.mark_down(client, f"{err.state} (waiting for adapter {name}): {err.reason}")
                    continue
                if name not in {card.get("id") for card in cards}:
                    listed = False
                    break
            if not any(self.pool.alive):
                raise self.pool.no_server_left()
            if listed:
                break
            if time.monotonic() > deadline:
                raise MolrlError(f"engine servers did not list adapter {name} within {LOAD_WAIT_S:.0f} s of the main "
                                 "process saving it; see the main process's log")
            time.sleep(0.2)
        self.switch(name, owner=False)

    def switch(self, name: str, owner: bool) -> None:
        previous, self.current, self.owner = self.current, name, owner
        if previous is not None and owner:
            self.retired.append(previous)
        while len(self.retired) > self.keep_behind:
            old = self.retired.pop(0)
            self.pool.when_unused(old, lambda old=old: self.drop(old))

    def drop(self, name: str) -> None:
        """Unload ``name`` from every live server and remove its folder."""
        folder = adapter_folder(self.folder, name)
        try:
            self.pool.call_everywhere(f"unloading adapter {name}", lambda c: c.unload_adapter(name))
        except MolrlError as err:  # an adapter left loaded costs memory, not correctness
            log.warning("adapter %s: %s", name, err)
        shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        """Unload the current adapter (the servers are left as they were found)."""
        current, self.current = self.current, None
        for old in self.retired:
            self.drop(old)
        self.retired = []
        if current is not None and self.owner:
            self.drop(current)
