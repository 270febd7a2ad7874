"""The periodic evaluation hook: every N steps, held-out single-step accuracy and mean KL to the base.

Accuracy comes from ``molrl.eval.evaluate_single`` (the evaluation stage's own loop and graders,
greedy, one answer per task); the KL is the exact per-token KL(policy || base) over the greedy
answers of the first ``kl_prompts`` held-out tasks (``molrl.rl.kl``). Results are appended to
``metrics.jsonl`` as ``eval/accuracy`` and ``eval/kl_to_base`` with the step, by the main process, beside
``eval/sandbox_errors``: answers the sandbox could not judge, left out of the accuracy.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable

from transformers import TrainerCallback

from molrl.eval.single import evaluate_single
from molrl.rl.kl import policy_base_kl
from molrl.tasks.prompts import CODE_INSTRUCTION, MATH_INSTRUCTION
from molrl.traces.spans import render_prompts
from molrl.records.writes import append_text

log = logging.getLogger(__name__)


class EvalHookCallback(TrainerCallback):
    """Runs the held-out evaluation every ``every_steps`` optimiser steps (and after the last step)."""

    def __init__(self, every_steps: int, evaluate: Callable[[Any], dict[str, float]], metrics_path: Path):
        self.every_steps = every_steps
        self.evaluate = evaluate
        self.metrics_path = Path(metrics_path)

    @classmethod
    def from_config(cls, cfg: Any, policy: Any, tasks: list, pool: Any) -> "EvalHookCallback":
        """The hook for a GRPO config: its held-out ``tasks``, greedy sampling, and the policy's base."""
        sampling = dataclasses.replace(cfg.eval.sampling, seed=cfg.train.seed)  # the stream training goes on from
        base = BaseAccess(policy)

        def evaluate(model: Any) -> dict[str, float]:
            engine = getattr(policy.trainer, "engine", None)  # the policy engine when the run generates on one
            return evaluate_policy(model, policy.tokenizer, tasks, sampling, pool, base, cfg.thinking,
                                   cfg.eval.kl_prompts, code_template=cfg.code_prompt, math_template=cfg.math_prompt,
                                   generator=None if engine is None else engine.text_generator(policy.trainer))

        return cls(cfg.eval.every_steps, evaluate, Path(cfg.output_dir) / "metrics.jsonl")

    def on_step_end(self, args, state, control, model=None, **kwargs):
        last = state.global_step == state.max_steps
        if not state.is_world_process_zero or (state.global_step % self.every_steps and not last):
            return
        start = time.perf_counter()
        try:
            metrics: dict[str, Any] = self.evaluate(model)
        except Exception as err:  # noqa: BLE001 - the hook only observes; training goes on
            log.error("step %d: evaluation hook failed: %s: %s", state.global_step, type(err).__name__, err)
            metrics = {"eval/error": f"{type(err).__name__}: {err}"}
        metrics["eval/time_s"] = time.perf_counter() - start
        log.info("step %d eval: %s", state.global_step, ", ".join(f"{k}={v}" for k, v in metrics.items()))
        append_text(self.metrics_path, json.dumps({"step": state.global_step, **metrics}) + "\n")


class BaseAccess:
    """The original base model for a policy: its adapter disabled, or a separately loaded copy after merge_new."""

    def __init__(self, policy: Any):
        self.policy = policy
        self._loaded = None

    def __call__(self, model: Any) -> Any:
        """A model, or a context-manager factory that turns ``model`` into the base while entered."""
        if self.policy.adapter_mode != "merge_new":
            return model.disable_adapter
        trainer = self.policy.trainer
        if trainer is not None and trainer.ref_model is not None:  # only merge_new + reference=base installs one
            return trainer.ref_model
        if self._loaded is None:
            self._loaded = self.policy.load_base().to(next(model.parameters()).device).train(False)  # inference mode
        return self._loaded


def evaluate_policy(model: Any, tokenizer: Any, tasks: list, sampling: Any, pool: Any, base: BaseAccess,
                    enable_thinking: bool, kl_prompts: int, code_template: str = CODE_INSTRUCTION,
                    math_template: str = MATH_INSTRUCTION, generator: Any = None) -> dict[str, float]:
    """Held-out accuracy (evaluate_single) and mean per-token KL(policy || base) on its greedy answers,
    with tasks posed by the single-turn instructions ``code_template`` / ``math_template``; ``generator``: what
    generates the answers (None: transformers on ``model``)."""
    result = evaluate_single(model, tokenizer, tasks, sampling, pool, enable_thinking=enable_thinking,
                             code_template=code_template, math_template=math_template, generator=generator)
    metrics: dict[str, float] = {}
    if result["accuracy"] is not None:  # None: the sandbox or the grader judged no answer, so there is no accuracy
        metrics["eval/accuracy"] = float(result["accuracy"])
    metrics["eval/sandbox_errors"] = float(result["sandbox_errors"])
    n = min(kl_prompts, len(tasks))
    if n:
        prompts = render_prompts(tokenizer, tasks[:n], enable_thinking=enable_thinking, code_template=code_template,
                                 math_template=math_template)
        completions = [records[0].completion for records in result["records"][:n]]
        metrics["eval/kl_to_base"] = policy_base_kl(model, base(model), tokenizer, prompts, completions)
    return metrics
