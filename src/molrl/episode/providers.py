"""Feedback providers by name: the built-in ones (``molrl.episode.feedback``, the critic of
``molrl.episode.critique``) and a user's own as ``package.module:factory``."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Sequence

from molrl.episode.critique import CritiqueFeedback
from molrl.episode.feedback import (BudgetFeedback, ExecutionFeedback, FeedbackProvider, FormatFeedback, TestFeedback,
                                    VerdictFeedback)
from molrl.episode.quote import Spans, token_spans
from molrl.errors import MolrlError

BUILTIN: dict[str, Callable[[Any, Spans | None], FeedbackProvider]] = {
    "execution": lambda cfg, spans: ExecutionFeedback(max_tokens=cfg.feedback_max_tokens, spans=spans),
    "tests": lambda cfg, spans: TestFeedback(max_failures=cfg.max_failures_shown, max_tokens=cfg.feedback_max_tokens,
                                             spans=spans),
    "verdict": lambda cfg, spans: VerdictFeedback(),
    "format": lambda cfg, spans: FormatFeedback(),
    "budget": lambda cfg, spans: BudgetFeedback(),
    "critique": lambda cfg, spans: CritiqueFeedback(cfg.critique),
}
"""Providers by config name; each factory takes the ``EpisodeConfig`` and the run's token spans (or None)."""


def build_providers(names: Sequence[str], cfg: Any, tokenizer: Any = None) -> list[FeedbackProvider]:
    """Providers for config ``names``: built-in names, or ``module:factory`` import paths.

    Quoted output is clipped in ``tokenizer``'s tokens; without one, in UTF-8 bytes (never fewer).
    """
    spans = token_spans(tokenizer) if tokenizer is not None else None
    providers = []
    for name in names:
        if name in BUILTIN:
            providers.append(BUILTIN[name](cfg, spans))
        elif ":" in name:
            module, _, attr = name.partition(":")
            try:
                factory = getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError) as err:
                raise MolrlError(f"feedback provider {name!r} cannot be imported: {err}") from None
            providers.append(factory(cfg))
        else:
            raise MolrlError(
                f"unknown feedback provider {name!r}; built-in ones are {', '.join(BUILTIN)}, "
                "or name your own as package.module:factory"
            )
    return providers
