"""Single-turn evaluation prompts: one user message per task, rendered with ``molrl.chat.render``.

The instruction tells the model how to present its answer so that the shared graders can find it:
a fenced ```python block for code (``molrl.graders.extract_code``), a final ``\\boxed{}`` for
math (``molrl.graders.extract_answer``). Templates are plain ``str.format`` strings with a
``{prompt}`` field (and ``{entry_point}`` for code), overridable from the eval config.
"""

from __future__ import annotations

from typing import Any, Sequence

from molrl.chat import render
from molrl.tasks import Task

CODE_INSTRUCTION = (
    "Write a Python function `{entry_point}` that solves the following problem. "
    "Give the complete function, with any imports it needs, in a single ```python code block.\n\n"
    "{prompt}"
)
MATH_INSTRUCTION = "{prompt}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}."


def user_message(task: Task, code_template: str = CODE_INSTRUCTION, math_template: str = MATH_INSTRUCTION) -> str:
    """The user message that poses ``task`` in a single turn."""
    template = code_template if task.kind == "code" else math_template
    try:
        return template.format(prompt=task.prompt, entry_point=task.entry_point or "solution")
    except (KeyError, IndexError) as err:
        raise ValueError(
            f"prompt template {template!r}: unknown field {err}; use {{prompt}} and {{entry_point}}, "
            "and double literal braces ({{{{ }}}})"
        ) from None


def render_prompts(
    tokenizer: Any,
    tasks: Sequence[Task],
    *,
    enable_thinking: bool,
    code_template: str = CODE_INSTRUCTION,
    math_template: str = MATH_INSTRUCTION,
) -> list[str]:
    """Model-ready prompt text for each task: the chat template applied to its one user message."""
    return [
        render(
            tokenizer,
            [{"role": "user", "content": user_message(t, code_template, math_template)}],
            add_generation_prompt=True,
            enable_thinking=enable_thinking,
        )
        for t in tasks
    ]
