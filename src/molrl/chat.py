"""Chat rendering: the one place a conversation becomes model text.

Training (tokenisation of traces), collection, GRPO prompts and evaluation all render through
``render``, so a model always sees the same format it was trained on. A prompt handed to a generator
is a ``ChatPrompt``: the rendered text together with its token ids, encoded so that message content
never becomes control tokens (``molrl.traces.spans.chat_prompt``).
"""

from __future__ import annotations

from typing import Any, Sequence

ROLES = ("system", "user", "assistant", "tool")


class ChatPrompt(str):
    """A rendered prompt (the text) that carries the token ids a model reads for it (``ids``)."""

    ids: tuple[int, ...]
    """Token ids: the template's control tokens, message contents as plain text."""

    def __new__(cls, text: str, ids: "Sequence[int]") -> "ChatPrompt":
        prompt = super().__new__(cls, text)
        prompt.ids = tuple(ids)
        return prompt

    def __reduce__(self) -> Any:
        return (ChatPrompt, (str(self), self.ids))


def render(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    *,
    add_generation_prompt: bool = False,
    enable_thinking: bool = True,
) -> str:
    """Render ``messages`` with the tokenizer's own chat template, as text."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat_template; "
            "use an instruct/chat model or set tokenizer.chat_template"
        )
    return tokenizer.apply_chat_template(
        list(messages),
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        enable_thinking=enable_thinking,
    )
