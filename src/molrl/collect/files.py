"""Where a collect run keeps its files: ``output_dir/traces.jsonl`` (the traces), ``traces.rejects.jsonl`` (episodes
without a valid trace) and ``config.yaml`` (its resolved config), as every stage keeps its output in ``output_dir``.

A run made before, when collect wrote one trace file ``out`` with ``<out>.config.yaml`` and ``<out>.rejects.jsonl``
beside it, resumes where it lies: its old ``out: X.jsonl`` reads as ``output_dir: X`` (``traces.jsonl`` as its
folder), and ``collect_files`` finds ``X.jsonl`` (or ``X/traces.jsonl``) with its old config beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TRACES = "traces.jsonl"
"""The trace file's name in ``output_dir``."""


@dataclass(frozen=True)
class CollectFiles:
    """The files of one collect run."""

    traces: Path
    """The trace file finished episodes are appended to."""
    rejects: Path
    """Episodes that could not become a valid trace, with the reason (counted as done when resuming)."""
    config: Path
    """The resolved config the traces were made with (``molrl.records.rerun``)."""
    before: bool = False
    """The run was made before collect wrote into ``output_dir``: its files lie under the names of that layout."""


def collect_files(output_dir: Path) -> CollectFiles:
    """The files of the collect run in ``output_dir``: the current layout, or a run of the earlier one where it lies
    (a trace file whose ``<name>.config.yaml`` is beside it and no ``config.yaml`` in ``output_dir``)."""
    output_dir = Path(output_dir)
    current = CollectFiles(output_dir / TRACES, output_dir / "traces.rejects.jsonl", output_dir / "config.yaml")
    if current.config.is_file():
        return current
    beside = [output_dir.with_name(output_dir.name + ".jsonl")] if output_dir.name else []
    for traces in (output_dir / TRACES, *beside):
        config = traces.with_name(traces.name + ".config.yaml")
        if config.is_file():
            return CollectFiles(traces, traces.with_name(traces.name + ".rejects.jsonl"), config, before=True)
    return current


def output_dir_of(out: str | Path) -> str:
    """The ``output_dir`` an old ``out`` trace file reads as: ``X.jsonl`` -> ``X``, ``D/traces.jsonl`` -> ``D``
    (``collect_files`` then finds the file where it lies)."""
    path = Path(out)
    if path.name == TRACES:
        return str(path.parent)
    if path.suffix != ".jsonl":
        raise ValueError(f"{out}: not a .jsonl file")
    return str(path.with_suffix(""))
