"""Configs of trace collection: how episodes run (``EpisodeConfig``) and a whole run (``CollectConfig``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar, Literal

from molrl.engines import check_engine_servers
from molrl.config_blocks import ModelSource, TaskSource, as_model_source
from molrl.collect.files import output_dir_of
from molrl.config_ranges import Count, Range, RunDir, SamplingTemperature, Seconds, Size, Threads
from molrl.sampling import EpisodeSampling
from molrl.sandbox import SandboxConfig

DEFAULT_FEEDBACK = ["execution", "tests", "verdict", "format", "budget"]


@dataclass
class CritiqueConfig:
    """A critic model behind an OpenAI-compatible endpoint (e.g. a vLLM server)."""

    base_url: str = ""
    """Server root, e.g. http://127.0.0.1:8000 (``/v1/chat/completions`` is appended)."""
    model: str = ""
    """Model name the server knows the critic by."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the API key (sent as a Bearer token when set)."""
    instructions: str = ""
    """System prompt for the critic; empty uses ``molrl.collect.critique.CRITIC_PROMPT``."""
    max_tokens: Count = 256
    """Most tokens in one critique."""
    temperature: SamplingTemperature = 0.0
    """Sampling temperature of the critic."""
    timeout_s: Seconds = 60.0
    """Seconds to wait for one critique before the request fails."""
    retries: Annotated[int, Range(0, 100)] = 2
    """Extra attempts after a failed request."""


@dataclass
class EpisodeRules:
    """How an agent episode's turns read and what feedback follows them: action format, task wording, feedback
    (rl's ``rollout.episode``: its turns and token limits are the stage's own keys)."""

    max_solutions: Count = 2
    """Most solution submissions per episode (a wrong one earns feedback and another try)."""
    system_prompt: str = ""
    """Instructions stating the action format ({max_turns}, {max_solutions} filled in); empty uses ``molrl.collect.actions.SYSTEM_PROMPT``."""
    code_task: str = "Write a Python function `{entry_point}` that solves the following problem.\n\n{prompt}"
    """The user message of a code task ({prompt} and {entry_point} are filled in)."""
    math_task: str = "{prompt}"
    """The user message of a math task ({prompt} is filled in)."""
    instructions_role: Literal["system", "user"] = "system"
    """Where the instructions go: a system message, or above the task in the user message (for templates without a system role)."""
    feedback: list[str] = field(default_factory=lambda: list(DEFAULT_FEEDBACK))
    """Feedback providers in message order: execution, tests, verdict, format, budget, critique, or package.module:factory."""
    feedback_max_tokens: Count = 512
    """Most tokens (the run's tokenizer; UTF-8 bytes without one) of program output or a traceback quoted in feedback."""
    max_failures_shown: Size = 3
    """Most failing tests described in test feedback."""
    tests_on_execute: bool = False
    """Also run the task's tests on executed code that defines the entry point, and report them."""
    critique: CritiqueConfig = field(default_factory=CritiqueConfig)
    """The critic used by the ``critique`` feedback provider."""

    # feedback was clipped in characters before it was clipped in tokens: 2000 characters read as 500 tokens
    RENAMED_KEYS: ClassVar[dict[str, tuple[str, Callable[[Any], Any]]]] = {
        "feedback_max_chars": ("feedback_max_tokens", lambda chars: -(-int(chars) // 4)),
    }


@dataclass
@dataclass
class EpisodeLimits(EpisodeRules):
    """An episode's rules with its own turn and token limits (eval's ``interactive``: its batch is the stage's)."""

    max_turns: Count = 5
    """Most model turns per episode."""
    max_total_tokens: Count = 8192
    """Most tokens of rendered prompt plus generated turn; a turn that would pass it is cut there and ends the episode."""


@dataclass
class EpisodeConfig(EpisodeLimits):
    """How an agent episode runs: turns, limits, action format, feedback and batch (its turns sample with the
    stage's ``sampling``)."""

    batch_size: Count = 16
    """Episodes advancing in lockstep (one batched generate call per round)."""


def episode_config(rules: EpisodeRules, **settings: Any) -> EpisodeConfig:
    """The loop's ``EpisodeConfig`` of a stage's ``rules`` (an ``EpisodeRules`` or ``EpisodeLimits``), with the
    stage's own ``settings`` (turns, token limit, batch)."""
    return EpisodeConfig(**{**{f.name: getattr(rules, f.name) for f in dataclasses.fields(rules)}, **settings})


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
    engine: Literal["auto", "vllm", "vllm_server", "transformers"] = "auto"
    """Generation engine: auto (vLLM when installed and the work pays for its start, else transformers), vllm,
    vllm_server (the servers of engine_servers) or transformers (``molrl.engines``); an adapter is served as vLLM LoRA
    (in-process vLLM: or merged into a temporary copy)."""
    engine_servers: list[str] = field(default_factory=list)
    """With engine=vllm_server: the vLLM servers to generate on (http://HOST:PORT each, as molrl serve prints), all
    started on model.path; model.adapter must be a folder they read."""

    RENAMED_KEYS: ClassVar[dict[str, tuple[str, Callable[[Any], Any]]]] = {
        "backend": ("engine", lambda v: v), **{key: (f"model.{key}", lambda v: v) for key in ("adapter", "dtype")},
        "episode.sampling": ("sampling", lambda v: v), "episode.seed": ("sampling.seed", lambda v: v),
        "episode.enable_thinking": ("thinking", lambda v: v), "tasks": ("data.path", lambda v: v),
        "format": ("data.format", lambda v: v), "jsonl": ("data.spec", lambda v: v),
        "split": ("data.split", lambda v: v), "limit": ("data.limit", lambda v: v), "out": ("output_dir", output_dir_of)}
    RETIRED_KEYS: ClassVar[dict[str, str]] = {"episode.sampling.seed": "the rounds were seeded by episode.seed, "
                                                                       "now sampling.seed"}
    device: str | None = None
    """Device for the transformers backend; default cuda when visible, else cpu."""
    samples: Count = 1
    """Episodes per task (use sampling.temperature > 0 so they differ)."""
    sampling: EpisodeSampling = field(default_factory=EpisodeSampling)
    """Sampling of each turn: greedy and 512 new tokens by default (``n`` must be 1: samples per task are separate
    episodes; </execute> and </solution> are always stop strings; round r of turns samples with seed + r)."""
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
        check_engine_servers(self.engine, self.engine_servers)
        if self.data.path is None or self.data.format == "toy":
            raise ValueError(f"data.path={self.data.path}, data.format={self.data.format}: collect runs on a task "
                             "file; give data.path=FILE (--tasks) and its data.format (--format)")
