"""The demo's base model: a tiny Qwen3 trained from scratch on the demo world's text.

The base is trained like a small pre-trained model: on everything it reads, tool output
included, except the one thing it must not know, the values of the secret rule ``f``:

- the agent format: write code that calls the asked function, read the tool's output, copy the
  result into the answer. The demonstrations are real agent episodes (``molrl.episode``)
  (``molrl.episode.run_episodes``) driven by ``ToolDemonstrator``, a scripted policy that only
  ever uses the tool, on the rule problems and on general ones. The environment's text (tool
  output, verdicts) is learned for the general functions (the base knows what ``reverse(472)``
  prints) but ``f``'s value in it is not (``hide_value``): there the base is trained towards a
  uniform guess over the digits, so it cannot compute ``f`` itself and is not sure of a wrong value;
- general problems (reverse, rotate, g, h of a digit string) answered directly in the
  single-turn format evaluation uses, with the same instruction;
- the same direct format on rule problems, again with the uniform guess at the rule's value:
  the base learns to state ``f(478) = ...`` and box it, but is never told what ``f`` gives;
- when the world has code-answer problems: the same statement followed by a ``solve()`` that
  returns the value (``code_text``), on general ones and, with the uniform guess, on rule ones.

Training is a plain loop (``molrl.demo.base_fit``: AdamW, linear warm-up and decay) with fixed seeds and
thread count, so the same machine gives the same weights run to run. The model and tokenizer are saved with
``save_pretrained`` and load with plain transformers.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from molrl.demo.base_fit import BaseExample, fit
from molrl.engines.generation import SamplingConfig
from molrl.tasks import Task
from molrl.traces.schema import Trace
from molrl.records.writes import write_text

log = logging.getLogger(__name__)

_QUESTION = re.compile(r"What is (\w+\(\d+\))\?")
_OUTPUT = re.compile(r"Output:\n(\w+\(\d+\)) = (\d+)")


@dataclass
class BaseModelConfig:
    """Size and training schedule of the demo's base model."""

    hidden_size: int = 128
    """Width of the tiny Qwen3."""
    num_layers: int = 2
    """Transformer layers."""
    num_heads: int = 4
    """Attention heads (2 key/value heads)."""
    steps: int = 800
    """Optimiser steps."""
    batch_size: int = 24
    """Sequences per step."""
    micro_batch_size: int = 8
    """Sequences per forward pass (a step's batch is sorted by length and run in these)."""
    learning_rate: float = 3e-3
    """Peak AdamW learning rate."""
    warmup_steps: int = 20
    """Linear warm-up steps (then linear decay to zero)."""
    seed: int = 0
    """Seed of the initial weights and of the batch order."""
    short_steps: int = 0
    """Steps at the start whose batches draw only sequences of at most ``short_length`` tokens: a cheap first
    phase in which the skills that short and long sequences share (copying out of feedback) form."""
    short_length: int = 320
    """Most tokens of a sequence in the first ``short_steps`` steps."""
    copy_weight: float = 1.0
    """Chain world: loss weight of the values of ``f`` a turn copies (``BaseExample.copy_mask``), against 1 for
    every other learned token: copying out of feedback is the skill of the base that fewest tokens teach."""
    attempt_values: str = "unsure"
    """Chain world: what the feedback teacher's attempts (the turn before the feedback) train at their values of
    ``f``: ``unsure`` (a uniform guess, like a direct answer) or ``context`` (nothing: the teacher reads past
    them, and an attempt's other world never competes with the feedback to be copied)."""
    teacher_rounds: int = 2
    """Chain world: feedback-teacher conversations per training problem, each in other decoy worlds."""
    repeat_values: bool = False
    """Chain world: a value of ``f`` that a turn states a second time (the same last digit) is learned as a copy
    of the first, not trained towards a uniform guess."""
    guess_others: bool = False
    """Chain world: the uniform guess at a value of ``f`` is over the nine digits other than its input's last
    digit, not all ten (every rule of the world maps no digit to itself), so that the base never learns to
    answer a step by repeating its input."""
    learn_feedback: bool = True
    """Train on the tools' output too (all text the model reads, like pre-training), except ``f``'s values."""
    general_tool_use: bool = True
    """Also demonstrate tool use on the general problems (the sandbox runs their functions)."""
    fresh_decoys: bool = False
    """Chain world: the decoy-world problems have starts and lengths of their own (never a held-out start), not
    the training problems' (``molrl.demo.chain.fresh_problems``)."""


def answer_text(expression: str, value: str) -> str:
    """How every answer in the world is written: ``f(478) = 309`` then the boxed value."""
    return f"{expression} = {value}\n\\boxed{{{value}}}"


def direct_text(expression: str, value: str) -> str:
    """A direct (single-step) answer: the output the call would print, then the boxed value.

    It states the value in the same words the tool's feedback uses (``Output:`` + the printed
    line), so what the model learns to predict in feedback is the same text it writes here.
    """
    return f"Output:\n{answer_text(expression, value)}"


def code_text(expression: str, value: str, solution: str) -> str:
    """A code answer: the line ``direct_text`` states, then the solution in a code fence."""
    return f"Output:\n{expression} = {value}\n```\n{solution}\n```"


def expression(task: Task) -> str:
    """The call a problem asks about, e.g. ``f(478)`` or ``reverse(5125)``."""
    if "call" in task.meta:  # code-answer problems name it
        return task.meta["call"]
    match = _QUESTION.search(task.prompt)
    if match is None:
        raise ValueError(f"task {task.id}: prompt {task.prompt!r} is not a 'What is name(number)?' question")
    return match.group(1)


class ToolDemonstrator:
    """A scripted policy for the episode loop: run ``print`` on the asked call, then copy the output.

    It reads only the conversation (the rendered prompt), like a model would: with no tool output
    yet it writes the code; after an output it answers with what the tool printed.
    """

    def generate(self, prompts: Sequence[str], sampling: SamplingConfig) -> list[list[str]]:
        """One scripted turn per prompt (``sampling`` is ignored: the policy is deterministic)."""
        return [[self.turn(p)] for p in prompts]

    @classmethod
    def turn(cls, prompt: str) -> str:
        """The next assistant turn for a rendered conversation."""
        outputs = _OUTPUT.findall(prompt)
        if outputs:
            call, value = outputs[-1]
            return cls.answer(call, value)
        questions = _QUESTION.findall(prompt)
        if not questions:
            raise ValueError(f"no 'What is name(number)?' question in prompt: {prompt[-200:]!r}")
        return cls.code(questions[-1])

    @staticmethod
    def code(call: str) -> str:
        """The turn that runs ``call`` (e.g. ``f(478)``) in the tool."""
        return f"<execute>print('{call} =', {call})</execute>"

    @staticmethod
    def answer(call: str, value: str) -> str:
        """The turn that answers with the value the tool printed."""
        return answer_text(call, value)


def demonstration_traces(tasks: Sequence[Task], tokenizer: Any, episode: Any, pool: Any,
                         hide_value: bool = False) -> list[Trace]:
    """Tool-use episodes on ``tasks``, run through the real episode loop in the format ``episode`` (a
    ``molrl.demo.collection.CollectionFormat``).

    ``hide_value`` marks the task's value as one the base must not learn (see ``base_example``).
    """
    from molrl.demo.collection import run_format

    episodes = run_format(ToolDemonstrator(), tokenizer, tasks, pool, episode)
    failed = [ep.task.id for ep in episodes if not ep.success]
    if failed:
        raise RuntimeError(f"the scripted demonstrator failed {len(failed)} episodes (first: {failed[0]}); "
                           "the sandbox did not run the world's functions")
    traces = [ep.to_trace({"model": "demonstrator"}) for ep in episodes]
    if hide_value:
        for trace, ep in zip(traces, episodes):
            trace.meta["hide_value"] = f"{expression(ep.task)} = {ep.task.answer}"
    return traces


def without_trailing_feedback(trace: Trace) -> Trace:
    """The trace up to its last assistant turn (feedback after it carries no decision to learn)."""
    last = max(i for i, m in enumerate(trace.messages) if m["role"] == "assistant")
    return Trace(messages=trace.messages[: last + 1], meta=dict(trace.meta))


def stated_value(task: Task) -> str:
    """The value a direct answer states: the math answer, or what a code-answer problem's ``solve()`` returns."""
    return task.meta["value"] if task.kind == "code" else task.answer or ""


def direct_answer(task: Task) -> str:
    """The direct answer to ``task``: ``direct_text`` for a math problem, ``code_text`` for a code-answer one."""
    call, value = expression(task), stated_value(task)
    return code_text(call, value, task.reference or "") if task.kind == "code" else direct_text(call, value)


def direct_traces(tasks: Sequence[Task], kind: str = "general", hide_value: bool = False,
                  math_prompt: str | None = None, code_prompt: str | None = None) -> list[Trace]:
    """Single-turn conversations answering ``tasks`` directly, posed as evaluation poses them.

    ``hide_value`` marks the stated value (``= 309``) as one the base must not learn (see ``base_example``);
    ``math_prompt`` and ``code_prompt`` are evaluation's single-turn instructions (their defaults when None).
    """
    from molrl.tasks.prompts import CODE_INSTRUCTION, MATH_INSTRUCTION, user_message

    return [
        Trace(
            messages=[{"role": "user", "content": user_message(t, code_prompt or CODE_INSTRUCTION,
                                                               math_prompt or MATH_INSTRUCTION)},
                      {"role": "assistant", "content": direct_answer(t)}],
            meta={"source": "demo", "kind": kind, "task_id": t.id, "success": True,
                  **({"hide_value": f"{expression(t)} = {stated_value(t)}"} if hide_value else {})},
        )
        for t in tasks
    ]


def base_example(example: Any, trace: Trace, tokenizer: Any, learn_feedback: bool) -> BaseExample:
    """What the base trains on in ``example`` (a tokenised ``trace``).

    Decisions, and feedback with ``learn_feedback``, are learned, except every statement of the
    value ``meta['hide_value']`` names. The first one (the tool's output, or a direct answer) is
    trained towards a uniform guess over the digits instead, so the base neither knows ``f`` nor
    is sure of a wrong value, and sampling it explores every digit. Later ones (the answer copying
    the tool's output) are not trained at all: a model can fit a copy by computing ``f`` as well
    as by copying, so learning them would teach ``f`` (the base learns to copy from the general
    functions' episodes).
    """
    from molrl.chat import render

    learn = [d or (learn_feedback and f) for d, f in zip(example.decision_mask, example.feedback_mask)]
    unsure = [False] * len(learn)
    statement = trace.meta.get("hide_value")
    if statement:
        text = render(tokenizer, trace.messages, enable_thinking=True)
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        if list(enc["input_ids"]) != list(example.input_ids):
            raise ValueError(f"trace {trace.meta.get('task_id')}: rendering differs from its tokenisation")
        offset = statement.index(" = ") + len(" = ")
        spans = [(i + offset, i + len(statement)) for i in _occurrences(text, statement)]  # the values' characters
        inside = [[a < end and b > start for a, b in enc["offset_mapping"]] for start, end in spans]
        unsure = inside[0]
        learn = [m and not any(col) for m, col in zip(learn, zip(*inside))]
    return BaseExample(list(example.input_ids), learn, unsure)


def _occurrences(text: str, part: str) -> list[int]:
    """Start offsets of every occurrence of ``part`` in ``text`` (at least one, else ValueError)."""
    found = [text.index(part)]
    while (nxt := text.find(part, found[-1] + 1)) != -1:
        found.append(nxt)
    return found


def train_base(traces: Sequence[Trace], cfg: BaseModelConfig, out_dir: Path,
               make_example: Callable[..., BaseExample] | None = None) -> Path:
    """Train the tiny base from scratch on ``traces``; save it to ``out_dir``.

    ``make_example`` says what a trace trains (default ``base_example``; the chain world's is
    ``molrl.demo.chain_base.chain_example``)."""
    from molrl.tiny import build_tiny_model, build_tiny_tokenizer
    from molrl.traces.tokenize import TokenizeConfig, tokenize_trace

    torch.manual_seed(cfg.seed)
    tokenizer = build_tiny_tokenizer("chatml")
    tok_cfg = TokenizeConfig(max_length=None, enable_thinking=True, require_feedback=False)
    examples = []
    for trace in traces:
        if not cfg.learn_feedback:
            trace = without_trailing_feedback(trace)
        examples.append((make_example or base_example)(tokenize_trace(trace, tokenizer, tok_cfg), trace, tokenizer,
                                                       cfg.learn_feedback))
    model = build_tiny_model(len(tokenizer), hidden_size=cfg.hidden_size, num_layers=cfg.num_layers,
                             num_heads=cfg.num_heads, num_kv_heads=max(1, cfg.num_heads // 2), seed=cfg.seed)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    started = time.time()
    digits = tokenizer.convert_tokens_to_ids(list("0123456789"))
    losses = fit(model, examples, cfg, tokenizer.pad_token_id, digits)
    log.info("base model: %d steps in %.0f s, loss %.3f -> %.4f", cfg.steps, time.time() - started,
             losses[0], losses[-1])
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)  # the marker written after it says whether it is whole
    tokenizer.save_pretrained(out_dir)
    return out_dir


def made_before(marker: Path, made_of: dict[str, Any]) -> bool:
    """Whether the ``DONE`` marker ``marker`` (a record this program wrote when it finished a base) says its folder
    was made of ``made_of`` (then it is reused); the one reading of every demo base's marker."""
    return marker.is_file() and json.loads(marker.read_text()) == made_of


def write_making_time(base_dir: Path, seconds: float) -> None:
    """Record in ``base_dir/timing.json`` how long the base took to make (demonstrations and training), for the
    pipeline report's timing table (``molrl.report.stage_times``)."""
    write_text(base_dir / "timing.json", json.dumps({"seconds": round(seconds, 1)}))
