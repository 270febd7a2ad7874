"""The agent-environment loop: many episodes advance in lockstep, one batched generate per round.

Each round: render every active conversation with the model's chat template, generate one turn
for all of them in one call, read each turn's action (``molrl.episode.actions``), run all code
through the sandbox in one batch and grade submitted solutions outside it, and answer each turn
with a ``tool`` message written by the feedback providers (``molrl.episode.feedback``). An episode
ends on a correct solution, when its solution submissions or turns run out, or at the token limit.
Finished episodes leave the batch at once and waiting ones take their places.

Where the policy sees tests (feedback that reports test outcomes, or a prompt that lists them), an episode runs
on the task's shown tests and its ``success`` is its last solution graded, once it ends, on the held-back ones
(``molrl.tasks.held_out``): a lookup table of the expected values the feedback showed solves nothing.

Simplifications, stated: every ``<execute>`` block runs in a fresh process (no state carries
between turns; the instructions say so); a turn's sampling seed is the round's, so one episode's
sample depends on which episodes shared its batch.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Sequence

from molrl.chat import render
from molrl.episode.actions import STOP_STRINGS, SYSTEM_PROMPT, Action, parse_action, think_well_formed
from molrl.episode.config import EpisodeConfig
from molrl.episode.environment import observe
from molrl.episode.feedback import FeedbackProvider, Observation, render_feedback
from molrl.episode.providers import build_providers
from molrl.content import encode_content
from molrl.engines.generation import Generator
from molrl.graders.code import CodeRewardConfig
from molrl.engines.sampling import SamplingConfig
from molrl.tasks import Task
from molrl.tasks.grade import grade
from molrl.tasks.held_out import episode_tasks, shows_tests, unsplit
from molrl.tasks.index import task_tags
from molrl.traces.schema import Trace, TraceError
from molrl.traces.spans import chat_prompt, encode_chat

MODEL, ENVIRONMENT, TASK, INSTRUCTIONS = "model", "environment", "task", "instructions"
"""Who wrote a message, as recorded per message in ``meta['authors']``."""


@dataclass
class Episode:
    """One task attempt: the conversation so far and what the environment recorded."""

    task: Task
    """The task being solved."""
    sample: int
    """Which sample of the task this is (0-based)."""
    messages: list[dict[str, str]]
    """The conversation (system?, user task, then assistant / tool turns)."""
    authors: list[str]
    """Per message: instructions, task, model or environment."""
    observations: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Per tool-message index: the observation it was derived from and each provider's piece."""
    turns: int = 0
    """Model turns taken."""
    solutions: int = 0
    """Solutions submitted."""
    verdict: bool | None = None
    """Verdict of the last submitted solution on the episode's tests (its shown ones where ``held_back``; None when
    none was submitted)."""
    graded: Task | None = None
    """The task whose tests decide ``success`` where they are not the episode's: its held-back tests."""
    held_back: bool = False
    """Whether ``success`` is graded on held-back tests (False: no test is shown, or the task holds none back)."""
    final_verdict: bool | None = None
    """Verdict of the last solution on ``graded``'s tests, graded when the episode ends (None: not graded)."""
    unsplit: bool = False
    """Whether the policy saw every test that decides the verdict (tests are shown and the task holds none back,
    ``molrl.tasks.held_out.unsplit``): a lookup of the values they showed passes, so ``success`` is never claimed and
    ``verdict`` is scored apart."""
    stop_reason: str | None = None
    """Why it ended: solved, out_of_solutions, max_turns, token_limit, empty_turn, malformed_think, template_error
    (the chat template cannot render the conversation so that its messages can be located) or sandbox_error."""
    dropped_turn: str | None = None
    """A last model turn left out of the messages because no trainer could read it (malformed think block)."""
    cut_chars: dict[int, int] = field(default_factory=dict)
    """Per assistant-message index: characters generated after the action and left out."""
    tokens: int = 0
    """Tokens of the rendered conversation when last measured."""

    @property
    def done(self) -> bool:
        """Whether the episode has ended."""
        return self.stop_reason is not None

    @property
    def success(self) -> bool:
        """Whether the last submitted solution was judged correct: on the held-back tests where ``held_back``; never
        where ``unsplit``."""
        if self.unsplit:
            return False
        return bool(self.final_verdict) if self.graded is not None else bool(self.verdict)

    def to_trace(self, settings: dict[str, Any]) -> Trace:
        """The trace of this episode; ``settings`` (model, sampling, ...) go into ``meta['generation']``."""
        meta = {
            "source": "collect",
            "kind": "domain",
            "task_id": self.task.id,
            "task_kind": self.task.kind,
            "benchmark": self.task.meta.get("source"),
            "task_split": self.task.split,
            "held_back": self.held_back,
            "unsplit": self.unsplit,
            "sample": self.sample,
            "success": self.success,
            "verdict": self.verdict,
            "stop_reason": self.stop_reason,
            "turns": self.turns,
            "feedback_turns": self.authors.count(ENVIRONMENT),
            "solutions_submitted": self.solutions,
            "tokens": self.tokens,
            "authors": list(self.authors),
            "observations": {str(i): obs for i, obs in self.observations.items()},
            "cut_chars": {str(i): n for i, n in self.cut_chars.items()},
            "dropped_turn": self.dropped_turn,
            "generation": settings,
            **task_tags(self.task),
        }
        return Trace(messages=[dict(m) for m in self.messages], meta=meta)


def open_episode(task: Task, sample: int, cfg: EpisodeConfig) -> Episode:
    """A fresh episode of ``task`` on the tests it may show, its success graded on those it holds back."""
    shown, graded, held_back = episode_tasks(task, shows_tests(cfg.max_turns, cfg))
    episode = start_episode(shown, sample, cfg)
    episode.graded, episode.held_back = (graded, True) if held_back else (None, False)
    episode.unsplit = unsplit(task, shows_tests(cfg.max_turns, cfg))
    return episode


def grade_final(pool: Any, episodes: Sequence[Episode]) -> None:
    """Grade each ended episode's last solution on its ``graded`` tests (all in one batch) into ``final_verdict``."""
    todo = [(ep, answer) for ep in episodes if ep.graded is not None and (answer := final_answer(ep))]
    if todo:
        grades = grade([ep.graded for ep, _ in todo], [answer for _, answer in todo], pool,  # type: ignore[misc]
                       CodeRewardConfig(mode="binary"))
        for (ep, _), g in zip(todo, grades):
            ep.final_verdict = bool(g.correct)


def final_answer(episode: Episode) -> str:
    """The raw text of the episode's last submitted solution (what a reward or a final verdict grades); empty
    when none."""
    for message in reversed(episode.messages):
        if message["role"] == "assistant":
            action = parse_action(message["content"], episode.task.kind)
            if action.kind == "solution":
                return action.raw
    return ""


def start_episode(task: Task, sample: int, cfg: EpisodeConfig) -> Episode:
    """A fresh episode: the instructions and the task as the opening messages."""
    instructions = (cfg.system_prompt or SYSTEM_PROMPT).replace("{max_turns}", str(cfg.max_turns))
    instructions = instructions.replace("{max_solutions}", str(cfg.max_solutions))
    template = cfg.code_prompt if task.kind == "code" else cfg.math_prompt
    problem = template.replace("{entry_point}", task.entry_point or "solution").replace("{prompt}", task.prompt)
    if cfg.instructions_role == "system":
        messages = [{"role": "system", "content": instructions}, {"role": "user", "content": problem}]
        authors = [INSTRUCTIONS, TASK]
    else:
        messages = [{"role": "user", "content": f"{instructions}\n\n{problem}"}]
        authors = [TASK]
    return Episode(task=task, sample=sample, messages=messages, authors=authors)


def run_episodes(
    generator: Generator,
    tokenizer: Any,
    tasks: Sequence[Task],
    pool: Any,
    cfg: EpisodeConfig,
    sampling: SamplingConfig | None = None,
    *,
    thinking: bool,
    samples: int = 1,
    skip: Collection[tuple[str, int]] = (),
    providers: Sequence[FeedbackProvider] | None = None,
    on_finish: Callable[[Episode], None] | None = None,
) -> list[Episode]:
    """Run ``samples`` episodes per task (minus the ``(task_id, sample)`` pairs in ``skip``) to the end, each turn
    sampled with ``sampling`` (none: greedy, 512 new tokens; its ``n`` is ignored), round r with its seed + r, and
    rendered with the chat template's thinking on or off (``thinking``).

    ``pool`` is a ``molrl.sandbox.SandboxPool`` (anything with its ``run_many`` / ``run_tests_many``).
    ``on_finish`` is called with each episode as it ends (the place to persist it); the finished
    episodes are also returned, in the order they ended. Nothing is written here.
    """
    sampling = sampling if sampling is not None else SamplingConfig()
    providers = list(providers) if providers is not None else build_providers(cfg.feedback, cfg, tokenizer)
    waiting = deque(open_episode(t, s, cfg) for t in tasks for s in range(samples) if (t.id, s) not in skip)
    active: list[Episode] = []
    finished: list[Episode] = []
    round_index = 0
    while waiting or active:
        while waiting and len(active) < cfg.batch_size:
            active.append(waiting.popleft())
        actions = model_turns(generator, tokenizer, active, cfg, dataclasses.replace(sampling, seed=sampling.seed + round_index),
                              thinking)
        environment_turns(pool, providers, cfg, [(ep, a) for ep, a in zip(active, actions) if a is not None])
        grade_final(pool, [ep for ep in active if ep.done])
        for ep in active:
            if ep.done:
                ep.tokens = _count_tokens(tokenizer, ep.messages, thinking)
                finished.append(ep)
                if on_finish is not None:
                    on_finish(ep)
        active = [ep for ep in active if not ep.done]
        round_index += 1
    return finished


def model_turns(
    generator: Generator, tokenizer: Any, episodes: Sequence[Episode], cfg: EpisodeConfig, sampling: SamplingConfig,
    thinking: bool,
) -> list[Action | None]:
    """Generate one turn for every episode in one call, sampled with ``sampling`` (one completion each, the action
    tags added to its stop strings) and rendered with thinking on or off; returns each turn's action (None: episode
    ended)."""
    prompts: list[Any] = [None] * len(episodes)
    for i, ep in enumerate(episodes):
        try:  # content is plain text: a forged <|im_end|> in a tool reply stays characters
            prompts[i] = chat_prompt(tokenizer, ep.messages, enable_thinking=thinking)
        except TraceError:
            ep.stop_reason = "template_error"
    prefill = think_prefill(tokenizer, thinking)
    budgets = [0 if p is None else cfg.max_total_tokens - len(p.ids) for p in prompts]  # tokens each may still add
    actions: list[Action | None] = [None] * len(episodes)
    live = [i for i, b in enumerate(budgets) if b > 0]
    for i, ep in enumerate(episodes):
        if budgets[i] <= 0 and ep.stop_reason is None:
            ep.stop_reason = "token_limit"
    if not live:
        return actions
    sampling = dataclasses.replace(
        sampling,
        n=1,
        max_new_tokens=min(sampling.max_new_tokens, max(budgets[i] for i in live)),
        stop=list(dict.fromkeys([*sampling.stop, *STOP_STRINGS])),
    )
    completions = generator.generate([prompts[i] for i in live], sampling)
    for i, (text,) in zip(live, completions):
        ids = encode_content(tokenizer, text)[0]
        over_budget = len(ids) > budgets[i]
        if over_budget:
            text = tokenizer.decode(ids[: budgets[i]], skip_special_tokens=False)
        actions[i] = take_turn(episodes[i], prefill, text, over_budget)
    return actions


def think_prefill(tokenizer: Any, enable_thinking: bool) -> str:
    """Think-block text the template puts after the assistant header (Qwen3 with thinking off: an empty block).

    The model's turn starts after it, so it is recorded as part of the turn: the trace then holds
    exactly what followed the assistant header, and trainers see the think block the model saw.
    """
    probe = [{"role": "user", "content": "?"}]
    bare = render(tokenizer, probe, enable_thinking=enable_thinking)
    full = render(tokenizer, probe, add_generation_prompt=True, enable_thinking=enable_thinking)
    suffix = full[len(bare) :] if full.startswith(bare) else ""
    return suffix[suffix.index("<think>") :] if "<think>" in suffix else ""


def take_turn(ep: Episode, prefill: str, completion: str, over_budget: bool = False) -> Action | None:
    """Record the model's turn (``completion`` after the template's ``prefill``), cut after its action; returns
    the action, or None if the episode ends (``over_budget``: the turn ran out of tokens, so without an action
    it ends the episode)."""
    text = prefill + completion
    action = parse_action(text, ep.task.kind)
    kept = text[: action.end] if action.kind != "none" else text
    if not kept[len(prefill) :].strip():
        ep.stop_reason = "empty_turn"
        return None
    if not think_well_formed(kept):
        ep.stop_reason, ep.dropped_turn = "malformed_think", kept
        return None
    ep.turns += 1
    if len(kept) < len(text):
        ep.cut_chars[len(ep.messages)] = len(text) - len(kept)
    ep.messages.append({"role": "assistant", "content": kept})
    ep.authors.append(MODEL)
    if action.kind == "none" and over_budget:
        ep.stop_reason = "token_limit"
        return None
    return action


def environment_turns(
    pool: Any, providers: Sequence[FeedbackProvider], cfg: EpisodeConfig, stepped: Sequence[tuple[Episode, Action]]
) -> None:
    """Carry out every episode's action (sandbox batched), then append each one's feedback message."""
    observations = observe(pool, [(ep.task, action) for ep, action in stepped], tests_on_execute=cfg.tests_on_execute)
    for (ep, action), obs in zip(stepped, observations):
        _advance(ep, action, obs, cfg)

    def feedback(item: tuple[Episode, Observation]) -> tuple[str, dict[str, str]]:
        ep, obs = item
        return render_feedback(providers, ep.task, obs, ep.messages)

    items = [(ep, obs) for (ep, _), obs in zip(stepped, observations)]
    remote = any(getattr(p, "remote", False) for p in providers)
    if remote and len(items) > 1:  # a critic behind an HTTP endpoint: ask for all critiques at once
        with ThreadPoolExecutor(max_workers=min(16, len(items))) as pool:
            texts = list(pool.map(feedback, items))
    else:
        texts = [feedback(item) for item in items]
    for (ep, obs), (text, pieces) in zip(items, texts):
        ep.observations[len(ep.messages)] = {"observation": obs.to_dict(), "feedback": pieces}
        ep.messages.append({"role": "tool", "content": text})
        ep.authors.append(ENVIRONMENT)


def _advance(ep: Episode, action: Action, obs: Observation, cfg: EpisodeConfig) -> None:
    """Update counters and decide whether the episode ends; fills the budget fields of ``obs``."""
    if action.kind == "solution":
        ep.solutions += 1
        ep.verdict = obs.verdict
    if (obs.exec or {}).get("status") == "sandbox_error" or (obs.grade or {}).get("stage") == "sandbox_error":
        ep.stop_reason = "sandbox_error"
    elif ep.verdict and action.kind == "solution":
        ep.stop_reason = "solved"
    elif ep.solutions >= cfg.max_solutions:
        ep.stop_reason = "out_of_solutions"
    elif ep.turns >= cfg.max_turns:
        ep.stop_reason = "max_turns"
    obs.turns_left = cfg.max_turns - ep.turns
    obs.solutions_left = cfg.max_solutions - ep.solutions
    obs.final = ep.done


def _count_tokens(tokenizer: Any, messages: list[dict[str, str]], enable_thinking: bool) -> int:
    """Tokens of the conversation as a trainer will read it (0 when the template cannot locate its messages)."""
    try:
        return len(encode_chat(tokenizer, messages, add_generation_prompt=False, enable_thinking=enable_thinking))
    except TraceError:
        return 0
