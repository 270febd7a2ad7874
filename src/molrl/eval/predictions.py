"""Completions produced elsewhere, read from a samples file for grading without a model.

One JSON object per line, ``{"id": ..., "completion": "..."}``, where ``id`` is the benchmark's
own id (``task_id`` for HumanEval/MBPP, ``unique_id`` for MATH-500, ``id`` for AIME). Several
lines with one id are that problem's samples, in file order. The file may be gzip-compressed
(whatever its name) and may start with a byte-order mark.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from molrl.errors import DataError, MolrlError
from molrl.records.jsonl import read_lines
from molrl.tasks import Task


def read_predictions(path: str | Path, tasks: Sequence[Task], benchmark: str) -> dict[str, list[str]]:
    """Completions per problem id; every id must name a problem of ``tasks``."""
    path = Path(path)
    if not path.is_file():
        raise MolrlError(f"{path}: predictions file not found")
    known = {t.id for t in tasks}
    example = next(iter(known), "?")
    out: dict[str, list[str]] = {}
    for line in read_lines(path):
        line_no, row = line.number, line.json()
        if not isinstance(row, dict) or "id" not in row or "completion" not in row:
            raise DataError(str(path), line_no, 'expected an object {"id": ..., "completion": "..."}')
        if not isinstance(row["completion"], str):
            raise DataError(str(path), line_no, f"completion must be a string, got {type(row['completion']).__name__}")
        task_id = str(row["id"])
        if task_id not in known:
            raise DataError(
                str(path), line_no,
                f"id {row['id']!r} is not a problem of {benchmark} (its ids look like {example!r}); "
                "check the benchmark name and the data file",
            )
        out.setdefault(task_id, []).append(row["completion"])
    if not out:
        raise DataError(str(path), None, "no predictions in the file")
    return out
