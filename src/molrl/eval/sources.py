"""Where an eval run's graded samples come from: a model sampled single-turn, or a predictions file.

Each source answers ``records(benchmark, tasks, offset, pool) -> list[list[SampleRecord]]`` (the
graded samples of each task), ``finished(benchmark, task_id, records)``: whether the records an
earlier run left for a problem are complete, which is what resuming checks, and ``made_by(offset)`` and
``model_fingerprints()``: what the samples it makes record of their making (``molrl.eval.samples.made_by``). The interactive
source (``molrl.eval.interactive``) has the same shape.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Sequence

from molrl.config import to_dict
from molrl.errors import MolrlError
from molrl.eval.config import EvalConfig
from molrl.eval.grading import grade_samples
from molrl.eval.predictions import read_predictions
from molrl.eval.samples import SampleRecord, made_by
from molrl.eval.single import generate_chunk
from molrl.engines.builder import open_generator
from molrl.engines.sampling import SamplingConfig
from molrl.records.run_inputs import model_fingerprints
from molrl.tasks import Task

log = logging.getLogger(__name__)


class PredictionSource:
    """Completions read from one predictions JSONL per benchmark; no model is loaded."""

    mode = "predictions"

    def __init__(self, cfg: EvalConfig):
        self.cfg = cfg
        self.label = cfg.label or ", ".join(Path(p).name for p in dict.fromkeys(cfg.predictions.values()))
        self.by_benchmark: dict[str, dict[str, list[str]]] = {}

    def close(self) -> None:
        """Nothing to release: no model is loaded."""

    def model_fingerprints(self) -> dict[str, str]:
        """None known: the completions were made elsewhere."""
        return {}

    def made_by(self, offset: int) -> dict[str, Any]:
        """No engine, model or sampling is known of completions made elsewhere."""
        return made_by(None, {}, None)

    def select(self, name: str, tasks: Sequence[Task]) -> list[Task]:
        """The problems to score: all of them, or those with predictions when partial_predictions is set."""
        path = self.cfg.predictions[name]
        preds = self.by_benchmark[name] = read_predictions(path, tasks, name)
        missing = [t.id for t in tasks if t.id not in preds]
        if missing and not self.cfg.partial_predictions:
            raise MolrlError(
                f"{path}: {len(missing)} of {len(tasks)} {name} problems have no prediction (first: {missing[0]!r}); "
                "add them, pass --limit, or set partial_predictions=true to score only those present"
            )
        if missing:
            log.warning("%s: scoring %d of %d problems (the ones with predictions)", name, len(tasks) - len(missing), len(tasks))
        return [t for t in tasks if t.id in preds]

    def finished(self, name: str, task_id: str, records: Sequence[SampleRecord]) -> bool:
        """Graded already, and from the completions the file holds now (an edited file is regraded)."""
        return [r.completion for r in records] == self.by_benchmark[name].get(task_id)

    def records(self, name: str, tasks: Sequence[Task], offset: int, pool: Any) -> list[list[SampleRecord]]:
        return grade_samples(tasks, [self.by_benchmark[name][t.id] for t in tasks], pool)


class SamplingSource:
    """Single-turn completions sampled from the configured model (loaded on first use)."""

    mode = "single"

    def __init__(self, cfg: EvalConfig):
        self.cfg = cfg
        self.label = cfg.label or (cfg.model.path if not cfg.model.adapter else f"{cfg.model.path}+{Path(cfg.model.adapter).name}")
        self._generator: Any = None
        self._tokenizer: Any = None
        self.planned_tokens = 0
        """Tokens this run is to generate at most (problems x samples x most new tokens), for ``engine=auto``."""
        self._fingerprints: dict[str, str] | None = None

    def plan(self, problems: int, turns: int = 1) -> None:
        """Record how many problems are left to sample, each for up to ``turns`` turns."""
        self.planned_tokens = problems * turns * self.cfg.sampling.n * self.cfg.sampling.max_new_tokens

    def select(self, name: str, tasks: Sequence[Task]) -> list[Task]:
        return list(tasks)

    def finished(self, name: str, task_id: str, records: Sequence[SampleRecord]) -> bool:
        return len(records) == self.cfg.sampling.n

    def chunk_sampling(self, offset: int) -> SamplingConfig:
        """The sampling of the chunk that starts at problem ``offset``: seeded by its place in the benchmark, which
        keeps chunks from repeating one random stream."""
        return dataclasses.replace(self.cfg.sampling, seed=self.cfg.sampling.seed + offset)

    def model_fingerprints(self) -> dict[str, str]:
        """The fingerprints of the model and adapter sampled (``molrl.records.run_inputs.model_fingerprints``), read once."""
        if self._fingerprints is None:
            self._fingerprints = model_fingerprints("eval", self.cfg)
        return self._fingerprints

    def made_by(self, offset: int) -> dict[str, Any]:
        """The engine loaded, the model's fingerprints and the sampling of the chunk at ``offset``."""
        return made_by(getattr(self._generator, "engine", None), self.model_fingerprints(),
                       to_dict(self.chunk_sampling(offset)))

    def records(self, name: str, tasks: Sequence[Task], offset: int, pool: Any) -> list[list[SampleRecord]]:
        generator, tokenizer = self.load()
        sampling = self.chunk_sampling(offset)
        completions = generate_chunk(
            generator, tokenizer, tasks, sampling, enable_thinking=self.cfg.thinking,
            code_template=self.cfg.code_prompt, math_template=self.cfg.math_prompt,
        )
        return grade_samples(tasks, completions, pool)

    def load(self) -> tuple[Any, Any]:
        """The generator and tokenizer of the configured model."""
        if self._generator is None:
            self._generator, self._tokenizer = open_generator("eval", self.cfg, self.planned_tokens,
                                                              batch_size=self.cfg.batch_size,
                                                              static_cache=self.cfg.static_cache)
        return self._generator, self._tokenizer

    def close(self) -> None:
        """Release the generator (a vLLM engine's memory, a merged copy of the model), if one was loaded."""
        generator, self._generator = self._generator, None
        if generator is not None and hasattr(generator, "close"):
            generator.close()
