"""The episode's config: how an agent episode runs (``EpisodeConfig``), the rules a stage's ``episode`` block holds
(``EpisodeRules``, ``EpisodeLimits``, ``EpisodeTurns``) and the critic behind the ``critique`` feedback
(``CritiqueConfig``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, ClassVar, Literal

from molrl.config.ranges import Count, Range, SamplingTemperature, Seconds, Size
from molrl.tasks.prompts import CODE_TASK

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
    """System prompt for the critic; empty uses ``molrl.episode.critique.CRITIC_PROMPT``."""
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
    """How an agent episode's turns read and what feedback follows them: action format, task wording, feedback (the
    keys every stage's ``episode`` block holds)."""

    max_solutions: Count = 2
    """Most solution submissions per episode (a wrong one earns feedback and another try)."""
    system_prompt: str = ""
    """Instructions stating the action format ({max_turns}, {max_solutions} filled in); empty uses ``molrl.episode.actions.SYSTEM_PROMPT``."""
    code_prompt: str = CODE_TASK + "\n\n{prompt}"
    """The user message of a code task ({prompt} and {entry_point} are filled in): the single-turn ``code_prompt``'s
    wording, the answer's format left to the instructions."""
    math_prompt: str = "{prompt}"
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

    # feedback was clipped in characters before it was clipped in tokens: 2000 characters read as 500 tokens; a
    # prompt template is code_prompt / math_prompt in every block
    RENAMED_KEYS: ClassVar[dict[str, tuple[str, Callable[[Any], Any]]]] = {
        "feedback_max_chars": ("feedback_max_tokens", lambda chars: -(-int(chars) // 4)),
        "code_task": ("code_prompt", lambda v: v), "math_task": ("math_prompt", lambda v: v),
    }


@dataclass
class EpisodeTurns(EpisodeRules):
    """An episode's rules with its most turns and each turn's tokens (rl's ``episode``: its whole budget is the
    stage's ``sampling.max_new_tokens``, its batch the step's)."""

    max_turns: Count = 1
    """Most model turns per completion: above 1 each completion is an agent episode that runs code in the sandbox
    and reads the feedback before it answers."""
    turn_tokens: Count = 512
    """max_turns > 1: most tokens one turn generates."""


@dataclass
class EpisodeLimits(EpisodeRules):
    """An episode's rules with its own turn and token limits (eval's ``episode``: its batch is the stage's)."""

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
    """The loop's ``EpisodeConfig`` of a stage's ``rules`` (an ``EpisodeRules``, ``EpisodeLimits`` or
    ``EpisodeTurns``: the keys the loop reads), with the stage's own ``settings`` (turns, token limit, batch)."""
    loop = {f.name for f in dataclasses.fields(EpisodeConfig)}
    return EpisodeConfig(**{**{f.name: getattr(rules, f.name) for f in dataclasses.fields(rules) if f.name in loop},
                            **settings})
