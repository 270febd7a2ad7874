"""Critique from another model: a feedback provider that asks an OpenAI-compatible endpoint.

Any server speaking ``POST /v1/chat/completions`` works (vLLM, TGI, llama.cpp, hosted APIs). The
critic sees the task, the conversation so far and what the environment observed, and writes
advice for the next step; its text is recorded as it came (critiques are not re-derivable).
A request that still fails after the retries stops the run with the endpoint's error: finished
episodes are already saved, and re-running resumes.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Sequence

from molrl.episode.config import CritiqueConfig
from molrl.episode.feedback import ExecutionFeedback, FormatFeedback, Observation, TestFeedback, VerdictFeedback, render_feedback
from molrl.errors import MolrlError
from molrl.tasks import Task

CRITIC_PROMPT = (
    "You are an expert reviewing a model that solves a task by running Python code over several turns. "
    "Given the task, the conversation so far and what the environment observed after the model's last turn, "
    "write brief, concrete advice for the model's next step: name the mistake if there is one and how to "
    "approach a fix. Do not write the full solution."
)
"""The critic's default instructions."""

_ROLE_NAMES = {"system": "Instructions", "user": "Task", "assistant": "Model", "tool": "Environment"}


@dataclass
class CritiqueFeedback:
    """Advice from a critic model, prefixed ``Expert feedback:``."""

    cfg: CritiqueConfig
    """Where the critic is and how to ask it."""
    name: str = "critique"
    remote: bool = True
    """Asks over the network, so the loop requests all critiques of a round at once."""

    def __post_init__(self) -> None:
        if not self.cfg.base_url or not self.cfg.model:
            raise MolrlError("the critique feedback provider needs critique.base_url and critique.model")

    def __call__(self, task: Task, obs: Observation, messages: Sequence[dict[str, str]]) -> str | None:
        observed, _ = render_feedback(
            [ExecutionFeedback(), TestFeedback(), VerdictFeedback(), FormatFeedback()], task, obs, messages
        )
        transcript = "\n\n".join(f"{_ROLE_NAMES[m['role']]}:\n{m['content']}" for m in messages if m["role"] != "system")
        request = [
            {"role": "system", "content": self.cfg.instructions or CRITIC_PROMPT},
            {"role": "user", "content": f"{transcript}\n\nWhat the environment observed:\n{observed}"},
        ]
        text = chat_completion(self.cfg, request).strip()
        return f"Expert feedback:\n{text}" if text else None


def chat_completion(cfg: CritiqueConfig, messages: list[dict[str, str]]) -> str:
    """The reply text of one ``/v1/chat/completions`` request, retried ``cfg.retries`` times."""
    url = cfg.base_url.rstrip("/") + "/v1/chat/completions"
    body = json.dumps(
        {"model": cfg.model, "messages": messages, "max_tokens": cfg.max_tokens, "temperature": cfg.temperature}
    ).encode()
    headers = {"Content-Type": "application/json"}
    key = os.environ.get(cfg.api_key_env, "")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    error: Exception | None = None
    for attempt in range(cfg.retries + 1):
        if attempt:
            time.sleep(min(0.5 * 2**attempt, 10.0))  # 1 s, 2 s, 4 s, ... between attempts
        try:
            req = urllib.request.Request(url, data=body, headers=headers, method="POST")
            with urllib.request.urlopen(req, timeout=cfg.timeout_s) as response:
                return _reply_text(json.loads(response.read().decode("utf-8")), url)
        except urllib.error.HTTPError as err:
            error = MolrlError(f"critique endpoint {url} answered HTTP {err.code}: {err.read()[:300].decode(errors='replace')}")
            if err.code < 500 and err.code != 429:
                break  # a client error will not go away on retry
        except (urllib.error.URLError, TimeoutError, OSError, json.JSONDecodeError) as err:
            error = MolrlError(f"critique endpoint {url} failed: {err}")
    assert error is not None
    raise error


def _reply_text(payload: Any, url: str) -> str:
    try:
        content = payload["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise MolrlError(f"critique endpoint {url} returned no choices[0].message.content: {str(payload)[:300]}") from None
    return content or ""
