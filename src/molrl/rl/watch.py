"""What a run's metrics say goes wrong while it runs: each finding once, in one line naming what to check.

Each check is a pure function of one logged step's metrics (``logs``: what TRL logs, each value the mean over the
logging window) and the run's settings (``WatchSettings``), returning the line or None. ``RunWatch`` runs every
check at each log of the main process and says each line the first time its check holds, never again in that run:

- ``no_signal``: every group's completions got one reward (``frac_reward_zero_std`` 1), so every group-relative
  advantage is 0 and the policy-gradient term trains nothing (loss 0 and grad_norm 0 unless another term trains).
  The usual case is reward 0 everywhere: the policy solves none of its tasks as graded. The line names the most
  frequent grade and the keys to check: the tasks, the reward, the temperature, the turn and token budgets.
  Group-relative algorithms only (``GroupRelative``): a critic's or a teacher's advantage is not 0 there.
- ``tis_at_cap``: one step off (``rollout.max_staleness=1``), a token's TIS weight reached ``rollout.tis_cap``: one
  optimiser step moved the policy further than the correction weighs, so those tokens train with a clipped weight
  (docs/scale-out.md: keep ``rollout/tis_weight_max`` well under the cap). The line names the learning rate.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from transformers import TrainerCallback

log = logging.getLogger(__name__)

STAGE_PREFIX = "reward_stage/"
"""Metrics holding each grade's share of a step's completions (``molrl.rl.score.log_scores``)."""


@dataclass(frozen=True)
class WatchSettings:
    """The run's settings that the lines name."""

    data: str
    """The training tasks, as the run names them (``data.path``, or the format)."""
    code_mode: str
    """reward.code_mode."""
    temperature: float
    """sampling.temperature."""
    max_turns: int
    """episode.max_turns."""
    max_new_tokens: int
    """sampling.max_new_tokens."""
    learning_rate: float
    """train.learning_rate."""
    group_relative: bool
    """Whether the algorithm's advantage is a completion's reward relative to its group's."""
    tis_cap: float | None
    """rollout.tis_cap when the run trains one step off (rollout.max_staleness=1), else None."""

    @classmethod
    def from_config(cls, cfg: Any) -> WatchSettings:
        """The settings of an ``RlConfig``."""
        from molrl.rl.algorithms import ALGORITHMS
        from molrl.rl.algorithms.grpo import GroupRelative

        return cls(data=str(cfg.data.path or cfg.data.format), code_mode=cfg.reward.code_mode,
                   temperature=cfg.sampling.temperature,
                   max_turns=cfg.episode.max_turns, max_new_tokens=cfg.sampling.max_new_tokens,
                   learning_rate=cfg.train.learning_rate,
                   group_relative=issubclass(ALGORITHMS[cfg.algorithm], GroupRelative),
                   tis_cap=cfg.rollout.tis_cap if cfg.rollout.max_staleness > 0 else None)


def _number(logs: Mapping[str, Any], key: str) -> float | None:
    """``logs[key]`` as a finite float; None when absent or not finite (no finding rests on a NaN)."""
    value = logs.get(key)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def no_signal(step: int, logs: Mapping[str, Any], settings: WatchSettings) -> str | None:
    """The line for a step whose every group got one reward, so its advantages are all 0; else None."""
    uniform, reward = _number(logs, "frac_reward_zero_std"), _number(logs, "reward")
    if not settings.group_relative or uniform is None or reward is None or uniform < 1.0 - 1e-9:
        return None
    shares = {k[len(STAGE_PREFIX):]: v for k in logs if k.startswith(STAGE_PREFIX) and (v := _number(logs, k))}
    grade = max(shares, key=shares.__getitem__, default=None)
    graded = f", {shares[grade]:.0%} graded {grade}" if grade else ""
    moved = ", ".join(f"{k} {v:.3g}" for k in ("loss", "grad_norm") if (v := _number(logs, k)) is not None)
    return (f"step {step}: every group's completions got one reward (mean {reward:.3g}{graded}), so every advantage "
            f"is 0 and the policy gradient trains nothing{f' ({moved})' if moved else ''}. Check the tasks "
            f"({settings.data}: can the model solve some of them, not all?), the reward (reward.code_mode="
            f"{settings.code_mode}), the temperature "
            f"(sampling.temperature={settings.temperature:g}; a higher one spreads a group), the turn budget "
            f"(episode.max_turns={settings.max_turns}) and the token budget (sampling.max_new_tokens="
            f"{settings.max_new_tokens}); completions.jsonl holds every completion with its grade")


def tis_at_cap(step: int, logs: Mapping[str, Any], settings: WatchSettings) -> str | None:
    """The line for a one-step-off step whose largest TIS weight reached ``rollout.tis_cap``; else None."""
    top = _number(logs, "rollout/tis_weight_max")
    if settings.tis_cap is None or top is None or top < settings.tis_cap * (1 - 1e-6):
        return None
    mean, capped = _number(logs, "rollout/tis_weight_mean"), _number(logs, "rollout/tis_capped_fraction")
    detail = ", ".join([*([f"mean {mean:.3g}"] if mean is not None else []),
                        *([f"{capped:.1%} of sampled tokens at the cap"] if capped is not None else [])])
    return (f"step {step}: rollout/tis_weight_max={top:.3g} reached rollout.tis_cap={settings.tis_cap:g}"
            f"{f' ({detail})' if detail else ''}: one optimiser step moves the policy further than the one-step-off "
            "correction weighs, so those tokens train with a clipped weight. Lower the learning rate "
            f"(train.learning_rate={settings.learning_rate:g}) until the max stays well under the cap, or train "
            "synchronously (rollout.max_staleness=0)")


CHECKS: dict[str, Callable[[int, Mapping[str, Any], WatchSettings], str | None]] = {
    "no_signal": no_signal, "tis_at_cap": tis_at_cap}
"""Every check ``RunWatch`` runs, by name."""


class RunWatch(TrainerCallback):
    """Says each check's line (``CHECKS``) the first time it holds for a logged step, once a run."""

    def __init__(self, settings: WatchSettings, checks: Mapping[str, Callable] | None = None):
        self.settings = settings
        self.checks = dict(CHECKS if checks is None else checks)
        self.said: dict[str, str] = {}
        """Each check that has spoken, with its line."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        for name, check in self.checks.items():
            if name not in self.said and (line := check(state.global_step, logs, self.settings)):
                self.said[name] = line
                log.warning("%s", line)
