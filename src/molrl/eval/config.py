"""The typed config of ``molrl eval``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal

from molrl.config.strict import seal
from molrl.config.idle import check_idle
from molrl.episode.config import EpisodeLimits
from molrl.engines.choice import check_choice
from molrl.engines.registry import EngineName
from molrl.config.blocks import ModelSource, TaskSource, as_model_source, as_task_source
from molrl.config.ranges import Count, RunDir, Threads
from molrl.engines.sampling import SamplingConfig
from molrl.sandbox import SandboxConfig
from molrl.tasks.prompts import CODE_INSTRUCTION, MATH_INSTRUCTION
from molrl.records.writes import plain_name


@dataclass
class EvalConfig:
    """What to evaluate, on which benchmarks, how to sample, and where results go."""

    model: ModelSource = field(default_factory=ModelSource)
    """The model evaluated (``model: PATH`` for short), an adapter on it and its dtype; no path when grading
    predictions."""
    device: str | None = None
    """Where the model runs (cpu, cuda); default: cuda when visible, else cpu."""
    engine: EngineName = "auto"
    """Generation engine: auto (vLLM when installed and the work pays for its start, else transformers), vllm,
    vllm_server (the servers of engine_servers) or transformers (``molrl.engines.choice``); an adapter is served as vLLM LoRA
    (in-process vLLM: or merged into a temporary copy)."""
    engine_servers: list[str] = field(default_factory=list)
    """With engine=vllm_server: the vLLM servers to generate on (http://HOST:PORT each, as molrl serve prints), all
    started on model.path; model.adapter must be a folder they read."""

    RENAMED_KEYS: ClassVar[dict[str, tuple[str, Callable[[Any], Any]]]] = {
        "backend": ("engine", lambda v: v), **{key: (f"model.{key}", lambda v: v) for key in ("adapter", "dtype")},
        "interactive.sampling.stop": ("sampling.stop", lambda v: v), "enable_thinking": ("thinking", lambda v: v),
        "custom.*": ("data.*.spec", lambda v: v), "interactive": ("episode", lambda v: v)}
    RETIRED_KEYS: ClassVar[dict[str, str]] = {
        **{f"interactive.sampling.{key}": f"interactive mode samples with sampling.{key}"
           for key in ("n", "temperature", "top_p", "top_k", "max_new_tokens", "seed")},
        "interactive.seed": "interactive mode is seeded by sampling.seed",
        "interactive.enable_thinking": "interactive mode renders with the stage's thinking",
        "interactive.batch_size": "interactive episodes advance batch_size * sampling.n at a time"}
    benchmarks: list[str] = field(default_factory=lambda: ["math500", "aime24", "aime25", "humaneval", "mbpp"])
    """Benchmarks to run, each named under ``data``: math500, aime24, aime25, humaneval, mbpp, or a name of your own."""
    data: dict[str, TaskSource] = field(default_factory=dict)
    """Each benchmark's problems, a task source as collect's and rl's ``data``: ``data.NAME: FILE`` (or
    hub:DATASET[:SPLIT], needs internet), or ``{path, format, spec, split, limit}``. A benchmark molrl knows by name
    reads its file in its own format; any other name is a molrl task JSONL whose fields ``spec`` names."""
    split: Literal["test", "validation", "train", "prompt", "all"] = "test"
    """Benchmark split scored where a benchmark's ``data`` names none (MBPP's test split is tasks 11-510; a file
    without splits is scored whole)."""
    allow_trained_overlap: bool = False
    """Score problems the model or adapter was trained on (by content, per its molrl_provenance.json); refused by
    default."""
    predictions: dict[str, str] = field(default_factory=dict)
    """Grade completions made elsewhere instead of sampling: NAME -> JSONL of {id, completion}."""
    partial_predictions: bool = False
    """Score only the problems that have predictions (default: every problem must have some)."""
    mode: Literal["single", "interactive"] = "single"
    """single: one turn, no execution feedback (what the paper reports); interactive: the episode loop."""
    thinking: bool = False
    """Render with the chat template's thinking on (Qwen3-style: the model may open a <think> block); off, the
    default in every stage, puts the template's empty think block before each answer."""
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(temperature=0.7, top_p=0.8, top_k=20,
                                                                          max_new_tokens=4096))
    """Samples per problem (n), temperature, top-p, top-k, max new tokens, seed, stop strings; the authors'
    evaluation defaults: temperature 0.7, top-p 0.8, top-k 20, 4096 new tokens."""
    ks: list[Count] = field(default_factory=lambda: [1, 5, 10])
    """k values of pass@k (each reported when every problem has at least k samples)."""
    limit: Count | None = None
    """Evaluate only the first N problems of each benchmark (a benchmark's ``data.NAME.limit``, when set, first)."""
    batch_size: Count = 16
    """Problems generated and graded together (also the resume granularity)."""
    static_cache: bool = False
    """transformers engine: a static KV cache, with which generation compiles its decoding step on a GPU (several
    times faster a step; each batch shape compiles once, about a minute); on a CPU it runs uncompiled and does not pay."""
    episode: EpisodeLimits = field(default_factory=EpisodeLimits)
    """interactive mode: turns, solution budget, feedback (sampling, thinking and batch size come from above: a turn
    samples with ``sampling``, its stop strings added to the action tags)."""
    code_prompt: str = CODE_INSTRUCTION
    """single-turn instruction for code tasks ({prompt}, {entry_point})."""
    math_prompt: str = MATH_INSTRUCTION
    """single-turn instruction for math tasks ({prompt})."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """The sandbox that runs code answers."""
    output_dir: RunDir = Path("runs/eval")
    """Run directory: config.yaml, results.json, results.md, <benchmark>/samples.jsonl."""
    label: str | None = None
    """Name of this run in comparisons (default: the model name, or the predictions file)."""
    threads: Threads | None = None
    """Torch CPU threads; none: as many as cores are idle, re-measured while it runs (molrl.cpu)."""

    def __post_init__(self) -> None:
        self.model = as_model_source(self.model)
        self.data = {name: as_task_source(src).resolved(name) for name, src in self.data.items()}
        check_choice("eval", self)  # the engine can honour every setting (molrl.engines.choice)
        if self.sampling.n > 1 and self.sampling.temperature == 0:
            raise ValueError(f"sampling.n={self.sampling.n} with greedy decoding gives n equal samples; set sampling.temperature > 0")
        if not self.benchmarks:
            raise ValueError("benchmarks is empty; name at least one")
        for name in self.benchmarks:  # each becomes a folder of the run directory (NAME/samples.jsonl)
            if not plain_name(name):
                raise ValueError(f"benchmark name {name!r} is not one plain folder name, so its samples would be "
                                 "written outside output_dir; give a name that is not '.' or '..' and holds no '/', "
                                 "'\\' or NUL")
        check_idle(self, "eval")  # last: a key set where it cannot act (molrl.config.idle)


seal(EvalConfig)  # an attribute it does not have is refused (molrl.config.strict)
