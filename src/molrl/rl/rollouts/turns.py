"""Multi-turn rollouts: each completion is an agent episode (``molrl.episode``), token in, token out.

A row starts from the episode loop's opening messages (``molrl.episode.loop.start_episode``: its
instructions and task wording) rendered with the generation prompt. Each round, every unfinished row
generates one turn from its token ids so far (transformers ``generate``, or the policy engine of
``molrl.rl.engine``, with the trainer's sampling
settings; a turn ends at EOS, at ``</execute>`` / ``</solution>``, after ``episode.turn_tokens``
tokens, or where the row reaches ``sampling.max_new_tokens``; a turn cut short without an action gets the
format feedback, as in collection, unless the row is out of tokens). The
loop's ``take_turn`` reads and records the turn's text; its ``environment_turns`` runs the round's code
in the sandbox in one batch and appends each feedback message, written by the same providers as
``molrl collect``. Then the tokens the template adds after the turn (its end-of-turn token, the tool
message, the next turn's header) are tokenised on their own by ``molrl.traces.spans.tokenize_tail``
and appended, never repeating the whitespace the turn ended with nor the end-of-turn token it sampled. The trained row is exactly the sampled ids plus the rendered feedback ids: nothing sampled
is re-tokenised, and a template that rewrites earlier turns (Qwen3) cannot change them.

Roles: sampled tokens are decision tokens (``completion_mask``: the policy gradient's); tail tokens the
labeller calls feedback make ``feedback_mask`` (the CE term's, ``molrl.rl.terms``); attention sees every
token (``attention_mask``). The end-of-turn token the template adds after a turn that stopped at a stop
string was not sampled, so it carries no policy gradient.

Reward: the final answer, scored as single-turn RL scores it: the raw text of the episode's last
submitted solution, graded by the stage's scorer (staged or binary for code); an episode that submitted
none scores as an empty answer. An episode the sandbox stopped (``sandbox_error``) has no reward: its answer is not
the one it would have given, so it is left out of the loss like any row whose grading failed (``molrl.rl.score``). When the episode can show test outcomes before its last answer
(``max_solutions`` above 1, or ``tests_on_execute``), or its prompt lists tests, it runs on the task's shown
tests (the row's ``episode_json``) and the reward grades the held-back rest (its ``task_json``; both made by
``molrl.rl.data.build_prompt_rows`` through ``molrl.tasks.held_out``), so no reward comes from a test whose
expected value the policy saw.

Simplifications, stated: a step's rows advance in lockstep (one batched generate per round); a row whose
next feedback would not leave room for another token before ``sampling.max_new_tokens`` ends there
(``token_limit``) without it; the last feedback (the verdict) is appended when it fits, so the CE term
learns it, though no decision follows it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import StoppingCriteria

from molrl.episode.actions import STOP_STRINGS
from molrl.episode.config import episode_config
from molrl.episode.loop import Episode, environment_turns, final_answer, start_episode, take_turn, think_prefill
from molrl.episode.providers import build_providers
from molrl.errors import MolrlError
from molrl.rl.batch import RolloutBatch, TokenRoles
from molrl.rl.config import RlConfig
from molrl.rl.rollouts.sync import Synchronous
from molrl.task_types import Task
from molrl.traces.spans import encode_chat, tokenize_tail

log = logging.getLogger(__name__)


class TurnStop(StoppingCriteria):
    """Ends each row's turn at an EOS token, once a stop string is complete, or at the row's token budget."""

    def __init__(self, tokenizer: Any, stops: list[str], eos_ids: list[int], start: int, budgets: list[int]):
        self.tokenizer, self.stops, self.eos, self.start, self.budgets = tokenizer, stops, set(eos_ids), start, budgets
        self.lengths = [0] * len(budgets)
        """Per row: new tokens of its turn (EOS or the stop string's last token included)."""
        self.at_limit = [False] * len(budgets)
        """Per row: the turn stopped at its budget, not by itself."""
        self.done = [False] * len(budgets)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        new = input_ids.size(1) - self.start
        for row in range(input_ids.size(0)):
            if self.done[row] or new <= 0:
                continue
            stopped = turn_ended(self.tokenizer, input_ids[row, self.start:].tolist(), self.stops, self.eos)
            if stopped or new >= self.budgets[row]:
                self.done[row], self.lengths[row], self.at_limit[row] = True, new, not stopped
        return torch.tensor(self.done, device=input_ids.device)


def turn_ended(tokenizer: Any, turn: list[int], stops: list[str], eos: set[int]) -> bool:
    """Whether a turn's last token ended it: an end-of-sequence token, or the token that completed a stop string
    (the decoded tail of the turn, as many tokens as the longest stop string has characters, contains one). The
    transformers stopping criterion and the engine's outputs are judged by this one rule."""
    if not turn:
        return False
    window = max((len(s) for s in stops), default=1)  # a stop string spans at most this many tokens
    text = tokenizer.decode(turn[-window:])
    return turn[-1] in eos or any(s in text for s in stops)


@dataclass
class Row:
    """One episode's completion as token ids, with the role of each."""

    episode: Episode
    """The episode loop's record of the episode (messages, turns, verdict, stop reason)."""
    prompt_ids: list[int]
    """The opening messages rendered with the generation prompt, tokenised."""
    ids: list[int] = field(default_factory=list)
    """Completion ids so far: sampled turns and the rendered tails after them."""
    sampled: list[int] = field(default_factory=list)
    """Per completion id: 1 if the policy sampled it."""
    feedback: list[int] = field(default_factory=list)
    """Per completion id: 1 if it is feedback text."""
    engine_logps: list[float | None] = field(default_factory=list)
    """Per completion id: the engine's log-prob of a token it sampled (None: not sampled, or transformers)."""
    unfitted: int = 0
    """Tokens of the tail after the last turn (feedback, next header) left out for want of room before
    sampling.max_new_tokens; the episode ended there (``token_limit``)."""

    def extend(self, ids: list[int], sampled: int, feedback: list[int] | None = None,
               engine_logps: list[float] | None = None) -> None:
        """Append ``ids``, all sampled or none, with their feedback flags (none: 0) and the engine's log-probs."""
        self.ids += ids
        self.sampled += [sampled] * len(ids)
        self.feedback += feedback if feedback is not None else [0] * len(ids)
        self.engine_logps += engine_logps if engine_logps is not None else [None] * len(ids)


class Turns(Synchronous):
    """Each completion an episode of up to ``episode.max_turns`` model turns with the sandbox's feedback between."""

    def __init__(self, trainer: Any, cfg: RlConfig, training: bool = True):
        super().__init__(trainer, cfg, training)
        self.episode = episode_config(cfg.episode)
        self.thinking = cfg.thinking
        self.providers = build_providers(self.episode.feedback, self.episode, trainer.processing_class)
        self.prefill = think_prefill(trainer.processing_class, cfg.thinking)
        self.stops = list(dict.fromkeys([*cfg.sampling.stop, *STOP_STRINGS]))
        self.named_one_turn = False  # the line for steps with no room for a second turn is logged once a run
        if trainer.scorer.pool is None:
            raise MolrlError("episode.max_turns > 1 runs the policy's code in the sandbox, but the trainer has no "
                             "sandbox pool; build it with molrl.rl.run.build_trainer")

    def rollout(self, inputs: list[dict[str, Any]]) -> RolloutBatch:
        """Run one episode per row of ``inputs`` (``episode_json``: the task the episode runs on, ``task_json``: the
        one its reward grades; rows of a group share a task) and batch them."""
        start, group = time.perf_counter(), self.cfg.sampling.n
        shown = [Task.from_json(x.get("episode_json") or x["task_json"]) for x in inputs]
        rows = [self.start_row(task, i % group) for i, task in enumerate(shown)]  # the feedback shows these tests
        while live := [r for r in rows if not r.episode.done]:
            self.round(live)
        generation_s = time.perf_counter() - start
        tokenizer = self.trainer.processing_class
        prompts = [tokenizer.decode(r.prompt_ids) for r in rows]
        answers = [final_answer(r.episode) for r in rows]
        roles = TokenRoles([r.sampled for r in rows], [r.feedback for r in rows],
                           [r.episode.stop_reason != "token_limit" for r in rows])
        engine_logps = [r.engine_logps for r in rows] if self.trainer.engine is not None else None
        batch = self.to_batch([{"prompt": p, "task_json": x["task_json"]} for p, x in zip(prompts, inputs)],  # reward's
                              [r.prompt_ids for r in rows], [r.ids for r in rows], answers, engine_logps, roles=roles)
        batch.records = [{"episode": tokenizer.decode(r.ids)} for r in rows]  # every turn and feedback, not the answer only
        batch.stop_reasons = [r.episode.stop_reason for r in rows]  # one the sandbox stopped is no verdict
        self.log(rows, generation_s)
        self.name_one_turn(rows)
        return batch

    def name_one_turn(self, rows: list[Row]) -> None:
        """Log once when every episode of a step ran out of tokens after its first turn: the step trained
        single-turn episodes, whatever episode.max_turns says, and the line names the keys that make room."""
        if self.named_one_turn or not all(r.episode.turns == 1 and r.episode.stop_reason == "token_limit"
                                          for r in rows):
            return
        self.named_one_turn = True
        ep, limit = self.cfg.episode, self.cfg.sampling.max_new_tokens
        tail = max(r.unfitted for r in rows)
        after = f", and the feedback and next turn's header after it need up to {tail} tokens" if tail else ""
        log.warning("episode.max_turns=%d, but every episode of this step ran out of its sampling.max_new_tokens=%d "
                    "after one turn (a turn takes up to episode.turn_tokens=%d tokens%s): the run trains one-turn "
                    "episodes; raise sampling.max_new_tokens or lower episode.turn_tokens", ep.max_turns, limit,
                    ep.turn_tokens, after)

    def start_row(self, task: Task, sample: int) -> Row:
        """A fresh episode of ``task`` and its prompt ids."""
        episode = start_episode(task, sample, self.episode)
        return Row(episode, encode_chat(self.trainer.processing_class, episode.messages, add_generation_prompt=True,
                                        enable_thinking=self.thinking))

    def round(self, live: list[Row]) -> None:
        """One turn of every live row: generate, record, run the actions, append the rendered tails."""
        trainer, limit = self.trainer, self.cfg.sampling.max_new_tokens
        budgets = [min(limit - len(r.ids), self.cfg.episode.turn_tokens) for r in live]
        turns, at_budget, logps = self.generate([r.prompt_ids + r.ids for r in live], budgets)
        stepped = []
        for row, ids, cut, turn_logps in zip(live, turns, at_budget, logps):
            row.extend(ids, sampled=1, engine_logps=turn_logps)
            text = trainer.processing_class.decode(ids, skip_special_tokens=True)
            action = take_turn(row.episode, self.prefill, text, over_budget=cut and len(row.ids) >= limit)
            if action is not None:
                stepped.append((row, action))
        environment_turns(trainer.scorer.pool, self.providers, self.episode, [(r.episode, a) for r, a in stepped])
        for row, _ in stepped:
            self.append_tail(row)

    def append_tail(self, row: Row) -> None:
        """Append what the template renders after the row's last turn: its end, the feedback, the next header."""
        episode, limit = row.episode, self.cfg.sampling.max_new_tokens
        ended = row.ids[-1] if row.ids and row.ids[-1] in self.trainer.eos_token_ids else None
        tail = tokenize_tail(self.trainer.processing_class, episode.messages, len(episode.messages) - 2,
                             self.thinking, add_generation_prompt=not episode.done, sampled_end=ended)
        ids, roles = tail.input_ids, tail.roles
        if len(row.ids) + len(ids) + (0 if episode.done else 1) > limit:
            if not episode.done:
                episode.stop_reason = "token_limit"
                row.unfitted = len(ids)
            return
        row.extend(ids, sampled=0, feedback=[int(role == "feedback") for role in roles])

    def generate(self, sequences: list[list[int]], budgets: list[int]) -> tuple[list[list[int]], list[bool], list]:
        """One turn of each sequence (token ids in, token ids out), whether it stopped at its budget, and the
        engine's log-probs of its tokens (None on transformers)."""
        trainer = self.trainer
        if trainer.engine is not None:
            engine = trainer.engine
            out = engine.generate(trainer, sequences, [engine.params(trainer, b, self.stops) for b in budgets])
            ends = set(trainer.eos_token_ids)
            cut = [not turn_ended(trainer.processing_class, s.ids, self.stops, ends) for s in out]
            return [s.ids for s in out], cut, [s.logps for s in out]
        new, stop = self.continue_rows(sequences, max(budgets), lambda width: TurnStop(
            trainer.processing_class, self.stops, trainer.eos_token_ids, width, budgets))
        lengths = [n if done else len(new[i]) for i, (n, done) in enumerate(zip(stop.lengths, stop.done))]
        return [new[i][:n] for i, n in enumerate(lengths)], stop.at_limit, [None] * len(sequences)

    def log(self, rows: list[Row], generation_s: float) -> None:
        """The step's multi-turn metrics."""
        metrics, n = self.trainer.metrics(), len(rows)
        metrics["time/generation_s"].append(generation_s)
        metrics["turns/mean"].append(sum(r.episode.turns for r in rows) / n)
        metrics["turns/feedback_tokens"].append(sum(sum(r.feedback) for r in rows) / n)
        metrics["turns/sampled_tokens"].append(sum(sum(r.sampled) for r in rows) / n)
        metrics["completions/mean_length"].append(sum(len(r.ids) for r in rows) / n)
        for reason in ("solved", "out_of_solutions", "max_turns", "token_limit", "empty_turn", "malformed_think",
                       "sandbox_error"):
            metrics[f"turns/stop_{reason}"].append(sum(r.episode.stop_reason == reason for r in rows) / n)
        self.trainer.state.num_input_tokens_seen += sum(sum(r.sampled) for r in rows)
