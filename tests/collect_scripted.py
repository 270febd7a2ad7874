"""A scripted "model" for collection tests: replays fixed turns, keyed by task and turn number."""

from __future__ import annotations

from typing import Sequence

from molrl.engines.generation import SamplingConfig


class ScriptedGenerator:
    """Answers the k-th assistant turn of the conversation that contains ``marker`` with ``script[marker][k]``.

    Works on prompts rendered with the tiny ChatML template: the number of assistant headers in a
    prompt, minus the open one, is the number of turns already taken. Every call is recorded.
    """

    def __init__(self, scripts: dict[str, Sequence[str]]):
        self.scripts = scripts
        self.calls: list[list[str]] = []

    def generate(self, prompts: Sequence[str], sampling: SamplingConfig) -> list[list[str]]:
        self.calls.append(list(prompts))
        out = []
        for prompt in prompts:
            marker = next(m for m in self.scripts if m in prompt)
            turn = prompt.count("<|im_start|>assistant") - 1
            out.append([self.scripts[marker][turn]])
        return out
