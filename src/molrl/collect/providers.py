"""Feedback providers by name: the built-in ones (``molrl.collect.feedback``, the critic of
``molrl.collect.critique``) and a user's own as ``package.module:factory``."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Sequence

from molrl.collect.critique import CritiqueFeedback
from molrl.collect.feedback import (BudgetFeedback, ExecutionFeedback, FeedbackProvider, FormatFeedback, TestFeedback,
                                    VerdictFeedback)
from molrl.errors import MolrlError

BUILTIN: dict[str, Callable[[Any], FeedbackProvider]] = {
    "execution": lambda cfg: ExecutionFeedback(max_chars=cfg.feedback_max_chars),
    "tests": lambda cfg: TestFeedback(max_failures=cfg.max_failures_shown, max_chars=cfg.feedback_max_chars),
    "verdict": lambda cfg: VerdictFeedback(),
    "format": lambda cfg: FormatFeedback(),
    "budget": lambda cfg: BudgetFeedback(),
    "critique": lambda cfg: CritiqueFeedback(cfg.critique),
}
"""Providers by config name; each factory takes the ``EpisodeConfig``."""


def build_providers(names: Sequence[str], cfg: Any) -> list[FeedbackProvider]:
    """Providers for config ``names``: built-in names, or ``module:factory`` import paths."""
    providers = []
    for name in names:
        if name in BUILTIN:
            providers.append(BUILTIN[name](cfg))
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
