"""The demo's base model: a tiny Qwen3 trained from scratch on the demo world's formats.

The base learns two things and nothing more:

- the agent format on rule problems: write code that calls ``f``, read the tool's output, and
  copy the result into the answer. The demonstrations are real episodes of the collection loop
  (``molrl.collect.run_episodes``) driven by ``ToolDemonstrator``, a scripted policy that only
  ever uses the tool; the loss covers decision tokens only, never the tool's output, so the base
  cannot compute ``f`` itself;
- general problems (reverse / sort a digit string) answered directly in the single-turn format
  evaluation uses;
- the same direct format on rule problems, with no loss on the rule's value (``hide_value``): the
  base learns to state ``f(478) = ...`` and box it, but is never told what ``f`` gives.

Training is a plain loop (AdamW, linear warm-up and decay) with fixed seeds and thread count, so
the same machine gives the same weights run to run. The model and tokenizer are saved with
``save_pretrained`` and load with plain transformers.
"""

from __future__ import annotations

import logging
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from molrl.demo.world import World
from molrl.generation import SamplingConfig
from molrl.tasks import Task
from molrl.traces.schema import Trace

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
    steps: int = 400
    """Optimiser steps."""
    batch_size: int = 32
    """Sequences per step."""
    learning_rate: float = 3e-3
    """Peak AdamW learning rate."""
    warmup_steps: int = 20
    """Linear warm-up steps (then linear decay to zero)."""
    seed: int = 0
    """Seed of the initial weights and of the batch order."""


def answer_text(expression: str, value: str) -> str:
    """How every answer in the world is written: ``f(478) = 309`` then the boxed value."""
    return f"{expression} = {value}\n\\boxed{{{value}}}"


def direct_text(expression: str, value: str) -> str:
    """A direct (single-step) answer: the output the call would print, then the boxed value.

    It states the value in the same words the tool's feedback uses (``Output:`` + the printed
    line), so what the model learns to predict in feedback is the same text it writes here.
    """
    return f"Output:\n{answer_text(expression, value)}"


def expression(task: Task) -> str:
    """The call a problem asks about, e.g. ``f(478)`` or ``reverse(5125)``."""
    match = _QUESTION.search(task.prompt)
    if match is None:
        raise ValueError(f"task {task.id}: prompt {task.prompt!r} is not a 'What is name(number)?' question")
    return match.group(1)


class ToolDemonstrator:
    """A scripted policy for the collection loop: run ``print`` on the asked call, then copy the output.

    It reads only the conversation (the rendered prompt), like a model would: with no tool output
    yet it writes the code; after an output it answers with what the tool printed.
    """

    def generate(self, prompts: Sequence[str], sampling: SamplingConfig) -> list[list[str]]:
        """One scripted turn per prompt (``sampling`` is ignored: the policy is deterministic)."""
        return [[self.turn(p)] for p in prompts]

    @staticmethod
    def turn(prompt: str) -> str:
        """The next assistant turn for a rendered conversation."""
        outputs = _OUTPUT.findall(prompt)
        if outputs:
            call, value = outputs[-1]
            return answer_text(call, value)
        questions = _QUESTION.findall(prompt)
        if not questions:
            raise ValueError(f"no 'What is name(number)?' question in prompt: {prompt[-200:]!r}")
        call = questions[-1]
        return f"<execute>print('{call} =', {call})</execute>"


def demonstration_traces(world: World, tokenizer: Any, episode: Any, pool: Any) -> list[Trace]:
    """Tool-use episodes on the training rule problems, run through the real collection loop."""
    from molrl.collect.loop import run_episodes

    episodes = run_episodes(ToolDemonstrator(), tokenizer, world.rule_train, pool, episode)
    failed = [ep.task.id for ep in episodes if not ep.success]
    if failed:
        raise RuntimeError(f"the scripted demonstrator failed {len(failed)} episodes (first: {failed[0]}); "
                           "the sandbox did not run the world's rule")
    return [ep.to_trace({"model": "demonstrator"}) for ep in episodes]


def without_trailing_feedback(trace: Trace) -> Trace:
    """The trace up to its last assistant turn (feedback after it carries no decision to learn)."""
    last = max(i for i, m in enumerate(trace.messages) if m["role"] == "assistant")
    return Trace(messages=trace.messages[: last + 1], meta=dict(trace.meta))


def direct_traces(tasks: Sequence[Task], kind: str = "general", hide_value: bool = False) -> list[Trace]:
    """Single-turn conversations answering ``tasks`` directly, posed as evaluation poses them.

    ``hide_value`` marks the stated value (``= 309``) as not to be learned (see ``train_base``).
    """
    from molrl.eval.prompts import user_message

    return [
        Trace(
            messages=[{"role": "user", "content": user_message(t)},
                      {"role": "assistant", "content": direct_text(expression(t), t.answer or "")}],
            meta={"source": "demo", "kind": kind, "task_id": t.id, "success": True,
                  **({"hide_value": f"{expression(t)} = {t.answer}"} if hide_value else {})},
        )
        for t in tasks
    ]


def hide_value(example: Any, trace: Trace, tokenizer: Any) -> Any:
    """``example`` with the value after ``meta['hide_value']``'s `` = `` taken out of the decision mask."""
    from molrl.chat import render

    text = render(tokenizer, trace.messages, enable_thinking=True)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if list(enc["input_ids"]) != list(example.input_ids):
        raise ValueError(f"trace {trace.meta.get('task_id')}: rendering differs from its tokenisation")
    statement = trace.meta["hide_value"]
    start = text.rindex(statement) + statement.index(" = ") + len(" = ")
    end = text.rindex(statement) + len(statement)  # [start, end): the value's characters
    example.decision_mask = [d and not (a < end and b > start) for d, (a, b) in zip(example.decision_mask, enc["offset_mapping"])]
    return example


def train_base(traces: Sequence[Trace], cfg: BaseModelConfig, out_dir: Path) -> Path:
    """Train the tiny base from scratch on the decision tokens of ``traces``; save it to ``out_dir``."""
    from molrl.tiny import build_tiny_model, build_tiny_tokenizer
    from molrl.traces.tokenize import TokenizeConfig, tokenize_trace

    torch.manual_seed(cfg.seed)
    tokenizer = build_tiny_tokenizer("chatml")
    tok_cfg = TokenizeConfig(max_length=None, enable_thinking=True, require_feedback=False)
    examples = []
    for trace in traces:
        trace = without_trailing_feedback(trace)
        example = tokenize_trace(trace, tokenizer, tok_cfg)
        examples.append(hide_value(example, trace, tokenizer) if "hide_value" in trace.meta else example)
    model = build_tiny_model(len(tokenizer), hidden_size=cfg.hidden_size, num_layers=cfg.num_layers,
                             num_heads=cfg.num_heads, num_kv_heads=max(1, cfg.num_heads // 2), seed=cfg.seed)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    started = time.time()
    losses = fit(model, examples, cfg, tokenizer.pad_token_id)
    log.info("base model: %d steps in %.0f s, decision loss %.3f -> %.4f", cfg.steps, time.time() - started,
             losses[0], losses[-1])
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def fit(model: Any, examples: Sequence[Any], cfg: BaseModelConfig, pad_id: int) -> list[float]:
    """The training loop: CE on decision tokens, random batches, warm-up then linear decay."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / cfg.warmup_steps) * max(0.0, 1.0 - s / cfg.steps))
    rng = random.Random(cfg.seed)
    model.train()
    losses = []
    for step in range(cfg.steps):
        input_ids, labels = collate(rng.sample(list(examples), min(cfg.batch_size, len(examples))), pad_id)
        loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 100 == 0:
            log.info("base model: step %d of %d, decision loss %.4f", step, cfg.steps, losses[-1])
    model.eval()
    return losses


def collate(batch: Sequence[Any], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids`` [B, L] and ``labels`` [B, L] (-100 except on decision tokens)."""
    width = max(len(ex.input_ids) for ex in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)  # [B, L]
    labels = torch.full((len(batch), width), -100, dtype=torch.long)  # [B, L]
    for row, ex in enumerate(batch):
        ids = torch.tensor(ex.input_ids)
        decision_mask = torch.tensor(ex.decision_mask)
        input_ids[row, : len(ids)] = ids
        labels[row, : len(ids)] = torch.where(decision_mask, ids, torch.full_like(ids, -100))
    return input_ids, labels
