"""Per-sample records of an evaluation, appended to ``samples.jsonl`` as problems finish.

A problem's samples are written together once all of them are graded, so a run that stops
mid-way resumes from the first unfinished problem and never regenerates finished samples.
Any text is written, a lone surrogate a program returned included (as a JSON escape).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from molrl.errors import DataError
from molrl.records.jsonl import json_line, read_lines, repair_torn_tail
from molrl.records.writes import append_text, write_text


@dataclass
class SampleRecord:
    """One graded completion of one problem."""

    id: str
    """The benchmark's own problem id."""
    sample: int
    """Index of this sample among the problem's samples."""
    completion: str
    """The model's text (for interactive runs, the whole conversation's assistant turns)."""
    extracted: str | None
    """The answer or code the grader pulled out of the completion (None when nothing was found)."""
    correct: bool
    """The verdict."""
    score: float
    """The graded score in [0, 1] (fraction of tests passed for code)."""
    stage: str
    """How far grading got (e.g. no_answer, mismatch, correct, test_failed)."""
    details: dict[str, Any] = field(default_factory=dict)
    """Why the grader judged as it did: normalised forms, failing test, error text."""
    truncated: bool = False
    """Generation stopped at the token limit (max_new_tokens) before the model ended its answer."""
    shown_pass: bool | None = None
    """code: every test the task may show passed (None: not code, or the task holds no test back)."""
    held_back_pass: bool | None = None
    """code: every held-back test passed, tests the model never saw (None: not code, or none held back)."""
    grading: int = 1
    """The version of its task kind's grading that judged it (``molrl.tasks.grade.GRADING``); records written
    before versions were kept were judged by version 1."""
    made_by: dict[str, Any] | None = None
    """What produced it (``made_by``): the engine, each model input's fingerprint and the sampling settings; None in
    records written before it was kept."""
    task_key: str | None = None
    """The problem's content key (``Task.content_key``): two records are of the same problem when their keys are
    equal, whatever their ids; None in records written before it was kept."""


def made_by(engine: str | None, model: dict[str, str], sampling: dict[str, Any] | None) -> dict[str, Any]:
    """A sample's ``made_by``: ``engine`` (``vllm``, ``transformers``; None: read from a predictions file), ``model``
    (``{input key: fingerprint}`` of the model and adapter, where each is a folder or a cached hub name) and the
    ``sampling`` settings it was drawn with (its chunk's seed included; None for predictions)."""
    return {"engine": engine, "model": model, "sampling": sampling}


def other_model(found: dict[str, list[SampleRecord]], model: dict[str, str]) -> SampleRecord | None:
    """The first record in ``found`` made from another model than ``model`` (fingerprints by input key), comparing
    the inputs both name; records that kept no ``made_by`` pass."""
    for records in found.values():
        for record in records:
            kept = (record.made_by or {}).get("model") or {}
            if any(kept[key] != model[key] for key in kept.keys() & model.keys()):
                return record
    return None


def recorded_engines(records: Iterable[SampleRecord]) -> str | None:
    """The engines ``records`` name as their makers, joined (``unrecorded`` for records written before they were kept);
    None when none was made by an engine (predictions)."""
    names = {(r.made_by or {"engine": "unrecorded"}).get("engine") for r in records}
    return ", ".join(sorted(n for n in names if n)) or None


class SampleStore:
    """The ``samples.jsonl`` of one benchmark: read what is done, append what finishes."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def load(self) -> dict[str, list[SampleRecord]]:
        """Finished samples grouped by problem id, in file order."""
        done: dict[str, list[SampleRecord]] = {}
        if not self.path.exists():
            return done
        # A record cut short by an interrupted run goes (its problem is redone), so that the next
        # append starts on a line of its own.
        repair_torn_tail(self.path)
        for line in read_lines(self.path):
            try:
                record = SampleRecord(**line.json())
            except DataError as err:
                raise DataError(err.path, err.line, f"{err.message} (or delete the file to start over)") from None
            except TypeError as err:
                raise DataError(
                    str(self.path), line.number, f"not a sample record ({err}); delete the file to start over"
                ) from None
            done.setdefault(record.id, []).append(record)
        return done

    def append(self, records: Iterable[SampleRecord]) -> None:
        """Add finished samples (one problem's worth at a time) and flush them to disk."""
        append_text(self.path, "".join(_line(r) for r in records))

    def rewrite(self, records: Iterable[SampleRecord]) -> None:
        """Replace the file with ``records`` (drops problems an interrupted run left half-written)."""
        write_text(self.path, "".join(_line(r) for r in records))


def _line(record: SampleRecord) -> str:
    return json_line(asdict(record), default=str) + "\n"
