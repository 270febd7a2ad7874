"""RL prompts: a task source -> tasks -> chat-rendered prompt text, one dataset row per task.

Rows carry ``prompt`` (text rendered by ``molrl.chat.render`` with the same single-turn
instruction evaluation uses, so training and evaluation pose a task identically), ``prompt_ids``
(its token ids, with the task's text encoded as plain text: ``molrl.traces.spans.encode_chat``),
``task_json`` (the task the reward grades: its held-back tests where the policy sees the shown ones,
``molrl.tasks.held_out.episode_tasks``) and ``episode_json`` (the task a multi-turn episode runs on: its shown
tests there). Tasks that cannot be scored (code without tests, math without an answer, a code task whose
tests are shown and that holds none back) and prompts longer than the limit are left out, each logged with its
task id, and counted in the returned summary.

A benchmark file gives its training split unless ``split`` names another (``molrl.tasks.splits``); a run whose
tasks lie in a test split says so in one line. The summary holds the content key of every kept task and the
benchmark tasks among them (``molrl.tasks.index``), for the run's provenance.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

from molrl.tasks.held_out import constant_answer, episode_tasks, prompt_lists_tests, split_reason
from molrl.tasks.index import BENCHMARK_TASK, TASK_KEY, task_tags
from molrl.tasks.prompts import CODE_INSTRUCTION, MATH_INSTRUCTION, render_prompt, user_message
from molrl.traces.spans import encode_chat
from molrl.task_types import Task

log = logging.getLogger(__name__)


@dataclass
class PromptSummary:
    """What happened to the tasks on their way to prompts."""

    tasks: int = 0
    """Tasks read."""
    kept: int = 0
    """Tasks that became training prompts."""
    unscorable: list[str] = field(default_factory=list)
    """Ids of tasks with nothing to grade against (no tests / no answer)."""
    too_long: list[str] = field(default_factory=list)
    """Ids of tasks whose rendered prompt exceeded max_prompt_length tokens."""
    constant_answer: list[str] = field(default_factory=list)
    """Ids of tasks left out because one constant return, the value a shown test expects, passes their held-back tests
    (``molrl.tasks.held_out.constant_answer``)."""
    longest_prompt_tokens: int = 0
    """Token length of the longest kept prompt."""
    task_keys: list[str] = field(default_factory=list)
    """The content key of every kept task (``molrl.tasks.index``), sorted, each once: what the run trains on."""
    benchmark_tasks: list[tuple[str, str | None, str, str]] = field(default_factory=list)
    """(benchmark, split, task id, content key) of the kept tasks a benchmark loader read, for the run's provenance."""


def unscorable_reason(task: Task) -> str | None:
    """Why ``task`` cannot be graded, or None when it can."""
    if task.kind == "code" and not task.tests:
        return "code task has no tests; add tests (call/stdio/assert) to the record"
    if task.kind == "math" and not (task.answer or "").strip():
        return "math task has no answer; add the gold final answer to the record"
    return None


def _record(summary: PromptSummary, task: Task) -> None:
    """Count ``task``'s content key, and the benchmark task it is, in ``summary``."""
    tags = task_tags(task)
    summary.task_keys.append(tags[TASK_KEY])
    found = tags.get(BENCHMARK_TASK)
    if found:
        summary.benchmark_tasks.append((found["benchmark"], found["split"], found["id"], found["key"]))


def build_prompt_rows(
    tasks: Sequence[Task], tokenizer: Any, *, enable_thinking: bool, max_prompt_length: int,
    code_template: str = CODE_INSTRUCTION, math_template: str = MATH_INSTRUCTION, hold_back_tests: bool = False,
    keep_constant_answer: bool = False,
) -> tuple[list[dict[str, Any]], PromptSummary]:
    """Dataset rows ``{"prompt", "prompt_ids", "task_json", "episode_json"}`` for the scorable tasks whose prompt fits
    (``hold_back_tests``: episodes show test outcomes, so a code task needs tests to hold back, ``split_reason``;
    so does one whose prompt lists its shown tests; there, a task whose held-back tests a constant return passes is
    left out too, unless ``keep_constant_answer``)."""
    summary = PromptSummary(tasks=len(tasks))
    rows = []
    for task in tasks:
        shown = hold_back_tests or prompt_lists_tests(task)
        reason = unscorable_reason(task) or (split_reason(task) if shown else None)
        if reason:
            log.warning("task %s left out of GRPO prompts: %s", task.id, reason)
            summary.unscorable.append(task.id)
            continue
        if shown and not keep_constant_answer and constant_answer(task):
            summary.constant_answer.append(task.id)
            continue
        prompt = render_prompt(tokenizer, task, enable_thinking, code_template, math_template)
        messages = [{"role": "user", "content": user_message(task, code_template, math_template)}]
        prompt_ids = encode_chat(tokenizer, messages, add_generation_prompt=True, enable_thinking=enable_thinking)
        n_tokens = len(prompt_ids)
        if n_tokens > max_prompt_length:
            summary.too_long.append(task.id)
            continue
        summary.longest_prompt_tokens = max(summary.longest_prompt_tokens, n_tokens)
        episode, graded, _ = episode_tasks(task, hold_back_tests)
        rows.append({"prompt": prompt, "prompt_ids": prompt_ids, "task_json": graded.to_json(),
                     "episode_json": episode.to_json()})
        _record(summary, task)
    summary.kept = len(rows)
    summary.task_keys = sorted(set(summary.task_keys))
    if summary.too_long:
        log.warning(
            "%d of %d prompts are longer than max_prompt_length=%d tokens and were left out (first: %s); "
            "raise max_prompt_length to keep them",
            len(summary.too_long), len(tasks), max_prompt_length, summary.too_long[0],
        )
    if summary.constant_answer:
        log.warning("%d of %d tasks left out of GRPO prompts: a constant return, the value their shown test expects, "
                    "passes their held-back tests (%s); reward.constant_answer_tasks=true keeps them",
                    len(summary.constant_answer), len(tasks), ", ".join(summary.constant_answer[:8]))
    log.info("GRPO prompts: %d of %d tasks kept (%d unscorable, %d too long)",
             summary.kept, summary.tasks, len(summary.unscorable), len(summary.too_long))
    return rows, summary
