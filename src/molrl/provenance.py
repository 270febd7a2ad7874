"""What a model was made from and trained on, kept inside its own folder so that it travels with it.

Every folder of weights molrl writes (``ARTIFACTS``: an adapter, a checkpoint, a full model, a merged export, a GGUF
conversion) holds ``molrl_provenance.json`` (``PROVENANCE``), so ``cp -r``, a checkpoint picked by hand or an export
keeps it. A ``Provenance`` holds:

- ``base``: the model everything started from, by name and by its contents' fingerprint (``molrl.fingerprint``; a hub
  name as its cached snapshot);
- ``lineage``: the steps that made it, oldest first (``mol``, ``rl``, ``export``, ...), each with its run's config
  fingerprint and date; a run continuing from an adapter or a merged model inherits that model's record and appends;
- ``tasks``: the benchmark tasks it trained on (benchmark, split, id, content key), and ``keys``: the content keys of
  every task it trained on, benchmark or not, so eval recognises a problem by its text, whatever id it was trained
  under.

``read_provenance`` finds the record of whatever a stage loads (an adapter, a checkpoint, a run folder, a model
folder); ``trained_overlap`` is the one check eval makes with it. A run made before records lived inside the folder
left ``trained_on.json`` beside its adapter: it is read still, and matched by id. This module imports no torch.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from molrl.config import to_dict
from molrl.errors import MolrlError
from molrl.fingerprint import model_fingerprint
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
    where: str = ""
    """The file the record was read from (empty for one being made)."""

    def trained(self) -> bool:
        """Whether any step of the lineage trained (a conversion or a bare base did not)."""
        return any(step.get("stage") in TRAINING_STAGES for step in self.lineage)

    def to_json(self) -> str:
        """The record as written to ``PROVENANCE``."""
        data = {"base": self.base, "lineage": self.lineage, "tasks": [asdict(t) for t in self.tasks],
                "keys": self.keys}
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
    """One lineage step: ``stage``, its config fingerprint, and today's date and time (UTC)."""
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return {"stage": stage, "config": config, "date": date}


def made(stage: str, config: str, model: str, parents: Sequence[Provenance | None] = (),
         tasks: Iterable[TrainedTask] = (), keys: Iterable[str] = ()) -> Provenance:
    """The record of weights a ``stage`` step (config fingerprint ``config``) made from ``model``, continuing the
    ``parents`` (the records of the model folder and adapter it started from, None where they have none) and trained
    on ``tasks`` and the tasks with content ``keys``."""
    found = [p for p in parents if p is not None]
    base = next((p.base for p in found if p.base), None) or base_of(model)
    lineage = [step for p in found for step in p.lineage] + [step_record(stage, config)]
    return Provenance(base=base, lineage=lineage, tasks=_unique([t for p in found for t in p.tasks] + list(tasks)),
                      keys=sorted({k for p in found for k in p.keys} | set(keys)))


def trained_on(tasks: Iterable[Task]) -> tuple[list[TrainedTask], list[str]]:
    """What a record keeps of the tasks a run trains on: the benchmark ones (loaded from a benchmark's file), and the
    content keys of all."""
    from molrl.tasks.index import task_content_key
    from molrl.tasks.splits import benchmark_of

    found, keys = [], []
    for task in tasks:
        key = task_content_key(task)
        keys.append(key)
        if benchmark_of(task) is not None:
            found.append(TrainedTask(str(benchmark_of(task)), task.split, str(task.id), key))
    return found, keys


def _unique(tasks: list[TrainedTask]) -> list[TrainedTask]:
    return sorted(set(tasks), key=lambda t: (t.benchmark, t.split or "", t.id, t.key or ""))


def write_provenance(folder: str | Path, record: Provenance) -> Path:
    """Write ``record`` to ``folder/PROVENANCE``, atomically."""
    from molrl.writes import write_text

    path = Path(folder) / PROVENANCE
    write_text(path, record.to_json())
    return path


def read_provenance(path: str | Path | None) -> Provenance | None:
    """The record of what a stage loads from ``path``: an adapter, a checkpoint or a model folder (its own
    ``PROVENANCE``), a run folder (its ``adapter/`` or ``model/``), or a run made before records were kept inside
    (``trained_on.json`` beside the adapter or checkpoint); None for a hub name, ``tiny:...`` or a folder molrl did not
    make."""
    if path is None or str(path) == "":
        return None
    path = Path(str(path)).expanduser()
    if not path.is_dir():
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
        data = json.loads(path.read_text(encoding="utf-8"))
        tasks = [TrainedTask(str(t["benchmark"]), t.get("split"), str(t["id"]), t.get("key")) for t in data["tasks"]]
        return Provenance(base=dict(data["base"]), lineage=list(data["lineage"]), tasks=tasks,
                          keys=sorted(map(str, data["keys"])), where=str(path))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise MolrlError(f"{path}: not a molrl provenance record; restore it from the run that made these weights "
                         "(its adapter/ or checkpoints/ hold one), or delete it to treat the weights as unknown") from None


def _read_legacy(path: Path) -> Provenance:
    try:
        benchmarks = json.loads(path.read_text(encoding="utf-8"))["benchmarks"]
        tasks = [TrainedTask(str(name), split, str(i)) for name, splits in benchmarks.items()
                 for split, ids in splits.items() for i in ids]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise MolrlError(f"{path}: not a trained_on record; delete it or re-run the training run that wrote it") \
            from None
    return Provenance(lineage=[{"stage": "trained", "config": "", "date": ""}], tasks=_unique(tasks),
                      where=str(path))


def combined(records: Sequence[Provenance | None]) -> Provenance | None:
    """One record for weights loaded from several folders (a model folder and an adapter on it); None if none has one."""
    found = [r for r in records if r is not None]
    if not found:
        return None
    return Provenance(base=found[0].base, lineage=[s for r in found for s in r.lineage],
                      tasks=_unique([t for r in found for t in r.tasks]),
                      keys=sorted({k for r in found for k in r.keys}), where=", ".join(r.where for r in found))


def trained_test(record: Provenance) -> Callable[[Task], bool]:
    """Whether ``record`` trained on a task: by content key, or by (benchmark, split, id) for a task recorded without
    one (a record made before keys)."""
    from molrl.tasks.splits import benchmark_of

    from molrl.tasks.index import task_content_key

    keys = set(record.keys) | {t.key for t in record.tasks if t.key}
    by_id = {(t.benchmark, t.split, t.id) for t in record.tasks if not t.key}
    return lambda task: task_content_key(task) in keys or (benchmark_of(task), task.split, task.id) in by_id


def trained_overlap(record: Provenance, suites: dict[str, Sequence[Task]]) -> dict[str, int]:
    """Per benchmark of ``suites`` (name -> the problems to score): how many of its problems ``record`` trained on
    (``trained_test``)."""
    trained = trained_test(record)
    counts = {name: sum(map(trained, tasks)) for name, tasks in suites.items()}
    return {name: n for name, n in counts.items() if n}


def untrained(record: Provenance, tasks: Sequence[Task]) -> list[Task]:
    """The tasks of ``tasks`` that ``record`` did not train on (``trained_test``)."""
    trained = trained_test(record)
    return [task for task in tasks if not trained(task)]


def refuse_trained_overlap(record: Provenance, suites: dict[str, Sequence[Task]], key: str) -> None:
    """Raise one line naming the count per benchmark when ``record``'s weights trained on problems of ``suites``;
    ``key`` is the switch that allows scoring them."""
    counts = trained_overlap(record, suites)
    if counts:
        parts = ", ".join(f"{name}: {n} of {len(suites[name])}" for name, n in counts.items())
        raise MolrlError(f"{record.where}: the model was trained on {sum(counts.values())} of the problems to score "
                         f"({parts}); score other problems, or set {key}=true to score them anyway")


def check_scored(model: str, adapter: str | Path | None, suites: dict[str, Sequence[Task]], allow: bool,
                 key: str) -> None:
    """Before a model is scored on ``suites``: refuse, in one line naming the count per benchmark, problems the
    weights loaded from ``model`` and ``adapter`` trained on (unless ``allow``, the switch ``key``: then a warning
    says how many are scored); a model without a record is scored, with a line saying its training data is
    unknown."""
    record = combined([read_provenance(model), read_provenance(adapter)])
    if record is None or not record.trained():
        if not model.startswith("tiny:"):  # a tiny model is built in-process, trained on nothing
            shown = adapter or model
            log.warning("%s: its training data is unknown (no %s in it): problems it was trained on would be scored "
                        "like any other", shown, PROVENANCE)
        return
    if not allow:
        refuse_trained_overlap(record, suites, key)
        return
    counts = trained_overlap(record, suites)
    if counts:
        log.warning("%s=true: scoring %d problems the model was trained on (%s)", key, sum(counts.values()),
                    ", ".join(f"{name}: {n}" for name, n in counts.items()))
