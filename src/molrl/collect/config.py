"""The config of a trace collection run (``CollectConfig``); how each episode runs is ``molrl.episode.config``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from molrl.config.strict import seal
from molrl.config.idle import check_idle
from molrl.engines.choice import check_choice
from molrl.engines.registry import EngineName
from molrl.config.blocks import ModelSource, TaskSource, as_model_source
from molrl.episode.config import EpisodeConfig
from molrl.collect.files import output_dir_of
from molrl.config.ranges import RunDir, Threads
from molrl.engines.sampling import SamplingConfig
from molrl.sandbox import SandboxConfig


@dataclass
class CollectConfig:
    """``molrl collect``: run a model as an agent on tasks and append its traces to output_dir/traces.jsonl."""

    model: ModelSource
    """The model that acts (``model: PATH`` for short), an adapter on it and its dtype."""
    output_dir: RunDir = Path("runs/collect")
    """Run directory: traces.jsonl (finished episodes are appended to it; re-running resumes it),
    traces.rejects.jsonl, config.yaml."""
    data: TaskSource = field(default_factory=TaskSource)
    """The tasks collected on: ``data.path`` (required), its format (HumanEval .jsonl/.jsonl.gz, MBPP, MATH-500, AIME,
    or molrl task JSONL with fields under ``data.spec``), split (unset: train) and limit, as rl's ``data``."""
    engine: EngineName = "auto"
    """Generation engine: auto (vLLM when installed and the work pays for its start, else transformers), vllm,
    vllm_server (the servers of engine_servers) or transformers (``molrl.engines.choice``); an adapter is served as vLLM LoRA
    (in-process vLLM: or merged into a temporary copy)."""
    engine_servers: list[str] = field(default_factory=list)
    """With engine=vllm_server: the vLLM servers to generate on (http://HOST:PORT each, as molrl serve prints), all
    started on model.path; model.adapter must be a folder they read."""

    RENAMED_KEYS: ClassVar[dict[str, tuple[str, Callable[[Any], Any]]]] = {
        "backend": ("engine", lambda v: v), **{key: (f"model.{key}", lambda v: v) for key in ("adapter", "dtype")},
        "episode.sampling": ("sampling", lambda v: v), "episode.seed": ("sampling.seed", lambda v: v),
        "episode.enable_thinking": ("thinking", lambda v: v), "tasks": ("data.path", lambda v: v),
        "format": ("data.format", lambda v: v), "jsonl": ("data.spec", lambda v: v),
        "split": ("data.split", lambda v: v), "limit": ("data.limit", lambda v: v), "out": ("output_dir", output_dir_of),
        "samples": ("sampling.n", lambda v: v)}
    RETIRED_KEYS: ClassVar[dict[str, str]] = {"episode.sampling.seed": "the rounds were seeded by episode.seed, "
                                                                       "now sampling.seed"}
    device: str | None = None
    """Device for the transformers backend; default cuda when visible, else cpu."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """Episodes per task (``n``: use a temperature above 0 so they differ) and the sampling of each turn: greedy and
    512 new tokens by default (each turn samples one completion an episode; </execute> and </solution> are always
    stop strings; round r of turns samples with seed + r)."""
    thinking: bool = False
    """Render with the chat template's thinking on (Qwen3-style: the model may open a <think> block); off, the
    default in every stage, puts the template's empty think block before each answer."""
    episode: EpisodeConfig = field(default_factory=EpisodeConfig)
    """How each episode runs."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Sandbox that runs the model's code and tests."""
    progress: bool = True
    """Show a progress bar."""
    threads: Threads | None = None
    """Torch CPU threads; none: as many as cores are idle, re-measured while it runs (molrl.cpu)."""

    def __post_init__(self) -> None:
        self.model = as_model_source(self.model)
        self.data = self.data.resolved()
        check_choice("collect", self)  # the engine can honour every setting (molrl.engines.choice)
        if self.data.path is None or self.data.format == "toy":
            raise ValueError(f"data.path={self.data.path}, data.format={self.data.format}: collect runs on a task "
                             "file; give data.path=FILE (--tasks) and its data.format (--format)")
        check_idle(self, "collect")  # last: a key set where it cannot act (molrl.config.idle)


seal(CollectConfig)  # an attribute it does not have is refused (molrl.config.strict)
