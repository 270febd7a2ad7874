"""What a model was made from and trained on, kept inside its own folder so that it travels with it.

Every folder of weights molrl writes (``ARTIFACTS``: an adapter, a checkpoint, a full model, a merged export, a GGUF
conversion) holds ``molrl_provenance.json`` (``PROVENANCE``), so ``cp -r``, a checkpoint picked by hand or an export
keeps it. A ``Provenance`` holds:

- ``base``: the model everything started from, by name and by its contents' fingerprint (``molrl.records.fingerprint``; a hub
  name as its cached snapshot);
- ``lineage``: the steps that made it, oldest first (``mol``, ``rl``, ``export``, ...), each with its run's config
  fingerprint and date; a run continuing from an adapter or a merged model inherits that model's record and appends;
- ``tasks``: the benchmark tasks it trained on by their explicit tag (benchmark, split, id, content key), ``keys``:
  the content keys of every task it trained on, benchmark or not, and ``texts``: the normalised text of each task
  that named no benchmark (``molrl.tasks.index.match_text``), so eval recognises a problem by its text, whatever id
  or wrapper it was trained under.

``read_provenance`` finds the record of whatever a stage loads (an adapter, a checkpoint, a run folder, a model
folder, a hub name's cached snapshot) and reads it against a bounded schema (``molrl.records.provenance_schema``): a malformed
file is one line naming it. ``trained_overlap`` is the one check eval makes with it, by the rule exclusion uses
(``molrl.tasks.index.BenchmarkIndex.find``): what ``traces filter --exclude-benchmarks`` would leave out, eval
refuses. A run made before records lived inside the folder left ``trained_on.json`` beside its adapter: it is read
still, and matched by id. This module imports no torch.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from molrl.config import to_dict
from molrl.errors import MolrlError
from molrl.records.fingerprint import model_fingerprint
from molrl.records.input_checks import model_folder
from molrl.records.provenance_schema import MAX_BYTES, MAX_TEXT, STAGES, RecordError, check_legacy, check_record, load_json
from molrl.task_types import Task

log = logging.getLogger(__name__)

PROVENANCE = "molrl_provenance.json"
"""The file, inside every folder of weights molrl writes, recording what the weights were made from and trained on."""
LEGACY = "trained_on.json"
"""The record a run made before ``PROVENANCE`` existed kept beside its adapter (benchmark -> split -> ids)."""
ARTIFACTS = {
    "adapter": "a training run's final LoRA adapter (RUN/adapter)",
    "checkpoint": "a training run's checkpoint (RUN/checkpoints/checkpoint-N)",
    "model": "a training run's full model (MoL without LoRA, RL with merge_new: RUN/model)",
    "merged": "molrl export --merge's model folder",
    "gguf": "molrl export --gguf's model folder",
}
"""Every kind of weights folder molrl writes, each of which carries ``PROVENANCE`` inside."""
TRAINING_STAGES = ("mol", "rl", "trained")
"""The lineage steps that train (``trained``: a run recorded in ``trained_on.json``, its stage not kept): a record
without one holds a base whose training data molrl does not know."""


@dataclass(frozen=True)
class TrainedTask:
    """A benchmark task trained on: where it is from and its content key (None in a record made before keys)."""

    benchmark: str
    split: str | None
    id: str
    key: str | None = None


@dataclass
class Provenance:
    """What a folder of weights was made from (``base``), by which steps (``lineage``), and trained on."""

    base: dict[str, Any] = field(default_factory=dict)
    """``{"model": name, "path": resolved, "fingerprint": ...}`` of the model the first step started from."""
    lineage: list[dict[str, Any]] = field(default_factory=list)
    """The steps that made the weights, oldest first: ``{"stage", "config", "date"}``."""
    tasks: list[TrainedTask] = field(default_factory=list)
    """The benchmark tasks trained on, by benchmark, split, id and content key."""
    keys: list[str] = field(default_factory=list)
    """The content keys of every task trained on (sorted)."""
    texts: dict[str, list[str]] = field(default_factory=dict)
    """Per content key of a task that named no benchmark: its normalised text(s), searched by containment."""
    where: str = ""
    """The file the record was read from (empty for one being made)."""

    def trained(self) -> bool:
        """Whether any step of the lineage trained (a conversion or a bare base did not)."""
        return any(step.get("stage") in TRAINING_STAGES for step in self.lineage)

    def to_json(self) -> str:
        """The record as written to ``PROVENANCE``."""
        data = {"base": self.base, "lineage": self.lineage, "tasks": [asdict(t) for t in self.tasks],
                "keys": self.keys, "texts": self.texts}
        return json.dumps(data, indent=1, sort_keys=True) + "\n"


def config_fingerprint(cfg: Any) -> str:
    """A hash of a run's resolved config, where it writes (``output_dir``) left out: the same settings, the same hash."""
    data = to_dict(cfg)
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if k != "output_dir"}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def base_of(model: str) -> dict[str, Any]:
    """``base`` for a step starting from ``model`` (a folder, a cached hub name, or ``tiny:...``: no fingerprint)."""
    known = model_fingerprint(model) or {}
    return {"model": model, **known}


def step_record(stage: str, config: str) -> dict[str, Any]:
    """One lineage step: ``stage`` (one of ``STAGES``), its config fingerprint, and today's date and time (UTC)."""
    if stage not in STAGES:
        raise ValueError(f"lineage stage {stage!r} is not one of {', '.join(STAGES)}")
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return {"stage": stage, "config": config, "date": date}


def made(stage: str, config: str, model: str, parents: Sequence[Provenance | None] = (),
         tasks: Iterable[TrainedTask] = (), keys: Iterable[str] = (),
         texts: Mapping[str, Iterable[str]] | None = None) -> Provenance:
    """The record of weights a ``stage`` step (config fingerprint ``config``) made from ``model``, continuing the
    ``parents`` (the records of the model folder and adapter it started from, None where they have none) and trained
    on ``tasks`` and the tasks with content ``keys`` (those that named no benchmark with their ``texts``)."""
    found = [p for p in parents if p is not None]
    base = next((p.base for p in found if p.base), None) or base_of(model)
    lineage = [step for p in found for step in p.lineage] + [step_record(stage, config)]
    return Provenance(base=base, lineage=lineage, tasks=_unique([t for p in found for t in p.tasks] + list(tasks)),
                      keys=sorted({k for p in found for k in p.keys} | set(keys)),
                      texts=_merged_texts([p.texts for p in found] + [texts or {}]))


def trained_on(tasks: Iterable[Task]) -> tuple[list[TrainedTask], list[str], dict[str, list[str]]]:
    """What a record keeps of the tasks a run trains on: the benchmark ones (loaded from a benchmark's file), the
    content keys of all, and the normalised texts of the others."""
    from molrl.tasks.index import match_text, task_content_key
    from molrl.tasks.splits import benchmark_of

    found, keys, texts = [], [], {}
    for task in tasks:
        key = task_content_key(task)
        keys.append(key)
        if benchmark_of(task) is not None:
            found.append(TrainedTask(str(benchmark_of(task)), task.split, str(task.id), key))
        else:
            texts.setdefault(key, []).append(match_text(task.prompt))
    return found, keys, texts


def _unique(tasks: list[TrainedTask]) -> list[TrainedTask]:
    return sorted(set(tasks), key=lambda t: (t.benchmark, t.split or "", t.id, t.key or ""))


def _merged_texts(groups: Iterable[Mapping[str, Iterable[str]]]) -> dict[str, list[str]]:
    """Per content key, each distinct text once (cut to ``MAX_TEXT``), keys sorted."""
    merged: dict[str, dict[str, None]] = {}
    for group in groups:
        for key, texts in group.items():
            merged.setdefault(key, {}).update(dict.fromkeys(text[:MAX_TEXT] for text in texts))
    return {key: list(merged[key]) for key in sorted(merged)}


def write_provenance(folder: str | Path, record: Provenance) -> Path:
    """Write ``record`` to ``folder/PROVENANCE``, atomically; one the reader would refuse (``molrl.records.provenance_schema``)
    is refused in one line instead."""
    from molrl.records.writes import write_text

    path = Path(folder) / PROVENANCE
    text = record.to_json()  # ASCII: json.dumps escapes the rest
    if len(text) > MAX_BYTES:
        raise MolrlError(f"{path}: the record of what these weights trained on cannot be written: the keys and texts "
                         f"of {len(record.keys)} tasks take {len(text):,} bytes, over the {MAX_BYTES:,} a record "
                         "holds; train on fewer distinct tasks per run")
    try:
        check_record(json.loads(text))
    except RecordError as err:
        raise MolrlError(f"{path}: the record of what these weights trained on would not read back ({err}); fix the "
                         "input it names and run again") from None
    write_text(path, text)
    return path


def read_provenance(path: str | Path | None) -> Provenance | None:
    """The record of what a stage loads from ``path``: an adapter, a checkpoint or a model folder (its own
    ``PROVENANCE``), a run folder (its ``adapter/`` or ``model/``), a hub name (its cached snapshot, ``model_folder``),
    or a run made before records were kept inside (``trained_on.json`` beside the adapter or checkpoint); None for
    ``tiny:...``, a file, a path that is not there, or a folder molrl did not make. A hub name neither a folder nor
    cached, or a malformed record, is one line naming it."""
    if path is None or str(path) == "" or str(path).startswith("tiny:"):
        return None
    path = model_folder(str(path))
    if path is None or not path.is_dir():
        return None
    for folder in (path, path / "adapter", path / "model"):
        if (folder / PROVENANCE).is_file():
            return _read(folder / PROVENANCE)
    for folder in (path, path.parent, path.parent.parent):
        if (folder / LEGACY).is_file():
            return _read_legacy(folder / LEGACY)
    return None


def _read(path: Path) -> Provenance:
    try:
        data = check_record(load_json(path))
    except (OSError, RecordError) as err:
        why = err.strerror if isinstance(err, OSError) else err
        raise MolrlError(f"{path}: not a molrl provenance record ({why}); restore it from the run that made these "
                         "weights (its adapter/ or checkpoints/ hold one), or delete it to treat the weights as "
                         "unknown") from None
    tasks = [TrainedTask(t["benchmark"], t.get("split"), t["id"], t.get("key")) for t in data["tasks"]]
    return Provenance(base=dict(data["base"]), lineage=list(data["lineage"]), tasks=_unique(tasks),
                      keys=sorted(set(data["keys"])), texts=_merged_texts([data["texts"]]), where=str(path))


def _read_legacy(path: Path) -> Provenance:
    try:
        benchmarks = check_legacy(load_json(path, max_depth=4))
    except (OSError, RecordError) as err:
        why = err.strerror if isinstance(err, OSError) else err
        raise MolrlError(f"{path}: not a trained_on record ({why}); delete it or re-run the training run that wrote "
                         "it") from None
    tasks = [TrainedTask(name, split, str(i)) for name, splits in benchmarks.items()
             for split, ids in splits.items() for i in ids]
    return Provenance(lineage=[{"stage": "trained", "config": "", "date": ""}], tasks=_unique(tasks),
                      where=str(path))


def combined(records: Sequence[Provenance | None]) -> Provenance | None:
    """One record for weights loaded from several folders (a model folder and an adapter on it); None if none has one."""
    found = [r for r in records if r is not None]
    if not found:
        return None
    return Provenance(base=found[0].base, lineage=[s for r in found for s in r.lineage],
                      tasks=_unique([t for r in found for t in r.tasks]),
                      keys=sorted({k for r in found for k in r.keys}), texts=_merged_texts([r.texts for r in found]),
                      where=", ".join(r.where for r in found))


def trained_matches(record: Provenance, index: Any) -> set[tuple[str, str]]:
    """(benchmark, id) of every task of ``index`` (a ``molrl.tasks.index.BenchmarkIndex``) ``record``'s weights
    trained on, by the rule exclusion uses (``BenchmarkIndex.find``): a task recorded by its tag (else its key), each
    content key by itself (else its texts)."""
    found = [m for task in record.tasks
             for m in index.find([{"benchmark": task.benchmark, "id": task.id}], [task.key] if task.key else [])]
    found += [m for key in record.keys for m in index.find(keys=[key], texts=record.texts.get(key, ()))]
    return {(m.benchmark, m.id) for m in found}


def trained_overlap(record: Provenance, suites: dict[str, Sequence[Task]],
                    known: Mapping[str, Sequence[Task]] | None = None) -> dict[str, int]:
    """Per benchmark of ``suites`` (name -> the problems to score): how many of its problems ``record`` trained on
    (``trained_matches``), matched among ``known`` (name -> every task of the benchmark's file, as exclusion reads it;
    default the suites)."""
    from molrl.tasks.index import BenchmarkIndex

    every = {}
    for name, tasks in suites.items():  # each problem to score is indexed, whatever ``known`` holds
        whole = list((known or {}).get(name, ()))
        ids = {str(task.id) for task in whole}
        every[name] = whole + [task for task in tasks if str(task.id) not in ids]
    found = trained_matches(record, BenchmarkIndex(every))
    counts = {name: sum((name, str(task.id)) in found for task in tasks) for name, tasks in suites.items()}
    return {name: n for name, n in counts.items() if n}


def untrained(record: Provenance, tasks: Sequence[Task]) -> list[Task]:
    """The tasks of ``tasks`` that ``record`` did not train on (``trained_matches``)."""
    from molrl.tasks.index import BenchmarkIndex

    found = trained_matches(record, BenchmarkIndex({"tasks": tasks}))
    return [task for task in tasks if ("tasks", str(task.id)) not in found]


def refuse_trained_overlap(record: Provenance, suites: dict[str, Sequence[Task]], key: str,
                           known: Mapping[str, Sequence[Task]] | None = None) -> None:
    """Raise one line naming the count per benchmark when ``record``'s weights trained on problems of ``suites``
    (``trained_overlap``); ``key`` is the switch that allows scoring them."""
    counts = trained_overlap(record, suites, known)
    if counts:
        parts = ", ".join(f"{name}: {n} of {len(suites[name])}" for name, n in counts.items())
        raise MolrlError(f"{record.where}: the model was trained on {sum(counts.values())} of the problems to score "
                         f"({parts}); score other problems, or set {key}=true to score them anyway")


def check_scored(model: str | None, adapter: str | Path | None, suites: dict[str, Sequence[Task]], allow: bool,
                 key: str, known: Mapping[str, Sequence[Task]] | None = None) -> None:
    """Before a model is scored on ``suites``: refuse, in one line naming the count per benchmark, problems the
    weights loaded from ``model`` (a folder or a cached hub name) and ``adapter`` trained on, matched among ``known``
    (every task of each benchmark's file; default the suites), unless ``allow`` (the switch ``key``: then a warning
    says how many are scored); a model without a record is scored, with a line saying its training data is
    unknown."""
    record = combined([read_provenance(model), read_provenance(adapter)])
    if record is None or not record.trained():
        if not str(model).startswith("tiny:"):  # a tiny model is built in-process, trained on nothing
            shown = adapter or model
            log.warning("%s: its training data is unknown (no %s in it): problems it was trained on would be scored "
                        "like any other", shown, PROVENANCE)
        return
    if not allow:
        refuse_trained_overlap(record, suites, key, known)
        return
    counts = trained_overlap(record, suites, known)
    if counts:
        log.warning("%s=true: scoring %d problems the model was trained on (%s)", key, sum(counts.values()),
                    ", ".join(f"{name}: {n}" for name, n in counts.items()))
