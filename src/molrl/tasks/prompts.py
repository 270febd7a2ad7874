"""Single-turn prompts: one user message per task, rendered with ``molrl.chat.render``.

Evaluation, RL and the demo pose a task with these, so a task is posed the same way everywhere.

The instruction tells the model how to present its answer so that the shared graders can find it:
a fenced ```python block for code (``molrl.graders.extract_code``), a final ``\\boxed{}`` for
math (``molrl.graders.extract_answer``). Templates are plain ``str.format`` strings with a
``{prompt}`` field (and ``{entry_point}`` for code), overridable from the eval config.
"""

from __future__ import annotations

from typing import Any

from molrl.chat import render
from molrl.task_types import Task

CODE_TASK = "Write a Python function `{entry_point}` that solves the following problem."
"""How every stage words a code task: the single-turn instruction adds the answer's format, an episode's prompt
(``molrl.episode.config.EpisodeRules.code_prompt``) leaves it to the episode's instructions."""
CODE_INSTRUCTION = (CODE_TASK + " Give the complete function, with any imports it needs, in a single ```python code "
                    "block.\n\n{prompt}")
MATH_INSTRUCTION = "{prompt}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}."


def user_message(task: Task, code_template: str = CODE_INSTRUCTION, math_template: str = MATH_INSTRUCTION) -> str:
    """The user message that poses ``task`` in a single turn (the toy task as written)."""
    if task.kind == "toy":
        return task.prompt
    template = code_template if task.kind == "code" else math_template
    try:
        return template.format(prompt=task.prompt, entry_point=task.entry_point or "solution")
    except (KeyError, IndexError) as err:
        raise ValueError(
            f"prompt template {template!r}: unknown field {err}; use {{prompt}} and {{entry_point}}, "
            "and double literal braces ({{{{ }}}})"
        ) from None


def render_prompt(tokenizer: Any, task: Task, enable_thinking: bool, code_template: str = CODE_INSTRUCTION,
                  math_template: str = MATH_INSTRUCTION) -> str:
    """Prompt text for ``task``, without a BOS the tokenizer will add again when it tokenises it (RL prompts)."""
    text = render(tokenizer, [{"role": "user", "content": user_message(task, code_template, math_template)}],
                  add_generation_prompt=True, enable_thinking=enable_thinking)
    return strip_added_bos(tokenizer, text)


def strip_added_bos(tokenizer: Any, text: str) -> str:
    """Drop a leading BOS from ``text`` when tokenising adds one anyway (Llama 3), so there is one, not two."""
    bos = getattr(tokenizer, "bos_token", None)
    if not bos or not text.startswith(bos):
        return text
    ids = tokenizer("x")["input_ids"]
    return text[len(bos):] if ids and ids[0] == tokenizer.bos_token_id else text
