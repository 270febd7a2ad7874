"""One RL step, top to bottom: rollout -> score -> advantages -> loss.

A step samples G completions for each of a batch of prompts, grades them in the sandbox, turns
the grades into per-token advantages and takes a clipped policy-gradient step on them. Each
arrow below is a function, and each crosses a typed contract (shapes in the annotations; B
completions of the local process, T completion tokens, N completions over all processes):

1. ``RlTrainer.rollout``: prompts -> ``RolloutBatch`` (token ids, masks, behaviour and
   reference log-probs, the task behind each row, whether each completion finished).
2. ``score``: (tasks, completions) -> ``Scores`` through ``molrl.tasks.grade``, the dispatch
   evaluation uses; a row whose grading fails scores ``failure_reward`` and keeps its error.
3. ``ADVANTAGES[algorithm]``: rewards ``[N]`` + mask ``[N, T]`` -> advantages ``[N, T]``; for
   on-policy distillation, ``opd_advantages``: teacher, reference and policy log-probs ``[B, T]``
   -> advantages ``[B, T]`` (the teacher scores the student's own tokens, ``teacher_context``).
4. ``policy_loss``: log-probs + advantages ``[B, T]`` -> the PPO-clipped loss with its
   aggregation (``LossSettings``) and detached statistics.

The algorithms (Dr.GRPO paper, arXiv 2503.20783; MoL-RL's public training code):

=============  ==========================================  =========================================
algorithm      advantage of completion i in its group      aggregation of token losses
=============  ==========================================  =========================================
grpo           (R_i - mean_j R_j) / (std_j R_j + 1e-4)     per completion mean, then mean over B
dr_grpo        R_i - mean_j R_j                            sum over tokens and B / (B * T_max)
dr_grpo_std    (R_i - mean_j R_j) / (std_j R_j + 1e-4)     sum over tokens and B / (B * T_max)
opd            lam (log pi_T - log pi_ref)                 mean over the micro-batch's loss tokens
               - (log pi_theta - log pi_ref), per token
ppo            GAE over macro actions (``molrl.rl.macro``)  mean over the micro-batch's loss tokens,
               of per-token rewards and a learned critic   plus the clipped value loss
=============  ==========================================  =========================================

``std`` is the sample standard deviation over the G completions of a prompt and ``T_max`` is
``max_completion_length``. The loss of a token is ``-min(r A, clip(r, 1-eps_low, 1+eps_high) A)
+ beta * r * KL3`` with ``r = pi_theta / pi_behaviour`` and ``KL3 = exp(ref - logp) - (ref - logp) - 1``;
``r`` on the KL term is 1 in value on-policy, and its gradient makes the KL gradient the unbiased
reverse-KL gradient (DeepSeek-V3.2, arXiv 2512.02556).

TRL's ``GRPOTrainer`` stays underneath for what it does well and we cannot test here: the
training loop (accumulation, checkpoints, resume), generation with transformers or vLLM
(colocate or server, with weight sync), and DeepSpeed / FSDP placement. ``RlTrainer`` replaces
its scoring, advantages and loss through two overrides, and ``TRL_SURFACE`` lists every private
TRL name it relies on (``tests/test_rl_step.py`` checks them against the pinned TRL).
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Sequence

import torch
from trl import GRPOTrainer

from molrl.errors import MolrlError
from molrl.graders.code import CodeRewardConfig
from molrl.tasks.grade import FAILED, grade
from molrl.tasks.types import Task

log = logging.getLogger(__name__)


# --- 1. rollout ------------------------------------------------------------------------------

@dataclass
class RolloutBatch:
    """The local rows of one generation batch; rows ``g*G .. g*G+G-1`` share prompt g."""

    prompt_ids: torch.Tensor
    """[B, P] prompt token ids, left-padded."""
    prompt_mask: torch.Tensor
    """[B, P] 1 on prompt tokens, 0 on padding."""
    completion_ids: torch.Tensor
    """[B, T] completion token ids, right-padded."""
    completion_mask: torch.Tensor
    """[B, T] 1 on tokens that enter the loss: 0 on padding (and on truncated completions when
    ``mask_truncated_completions`` is set)."""
    behaviour_logps: torch.Tensor | None
    """[B, T] log-probs under the policy that sampled the batch, when it differs from the one being
    trained (several optimiser steps per generation, or vLLM); None: the trained policy sampled them."""
    sampler_weights: torch.Tensor | None
    """[B, 1] vLLM correction: pi_trainer / pi_vLLM of each completion, 0 where it exceeds its cap; None without vLLM."""
    reference_logps: torch.Tensor | None
    """[B, T] log-probs under the KL reference; None when beta = 0."""
    tasks: list[Task]
    """B tasks, the one behind each row."""
    prompts: list[str]
    """B prompt texts."""
    completions: list[str]
    """B decoded completions."""
    finished: torch.Tensor
    """[B] bool: the completion ended (EOS or pad) before ``max_completion_length``."""
    token_weights: torch.Tensor | None = None
    """[B, T] partial rollouts with ``off_policy=importance``: each token's truncated importance weight
    (1 on tokens the step's own policy sampled); None otherwise."""
    off_policy: torch.Tensor | None = None
    """[B, T] bool, partial rollouts: tokens an earlier step's policy sampled; None otherwise."""
    ids: list[str] | None = None
    """B completion ids (``<group>/<row>``) of partial rollouts; None otherwise."""
    lengths: list[int] | None = None
    """B completion lengths in tokens (EOS included)."""


# --- 2. score --------------------------------------------------------------------------------

@dataclass
class Scores:
    """What grading said about each row of a batch."""

    rewards: list[float]
    """B rewards (``failure_reward`` where grading failed)."""
    stages: list[str]
    """B stages, ``<kind>/<stage>`` (``code/all_pass``, ``math/wrong``, ``toy/scored``, ``scoring_error``)."""
    errors: list[str | None]
    """B errors of rows whose grading failed, else None."""
    grades: list[Any]
    """B ``Grade`` records (None where grading raised): what a feedback teacher is told."""


def score(tasks: Sequence[Task], completions: Sequence[str], pool: Any = None,
          code: CodeRewardConfig | None = None, failure_reward: float = 0.0) -> Scores:
    """Grade each completion against its task; a failed grading never stops training.

    A batch whose grading raises is graded again row by row; a row that still raises, or whose
    grade failed (sandbox or grader error) or is not finite, scores ``failure_reward`` and keeps
    its error (logged with its task id).
    """
    try:
        grades: list[Any] = grade(tasks, completions, pool, code)
    except Exception as err:  # noqa: BLE001 - any failure is scored, logged and survived
        log.warning("grading a batch of %d failed (%s: %s); grading row by row", len(tasks), type(err).__name__, err)
        grades = []
        for task, completion in zip(tasks, completions):
            try:
                grades += grade([task], [completion], pool, code)
            except Exception as row_err:  # noqa: BLE001
                grades.append(f"{type(row_err).__name__}: {row_err}")
    rewards, stages, errors = [], [], []
    for task, g in zip(tasks, grades):
        error = g if isinstance(g, str) else None
        if error is None and g.stage in FAILED:
            error = str(g.details.get("error", g.stage))
        elif error is None and not (isinstance(g.score, (int, float)) and math.isfinite(g.score)):
            error = f"non-finite reward {g.score!r}"
        if isinstance(g, str) or (error is not None and g.stage not in FAILED):
            stages.append("scoring_error")
        else:
            stages.append(f"{task.kind}/{g.stage}")
        if error is not None:
            log.warning("task %s scored %s: %s", task.id, failure_reward, error)
        rewards.append(failure_reward if error is not None else float(g.score))
        errors.append(error)
    return Scores(rewards, stages, errors, [None if isinstance(g, str) else g for g in grades])


# --- 3. advantages ---------------------------------------------------------------------------

def _group_stats(rewards: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row mean and sample std of its group's rewards, each [N]."""
    grouped = rewards.view(-1, group_size)  # [N / G, G]
    mean = grouped.mean(dim=1)
    std = grouped.std(dim=1) if group_size > 1 else torch.zeros_like(mean)
    return mean.repeat_interleave(group_size), std.repeat_interleave(group_size)


def grpo_advantages(rewards: torch.Tensor, mask: torch.Tensor, group_size: int) -> torch.Tensor:
    """GRPO: ``(R_i - mean) / (std + 1e-4)`` over the group, on every token of completion i: [N, T]."""
    mean, std = _group_stats(rewards, group_size)
    return ((rewards - mean) / (std + 1e-4)).unsqueeze(1) * mask


def dr_grpo_advantages(rewards: torch.Tensor, mask: torch.Tensor, group_size: int) -> torch.Tensor:
    """Dr.GRPO: ``R_i - mean`` over the group (no std division), on every token of completion i: [N, T]."""
    mean, _ = _group_stats(rewards, group_size)
    return (rewards - mean).unsqueeze(1) * mask


ADVANTAGES: dict[str, Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]] = {
    "grpo": grpo_advantages,
    "dr_grpo": dr_grpo_advantages,
    "dr_grpo_std": grpo_advantages,  # the MoL-RL authors' code: std-scaled, with Dr.GRPO's aggregation
}
"""Algorithm name -> advantages(rewards [N], mask [N, T], group size G) -> [N, T]."""

AGGREGATION: dict[str, Literal["sequence_mean", "constant", "token_mean"]] = {
    "grpo": "sequence_mean", "dr_grpo": "constant", "dr_grpo_std": "constant", "opd": "token_mean",
    "ppo": "token_mean",
}
"""Algorithm name -> how ``policy_loss`` aggregates token losses."""


def opd_advantages(teacher: torch.Tensor, reference: torch.Tensor, policy: torch.Tensor, mask: torch.Tensor,
                   lam: float) -> torch.Tensor:
    """On-policy distillation with reward extrapolation (G-OPD), per token of the student's completion: [B, T].

    ``A_t = lam * (log pi_T(y_t) - log pi_ref(y_t)) - (log pi_theta(y_t) - log pi_ref(y_t))`` from the
    teacher's, the reference's and the sampling policy's log-probs of the sampled tokens (each [B, T]).
    Its optimum is pi_theta proportional to pi_T^lam * pi_ref^(1 - lam): lam = 1 distils the teacher.
    """
    return (lam * (teacher - reference) - (policy - reference)) * mask


def token_rewards(outcome: torch.Tensor, policy: torch.Tensor, reference: torch.Tensor | None, mask: torch.Tensor,
                  beta: float) -> torch.Tensor:
    """PPO's per-token rewards [B, T]: ``-beta (log pi_theta - log pi_ref)`` on each loss token, plus the
    outcome reward ``outcome`` [B] on the last one."""
    rewards = torch.zeros_like(policy) if reference is None or beta == 0.0 else -beta * (policy - reference)
    rewards = rewards * mask
    last = (mask.cumsum(-1) == mask.sum(-1, keepdim=True)) & mask.bool()  # [B, T] the last loss token
    return rewards + last * outcome.unsqueeze(1)


def zero_std_fraction(rewards: torch.Tensor, group_size: int) -> float:
    """Fraction of rows whose group's rewards are all equal (they carry no learning signal)."""
    _, std = _group_stats(rewards, group_size)
    return torch.isclose(std, torch.zeros_like(std)).float().mean().item()


# --- 3b. the teacher of on-policy distillation ----------------------------------------------

def teacher_messages(task: Task, user: str, completion: str, grade: Any, teacher: str,
                     probe: dict[str, Any] | None = None) -> list[dict[str, str]]:
    """The conversation a teacher reads before it scores the student's ``completion`` (posed by ``user``).

    feedback: the student's attempt, then the environment's feedback on it as collection writes it (the
    output of the task's probe when it has one, test results for code, the verdict), so the teacher scores
    the same completion again having seen its outcome; reference: the task with its reference solution;
    model: the student's own prompt. ``probe`` is the sandbox result of ``task.probe`` (``exec_record``).
    """
    from molrl.collect.feedback import (ExecutionFeedback, Observation, TestFeedback, VerdictFeedback,
                                        render_feedback)

    if teacher == "feedback":
        obs = Observation(action="solution", exec=probe, grade=None if grade is None else grade.to_dict(),
                          verdict=bool(grade is not None and grade.correct), final=True)
        feedback, _ = render_feedback([ExecutionFeedback(), TestFeedback(), VerdictFeedback()], task, obs, [])
        return [{"role": "user", "content": user}, {"role": "assistant", "content": completion},
                {"role": "tool", "content": feedback}]
    if teacher == "reference":
        if not task.reference:
            raise MolrlError(f"opd.teacher=reference: task {task.id} has no reference solution; "
                             "use opd.teacher=feedback, or give the tasks a reference")
        return [{"role": "user", "content": f"{user}\n\nA reference solution:\n{task.reference}"}]
    return [{"role": "user", "content": user}]


def teacher_prefix_ids(tokenizer: Any, prefix: str, completion_ids: Sequence[int], task_id: str) -> list[int]:
    """Token ids of the teacher's ``prefix``, checked to end where the student's completion begins.

    The teacher scores exactly the student's tokens (``prefix_ids + completion_ids``). That is its own
    reading of the text only when tokenising ``prefix + completion`` does not merge tokens across the
    boundary; MolrlError otherwise, naming the task and the boundary.
    """
    prefix_ids = tokenizer(prefix, add_special_tokens=False)["input_ids"]
    text = tokenizer.decode(list(completion_ids), skip_special_tokens=False)
    whole = tokenizer(prefix + text, add_special_tokens=False)["input_ids"]
    if whole != prefix_ids + tokenizer(text, add_special_tokens=False)["input_ids"]:
        raise MolrlError(f"opd teacher context of task {task_id}: the tokenizer merges tokens across the boundary "
                         f"{prefix[-20:]!r} | {text[:20]!r}, so the teacher would not score the student's tokens; "
                         "end the teacher's context (chat template, feedback) on a token boundary")
    return prefix_ids


# --- 4. loss ---------------------------------------------------------------------------------

@dataclass
class LossSettings:
    """How token losses become the step's loss."""

    aggregation: Literal["sequence_mean", "constant", "token_mean"]
    """sequence_mean: mean over each completion's tokens, then over completions (GRPO);
    constant: sum over all tokens / (B * max_completion_length) (Dr.GRPO); token_mean: mean over all tokens."""
    max_completion_length: int
    """The constant normaliser's T_max."""
    epsilon_low: float = 0.2
    """Lower clip: the ratio is clipped below at 1 - epsilon_low."""
    epsilon_high: float = 0.2
    """Upper clip: the ratio is clipped above at 1 + epsilon_high."""
    beta: float = 0.0
    """Weight of the per-token KL to the reference (0: no reference term)."""


@dataclass
class LossStats:
    """Masked sums over the tokens of a micro-batch (detached), for logging over processes."""

    tokens: torch.Tensor
    """Number of loss tokens."""
    kl: torch.Tensor
    """Sum of the per-token KL3 to the reference (0 when beta = 0)."""
    clipped_low: torch.Tensor
    """Tokens whose ratio fell under 1 - epsilon_low with a negative advantage."""
    clipped_high: torch.Tensor
    """Tokens whose ratio rose over 1 + epsilon_high with a positive advantage."""


def policy_loss(logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, settings: LossSettings,
                behaviour_logps: torch.Tensor | None = None, reference_logps: torch.Tensor | None = None,
                sampler_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, LossStats]:
    """The clipped policy-gradient loss of one micro-batch and its statistics.

    ``logps``, ``advantages``, ``mask``, ``behaviour_logps`` and ``reference_logps`` are [B, T];
    ``behaviour_logps`` None means the batch was sampled by the policy being trained (ratio 1 in
    value, gradient of log pi); ``sampler_weights`` [B, 1] multiplies each completion's token losses.
    """
    behaviour = logps.detach() if behaviour_logps is None else behaviour_logps
    ratio = torch.exp(logps - behaviour)  # [B, T]
    clipped = torch.clamp(ratio, 1 - settings.epsilon_low, 1 + settings.epsilon_high)
    token_loss = -torch.min(ratio * advantages, clipped * advantages)  # [B, T]
    if sampler_weights is not None:
        token_loss = token_loss * sampler_weights
    kl = torch.zeros_like(logps)
    if settings.beta != 0.0:
        if reference_logps is None:
            raise ValueError("policy_loss: beta > 0 needs reference_logps")
        delta = reference_logps - logps
        kl = torch.exp(delta) - delta - 1  # [B, T], KL3 estimator of KL(pi_theta || pi_ref)
        token_loss = token_loss + settings.beta * ratio * kl  # the ratio (1 in value) makes the gradient unbiased
    if settings.aggregation == "sequence_mean":
        loss = ((token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif settings.aggregation == "constant":
        loss = (token_loss * mask).sum() / (token_loss.size(0) * settings.max_completion_length)
    elif settings.aggregation == "token_mean":
        loss = (token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    else:
        raise ValueError(f"unknown aggregation {settings.aggregation!r}; expected sequence_mean, constant or token_mean")
    with torch.no_grad():
        low = (ratio < 1 - settings.epsilon_low) & (advantages < 0)
        high = (ratio > 1 + settings.epsilon_high) & (advantages > 0)
        stats = LossStats(tokens=mask.sum().float(), kl=(kl * mask).sum(), clipped_low=(low * mask).sum().float(),
                          clipped_high=(high * mask).sum().float())
    return loss, stats


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float) -> torch.Tensor:
    """The clipped value loss, mean over loss tokens: ``0.5 max((V - R)^2, (clip(V, V_old +- clip) - R)^2)``; all [B, T]."""
    clipped = torch.clamp(values, old_values - clip, old_values + clip)
    loss = 0.5 * torch.max((values - returns) ** 2, (clipped - returns) ** 2)
    return (loss * mask).sum() / mask.sum().clamp(min=1.0)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var(R - V) / Var(R)`` over loss tokens: 1 for a perfect critic, 0 for a constant one."""
    inside = mask.bool()
    target = returns[inside]
    if target.numel() < 2 or target.var() == 0:
        return float("nan")
    return (1 - (target - values[inside]).var() / target.var()).item()


# --- the step in TRL's loop ------------------------------------------------------------------

TRL_SURFACE = {
    "methods": {  # private GRPOTrainer methods: (parameters we rely on)
        "_generate_and_score_completions": ("inputs",),  # overridden: rollout -> score -> advantages
        "_compute_loss": ("model", "inputs"),  # overridden: loss
        "_generate": ("prompts",),  # called: generation (transformers or vLLM, with weight sync)
        "_get_per_token_logps_and_entropies": ("model", "input_ids", "attention_mask", "logits_to_keep",
                                               "batch_size", "compute_entropy"),  # called: log-probs
        "_tokenize_prompts": ("prompts",),  # called: partial rollouts tokenise the prompts they start
        "_save_checkpoint": ("model", "trial"),  # overridden: partial rollouts add their buffer
        "_get_output_dir": ("trial",),  # called: where that checkpoint is
    },
    "attributes": ("_metrics", "eos_token_ids", "_tokenizer", "ref_model", "beta", "num_iterations",
                   "current_gradient_accumulation_steps", "use_vllm", "vllm_importance_sampling_correction",
                   "mask_truncated_completions", "max_completion_length", "epsilon_low", "epsilon_high",
                   "num_generations", "pad_to_multiple_of", "generation_config", "generation_kwargs", "model_wrapped",
                   "temperature"),
}
"""The private TRL names ``RlTrainer`` relies on, checked against the pinned TRL by a test."""

SAMPLER_CAP = 3.0
"""vLLM correction: a completion whose pi_trainer / pi_vLLM exceeds this is left out (TRL's default,
``sequence_mask`` at 3.0)."""


class Scorer:
    """The reward of the stage: ``score`` with its settings; also callable as a TRL reward function."""

    __name__ = "correctness"

    def __init__(self, pool: Any, code: CodeRewardConfig, failure_reward: float):
        self.pool, self.code, self.failure_reward = pool, code, failure_reward

    def score(self, tasks: Sequence[Task], completions: Sequence[str]) -> Scores:
        """``score`` of the batch with this stage's pool and settings."""
        return score(tasks, completions, self.pool, self.code, self.failure_reward)

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], task_json: Sequence[str],
                 **kwargs: Any) -> list[float]:
        """TRL's reward-function form: one reward per completion of a ``task_json`` dataset."""
        return self.score([Task.from_json(t) for t in task_json], list(completions)).rewards


class RlTrainer(GRPOTrainer):
    """TRL's loop and generation with molrl's scoring, advantages and loss (the two overrides below)."""

    def __init__(self, *args: Any, scorer: Scorer, algorithm: str, completions_path: Path | None = None,
                 opd: Any = None, ppo: Any = None, macro: Any = None, prompt_settings: dict[str, Any] | None = None,
                 rollout: Any = None, props: Any = None, **kwargs: Any):
        from collections import deque

        from molrl.rl.config import PropsSettings, RolloutSettings
        from molrl.rl.partial import RolloutState

        super().__init__(*args, reward_funcs=[scorer], **kwargs)
        self.rollout_settings = rollout or RolloutSettings()
        self.props = props or PropsSettings()
        self.partial_state = RolloutState() if self.rollout_settings.partial else None
        self._past_batches: deque = deque(maxlen=self.rollout_settings.resolved_buffer() - 1)  # earlier steps' rows
        self._behaviour_updates = 0
        if self.rollout_settings.behaviour == "props":  # phi: a second adapter on the same base, not trained by the loop
            model = self.accelerator.unwrap_model(self.model)
            if not hasattr(model, "add_adapter") or not hasattr(model, "peft_config"):
                raise MolrlError("rollout.behaviour=props needs a LoRA policy (its behaviour policy is a second adapter)")
            import copy

            cuda = [torch.cuda.current_device()] if torch.cuda.is_available() else []
            with torch.random.fork_rng(devices=cuda):  # its initial weights (overwritten from theta) draw no sample
                model.add_adapter("behaviour", copy.deepcopy(model.peft_config[model.active_adapter]))
            for name, param in model.named_parameters():
                if ".behaviour." in name:
                    param.requires_grad_(False)
        if algorithm not in AGGREGATION:
            raise ValueError(f"algorithm {algorithm!r}; expected one of {', '.join(AGGREGATION)}")
        self.scorer, self.algorithm, self.opd, self.ppo, self.macro = scorer, algorithm, opd, ppo, macro
        self.prompt_settings = prompt_settings or {}
        self.frozen: dict[str, Any] = {}
        if algorithm == "opd":
            self.frozen = {"teacher": self._load_frozen(opd.teacher_model if opd.teacher == "model" else None, "teacher"),
                           "reference": self._load_frozen(None if opd.reference == "student_base" else opd.reference,
                                                          "opd_reference")}
        self.loss_settings = LossSettings(AGGREGATION[algorithm], self.max_completion_length, self.epsilon_low,
                                          self.epsilon_high, 0.0 if algorithm == "ppo" else self.beta)  # ppo: KL in rewards
        if algorithm == "ppo":  # the critic: a linear value head on the policy's last hidden states
            model = self.accelerator.unwrap_model(self.model)
            head = torch.nn.Linear(model.config.hidden_size, 1).to(self.accelerator.device)
            torch.nn.init.zeros_(head.weight)
            torch.nn.init.zeros_(head.bias)
            model.add_module("molrl_value_head", head)  # a submodule, so the optimiser trains it
        self._macro_rng = random.Random(self.args.seed)
        self._probes: dict[str, dict[str, Any]] = {}  # task id -> its probe's sandbox result (probes are fixed code)
        self.completions_path = completions_path
        self.seen_stages: set[str] = set()

    def _mode(self) -> str:
        return "train" if self.model.training else "eval"

    def _load_frozen(self, path: Any, name: str) -> Any:
        """Frozen weights: None -> the policy with its adapter disabled; an adapter directory -> that adapter
        switched in on the policy's base (no second copy); a model directory -> a separate frozen model."""
        if path is None:
            return None
        if (Path(path) / "adapter_config.json").is_file():
            model = self.accelerator.unwrap_model(self.model)
            if not hasattr(model, "load_adapter"):
                raise MolrlError(f"opd: {path} is an adapter, but the policy has none to switch it in beside")
            model.load_adapter(str(path), adapter_name=name, is_trainable=False)
            return name
        from molrl.models import load_model

        frozen = load_model(str(path)).requires_grad_(False).train(False)  # inference mode
        return self.accelerator.prepare_model(frozen.to(self.accelerator.device), evaluation_mode=True)

    @contextmanager
    def frozen_model(self, which: str) -> Iterator[Any]:
        """The model that computes ``which`` (teacher / reference) log-probs, while the context lasts."""
        from trl.trainer.utils import use_adapter

        spec = self.frozen.get(which)
        if spec is not None and not isinstance(spec, str):
            yield spec
            return
        with use_adapter(self.accelerator.unwrap_model(self.model), adapter_name=spec):
            yield self.model

    def completion_logps(self, model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                         completion_ids: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
        """[B, T] log-probs of the completion tokens after the prompts, without grad."""
        from trl.models.utils import disable_gradient_checkpointing

        ids = torch.cat([prompt_ids, completion_ids], dim=1)  # [B, P+T]
        attention = torch.cat([prompt_mask, completion_mask], dim=1)
        size = self.args.per_device_train_batch_size if self._mode() == "train" else self.args.per_device_eval_batch_size
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            return self._get_per_token_logps_and_entropies(model, ids, attention, completion_ids.size(1),
                                                           batch_size=size)[0]

    def policy_logps(self, batch: RolloutBatch) -> torch.Tensor:
        """[B, T] log-probs of the batch under the policy that sampled it (recorded, or the current one)."""
        if batch.behaviour_logps is not None:
            return batch.behaviour_logps
        return self.completion_logps(self.model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                     batch.completion_mask)

    # 1. rollout
    def rollout(self, inputs: list[dict[str, Any]]) -> RolloutBatch:
        """Sample the completions of ``inputs`` (``prompt`` and ``task_json`` rows) and score them under the models."""
        if self.partial_state is not None and self._mode() == "train":
            return self.partial_rollout(inputs)
        prompts = [x["prompt"] for x in inputs]
        start = time.perf_counter()
        prompt_lists, completion_lists, completions, sampler_lists = self.sample(prompts)
        self._metrics[self._mode()]["time/generation_s"].append(time.perf_counter() - start)
        return self.to_batch(inputs, prompt_lists, completion_lists, completions, sampler_lists)

    def sample(self, prompts: list[str]) -> tuple[list, list, list, list]:
        """(prompt ids, completion ids, completion texts, sampler log-probs) of each row, in rows' order.

        Rows ``g*G .. g*G+G-1`` share prompt g. With ``rollout.rounds`` R > 1 each group's completions are
        sampled in R rounds of G/R; with ``rollout.behaviour=props`` the behaviour adapter, updated before
        each round on the buffer and the step's earlier rounds, samples them.
        """
        from trl.trainer.utils import use_adapter

        rounds = self.rollout_settings.resolved_rounds() if self._mode() == "train" else 1
        props = self.rollout_settings.behaviour == "props" and self._mode() == "train"
        if rounds == 1 and not props:
            prompt_lists, completion_lists, _, completions, sampler_lists, *_ = self._generate(prompts)
            return prompt_lists, completion_lists, completions, sampler_lists
        group, out = self.num_generations, [None] * len(prompts)
        per_round = group // rounds
        sampled: list[tuple[list[int], list[int]]] = []  # (prompt ids, completion ids) of the step's earlier rounds
        for r in range(rounds):
            rows = [i for i in range(len(prompts)) if r * per_round <= i % group < (r + 1) * per_round]
            if props:
                self.behaviour_update(sampled)
                model = self.accelerator.unwrap_model(self.model)
                with use_adapter(model, "behaviour"):
                    result = self._generate([prompts[i] for i in rows])
            else:
                result = self._generate([prompts[i] for i in rows])
            for j, i in enumerate(rows):
                out[i] = (result[0][j], result[1][j], result[3][j], None if result[4] is None else result[4][j])
                sampled.append((result[0][j], result[1][j]))
        prompt_lists, completion_lists, completions, sampler_lists = (list(x) for x in zip(*out))
        return prompt_lists, completion_lists, completions, (None if sampler_lists[0] is None else sampler_lists)

    def to_batch(self, inputs: list[dict[str, Any]], prompt_lists: list, completion_lists: list, completions: list[str],
                 sampler_lists: list | None, behaviour: torch.Tensor | None = None) -> RolloutBatch:
        """The ``RolloutBatch`` of sampled rows: padded tensors, behaviour log-probs (computed when the loss needs
        them, or ``behaviour`` as given), the vLLM correction and the reference log-probs."""
        from trl.trainer.utils import pad, use_adapter

        device = self.accelerator.device

        def padded(rows: list, value: float, side: str, dtype: torch.dtype | None = None) -> torch.Tensor:
            return pad([torch.tensor(r, dtype=dtype) for r in rows], padding_value=value, padding_side=side,
                       pad_to_multiple_of=self.pad_to_multiple_of).to(device)

        pad_id = self._tokenizer.pad_token_id
        prompt_ids = padded(prompt_lists, pad_id, "left")
        prompt_mask = padded([[1] * len(r) for r in prompt_lists], 0, "left")
        completion_ids = padded(completion_lists, pad_id, "right")
        completion_mask = padded([[1] * len(r) for r in completion_lists], 0, "right")
        ends = [*self.eos_token_ids, pad_id]
        finished = torch.tensor([len(r) > 0 and r[-1] in ends for r in completion_lists], device=device)
        if self.mask_truncated_completions:
            completion_mask = completion_mask * finished.unsqueeze(1).int()

        def logps_of(model: Any) -> torch.Tensor:
            return self.completion_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask)

        use_sampler = self.use_vllm and self.vllm_importance_sampling_correction
        reference = weights = None
        generate_every = self.args.steps_per_generation * self.num_iterations
        if behaviour is None and (self.args.gradient_accumulation_steps % generate_every != 0 or use_sampler):
            behaviour = logps_of(self.model)
        if use_sampler and sampler_lists is not None:
            sampler = padded([[math.nan if x is None else x for x in r] for r in sampler_lists], 0.0, "right",
                             torch.float32)
            weights = sampler_weights(behaviour, sampler, completion_mask)
        if self.beta != 0.0:
            if self.ref_model is not None:
                reference = logps_of(self.ref_model)
            else:  # the policy's adapter disabled, or its frozen "ref" adapter (see molrl.rl.reference)
                model = self.accelerator.unwrap_model(self.model)
                with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
                    reference = logps_of(self.model)
        tasks = {text: Task.from_json(text) for text in {x["task_json"] for x in inputs}}  # a group shares its task
        return RolloutBatch(prompt_ids, prompt_mask, completion_ids, completion_mask, behaviour, weights, reference,
                            [tasks[x["task_json"]] for x in inputs], [x["prompt"] for x in inputs], completions, finished,
                            lengths=[len(r) for r in completion_lists])

    def behaviour_update(self, sampled: list[tuple[list[int], list[int]]]) -> None:
        """PROPS: phi (the ``behaviour`` adapter) from theta, then minimise ``props.behaviour_objective`` on the
        buffered batches and the step's earlier rounds (``sampled``: (prompt ids, completion ids) rows),
        stopping once KL(pi_theta || pi_phi) passes ``props.target_kl``."""
        from trl.trainer.utils import use_adapter

        from molrl.rl.props import behaviour_objective

        cfg, model = self.props, self.accelerator.unwrap_model(self.model)
        policy = model.active_adapter  # outside any adapter switch: the adapter being trained
        params = dict(model.named_parameters())
        behaviour_params = [p for n, p in params.items() if ".behaviour." in n]
        if self._behaviour_updates % cfg.copy_every == 0:
            with torch.no_grad():
                for name, param in params.items():
                    if ".behaviour." in name:
                        param.copy_(params[name.replace(".behaviour.", f".{policy}.")])
        self._behaviour_updates += 1
        start, device, pad_id = time.perf_counter(), self.accelerator.device, self._tokenizer.pad_token_id
        rows: list[tuple[torch.Tensor, torch.Tensor]] = []
        for past in self._past_batches:
            for i in range(past["prompt_ids"].size(0)):
                rows.append((past["prompt_ids"][i][past["prompt_mask"][i].bool()],
                             past["completion_ids"][i][past["completion_mask"][i].bool()]))
        rows += [(torch.tensor(p), torch.tensor(c)) for p, c in sampled]  # (prompt ids, completion ids)
        rows = [r for r in rows if r[1].numel() > 0]
        metrics = self._metrics["train"]
        if cfg.update_epochs == 0 or not rows:
            return
        if not hasattr(self, "_behaviour_optimizer"):
            self._behaviour_optimizer = torch.optim.Adam(behaviour_params, lr=cfg.learning_rate, eps=1e-5)
        size = max(1, len(rows) // cfg.minibatches)
        order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(self.args.seed + self._behaviour_updates))
        kl, steps = torch.tensor(0.0), 0
        for _ in range(cfg.update_epochs):
            for first in range(0, len(rows), size):
                chosen = [rows[i] for i in order[first:first + size].tolist()]
                prompt_ids, prompt_mask = pad_rows([p for p, _ in chosen], pad_id, "left", device)
                completion_ids, mask = pad_rows([c for _, c in chosen], pad_id, "right", device)
                ids = torch.cat([prompt_ids, completion_ids], 1)
                attention = torch.cat([prompt_mask, mask], 1)
                length = completion_ids.size(1)
                with torch.no_grad():
                    theta = model(input_ids=ids, attention_mask=attention).logits[:, -length - 1:-1] / self.temperature
                with use_adapter(model, "behaviour"):
                    phi = model(input_ids=ids, attention_mask=attention).logits[:, -length - 1:-1] / self.temperature
                    gather = completion_ids.unsqueeze(-1)
                    loss, kl = behaviour_objective(torch.log_softmax(phi.float(), -1).gather(-1, gather).squeeze(-1),
                                                   torch.log_softmax(theta.float(), -1).gather(-1, gather).squeeze(-1),
                                                   phi, theta, mask.float(), cfg.clip, cfg.lambda_kl)
                    self._behaviour_optimizer.zero_grad()
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(behaviour_params, self.args.max_grad_norm)
                    self._behaviour_optimizer.step()
                steps += 1
                if kl.item() > cfg.target_kl:
                    break
            if kl.item() > cfg.target_kl:
                break
        metrics["props/kl"].append(kl.item())
        metrics["props/minibatch_steps"].append(float(steps))
        metrics["props/rows"].append(float(len(rows)))
        metrics["time/behaviour_update_s"].append(time.perf_counter() - start)

    def partial_rollout(self, inputs: list[dict[str, Any]]) -> RolloutBatch:
        """APRIL (``molrl.rl.partial``): resume the buffered groups and start new ones up to
        ``over_provision`` times the groups needed, stop once enough have finished, train on those."""
        from trl.trainer.utils import pad

        from molrl.rl.partial import (PartialCompletion, PartialGroup, choose_trained, groups_to_start, importance_weights,
                                      off_policy_mask)

        state, group = self.partial_state, self.num_generations
        step = self.state.global_step + 1
        needed = len(inputs) // group
        state.pending.extend(dict(x) for x in inputs[::group])  # one row per group (a group shares its prompt)
        fresh = groups_to_start(len(state.buffer), needed, self.rollout_settings.over_provision)
        if sum(grp.done for grp in state.buffer) >= needed:  # the buffer alone fills the step: nothing to generate
            fresh = 0
        rows = [state.pending.pop(0) for _ in range(min(fresh, len(state.pending)))]
        rows += [self._extra_prompt() for _ in range(fresh - len(rows))]
        prompt_ids = self._tokenize_prompts([r["prompt"] for r in rows])[0] if rows else []
        resumed = sum(any(c.tokens for c in g.completions) for g in state.buffer)
        flight = list(state.buffer)
        for row, ids in zip(rows, prompt_ids):
            number = state.started_groups
            state.started_groups += 1
            flight.append(PartialGroup(number, row, list(ids), [PartialCompletion(f"{number}/{r}") for r in range(group)],
                                       step))
        start = time.perf_counter()
        todo = [(g, c) for g, grp in enumerate(flight) for c, comp in enumerate(grp.completions) if not comp.finished]
        done_before = [g for g, grp in enumerate(flight) if grp.done]
        finish_order, new_tokens = done_before, {}
        if todo and len(done_before) < needed:
            finish_order, new_tokens = self.partial_generate(flight, todo, done_before, needed)
        generation_s, start = time.perf_counter() - start, time.perf_counter()
        generated = sum(len(tokens) for tokens, _ in new_tokens.values())
        for (g, c), (tokens, finished) in new_tokens.items():
            comp = flight[g].completions[c]
            comp.tokens += tokens
            comp.steps += [step] * len(tokens)
            comp.finished = finished
        trained = choose_trained(finish_order, needed)
        # one forward pass under the step's policy: behaviour log-probs of the new tokens, and the trained rows' own
        touched = sorted({*new_tokens, *((g, c) for g in trained for c in range(group))})
        touched = [(g, c) for g, c in touched if flight[g].completions[c].tokens]
        current = self._row_logps([flight[g].prompt_ids for g, _ in touched],
                                  [flight[g].completions[c].tokens for g, c in touched])
        logps = dict(zip(touched, current))
        for key, (tokens, _) in new_tokens.items():
            if tokens:
                flight[key[0]].completions[key[1]].behaviour_logps += logps[key][len(logps[key]) - len(tokens):]
        trained_set = set(trained)
        state.buffer = [grp for g, grp in enumerate(flight) if g not in trained_set]
        logps_s = time.perf_counter() - start

        chosen = [(g, c) for g in trained for c in range(group)]
        comps = [flight[g].completions[c] for g, c in chosen]
        batch_rows = [flight[g].row for g, _ in chosen]
        completion_lists = [comp.tokens for comp in comps]
        texts = self.processing_class.batch_decode(completion_lists, skip_special_tokens=True)
        current_rows = [logps.get(key, []) for key in chosen]
        device = self.accelerator.device
        current_t = pad([torch.tensor(r, dtype=torch.float32) for r in current_rows], padding_value=0.0,
                        padding_side="right", pad_to_multiple_of=self.pad_to_multiple_of).to(device)
        batch = self.to_batch(batch_rows, [flight[g].prompt_ids for g, _ in chosen], completion_lists, texts, None,
                              behaviour=current_t)
        width = batch.completion_ids.size(1)

        def tensor_of(rows: list[list], value: float, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=dtype, device=device)

        recorded = tensor_of([comp.behaviour_logps for comp in comps], 0.0, torch.float32)
        steps = tensor_of([comp.steps for comp in comps], step, torch.long)
        batch.off_policy = off_policy_mask(steps, step, batch.completion_mask)
        if self.rollout_settings.off_policy == "mask":
            batch.completion_mask = batch.completion_mask * (~batch.off_policy).int()
        else:
            batch.token_weights = importance_weights(batch.behaviour_logps, recorded, batch.off_policy,
                                                     self.rollout_settings.importance_cap)
        batch.ids = [comp.id for comp in comps]
        metrics = self._metrics["train"]
        tokens = torch.tensor([len(t) for t in completion_lists], dtype=torch.float32)
        loss_tokens = (batch.off_policy | batch.completion_mask.bool()).sum().clamp(min=1)
        metrics["time/generation_s"].append(generation_s)
        metrics["time/behaviour_logps_s"].append(logps_s)
        metrics["completions/mean_length"].append(tokens.mean().item())
        metrics["completions/max_length"].append(tokens.max().item())
        metrics["completions/clipped_ratio"].append((~batch.finished).float().mean().item())
        metrics["partial/off_policy_token_fraction"].append((batch.off_policy.sum() / loss_tokens).item())
        metrics["partial/buffer_groups"].append(float(len(state.buffer)))
        metrics["partial/buffer_tokens"].append(float(sum(len(c.tokens) for g in state.buffer for c in g.completions)))
        metrics["partial/resumed_groups"].append(float(resumed))
        metrics["partial/started_groups"].append(float(state.started_groups))
        metrics["partial/generated_tokens"].append(float(generated))
        metrics["partial/trained_tokens"].append(tokens.sum().item())
        self.state.num_input_tokens_seen += generated
        return batch

    def partial_generate(self, flight: list, todo: list[tuple[int, int]], done_before: list[int],
                         needed: int) -> tuple[list[int], dict[tuple[int, int], tuple[list[int], bool]]]:
        """Generate the unfinished completions of ``flight`` (``todo``: (group, row) pairs), each from its prompt and
        tokens so far with its remaining budget, until ``needed`` groups have finished.

        Returns the groups in the order they finished and, per (group, row), (new tokens, finished).
        """
        import copy

        from transformers import StoppingCriteriaList
        from trl.models.utils import unwrap_model_for_generation

        from molrl.rl.partial import StopWhenGroupsDone

        sequences = [flight[g].prompt_ids + flight[g].completions[c].tokens for g, c in todo]
        budgets = [self.max_completion_length - len(flight[g].completions[c].tokens) for g, c in todo]
        groups = [g for g, _ in todo]
        sizes = [len(grp.completions) for grp in flight]
        before = [sum(c.finished for c in grp.completions) for grp in flight]
        if self.use_vllm:
            return self.partial_generate_vllm(todo, sequences, budgets, groups, sizes, before, done_before, needed)
        ids, mask = pad_rows(sequences, self._tokenizer.pad_token_id, "left", self.accelerator.device)
        stopper = StopWhenGroupsDone(groups, budgets, self.eos_token_ids, ids.size(1), sizes, before, needed, done_before)
        config = copy.deepcopy(self.generation_config)
        config.max_new_tokens = max(budgets)
        with (unwrap_model_for_generation(self.model_wrapped, self.accelerator,
                                          gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                                          generation_kwargs=self.generation_kwargs,
                                          gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs) as model,
              torch.no_grad()):
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                                 stopping_criteria=StoppingCriteriaList([stopper]))
        new = out[:, ids.size(1):].tolist()
        result = {key: (new[i][:stopper.lengths[i]], stopper.done[i]) for i, key in enumerate(todo)}
        return stopper.finish_order, result

    def partial_generate_vllm(self, todo: list[tuple[int, int]], sequences: list[list[int]], budgets: list[int],
                              groups: list[int], sizes: list[int], before: list[int], done_before: list[int],
                              needed: int) -> tuple[list[int], dict[tuple[int, int], tuple[list[int], bool]]]:
        """``partial_generate`` on the colocated vLLM engine: one request per row (its prompt and tokens so far,
        its remaining budget), aborted once ``needed`` groups have finished (``molrl.rl.partial.engine_generate``)."""
        from vllm import SamplingParams

        from molrl.rl.partial import GroupTracker, engine_generate

        vllm = self.vllm_generation
        if self.state.global_step != self._last_loaded_step or getattr(vllm, "_llm_weights_sleeping", False):
            vllm.sync_weights()  # the policy's current weights (also what sleep mode discarded)
            self._last_loaded_step = self.state.global_step
        if vllm.enable_sleep_mode:
            vllm.llm.wake_up(tags=["kv_cache"])
        params = [SamplingParams(n=1, temperature=vllm.temperature, top_p=vllm.top_p, top_k=vllm.top_k,
                                 min_p=0.0 if vllm.min_p is None else vllm.min_p,
                                 repetition_penalty=vllm.repetition_penalty, max_tokens=budget,
                                 **vllm.generation_kwargs) for budget in budgets]
        tracker = GroupTracker(groups, sizes, before, needed, done_before)
        tokens = engine_generate(vllm.llm.llm_engine, sequences, params, tracker,
                                 f"molrl-{self.state.global_step}-{self.accelerator.process_index}")
        if vllm.enable_sleep_mode:
            vllm.llm.sleep(level=2)
            vllm._llm_weights_sleeping = True
        return tracker.finish_order, {key: (tokens[i], tracker.done[i]) for i, key in enumerate(todo)}

    def _row_logps(self, prompts: list[list[int]], completions: list[list[int]]) -> list[list[float]]:
        """Each row's completion-token log-probs under the current policy (one batched no-grad pass)."""
        if not prompts:
            return []
        device, pad_id = self.accelerator.device, self._tokenizer.pad_token_id
        logps = self.completion_logps(self.model, *pad_rows(prompts, pad_id, "left", device),
                                      *pad_rows(completions, pad_id, "right", device))
        return [logps[i, : len(c)].tolist() for i, c in enumerate(completions)]

    def _extra_prompt(self) -> dict[str, Any]:
        """The next prompt drawn beyond the data loader's, to over-provision (a seeded shuffle per pass)."""
        state, data = self.partial_state, self.train_dataset
        epoch, index = divmod(state.extra_draws, len(data))
        seed = (self.args.seed * 7919 + epoch) * 31 + self.accelerator.process_index  # each process its own draws
        order = random.Random(seed).sample(range(len(data)), len(data))
        state.extra_draws += 1
        row = data[order[index]]
        return {"prompt": row["prompt"], "task_json": row["task_json"]}

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """The trainer's checkpoint, plus the partial-rollout buffer (``rollout_state.json``), written first
        (and atomically): the trainer's own state file comes last, so a checkpoint that has it is whole."""
        if self.partial_state is not None:
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            folder = Path(self._get_output_dir(trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            folder.mkdir(parents=True, exist_ok=True)
            name = "rollout_state.json" if self.accelerator.num_processes == 1 else \
                f"rollout_state-{self.accelerator.process_index}.json"
            tmp = folder / f".{name}.tmp"
            tmp.write_text(json.dumps(self.partial_state.to_json()))
            tmp.replace(folder / name)
        super()._save_checkpoint(model, trial)

    def train(self, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        """TRL's training loop; a resumed run with partial rollouts gets its checkpoint's buffer back first."""
        if self.partial_state is not None and isinstance(resume_from_checkpoint, (str, Path)):
            from molrl.rl.partial import RolloutState

            name = "rollout_state.json" if self.accelerator.num_processes == 1 else \
                f"rollout_state-{self.accelerator.process_index}.json"
            path = Path(resume_from_checkpoint) / name
            if not path.is_file():
                raise MolrlError(f"{path}: missing; this checkpoint was not written by a run with rollout.partial=true "
                                 "(resume it with rollout.partial=false, or start a fresh output_dir)")
            self.partial_state = RolloutState.from_json(json.loads(path.read_text()))
        return super().train(resume_from_checkpoint, *args, **kwargs)

    # the step's first half: rollout -> score -> advantages
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        batch = self.rollout(inputs)
        start = time.perf_counter()
        scores = self.scorer.score(batch.tasks, batch.completions)
        mode = self._mode()
        self._metrics[mode]["time/reward_s"].append(time.perf_counter() - start)

        device, local = self.accelerator.device, len(batch.tasks)
        rewards = self.accelerator.gather(torch.tensor(scores.rewards, dtype=torch.float32, device=device))  # [N]
        masks = self.accelerator.gather(self.accelerator.pad_across_processes(batch.completion_mask, dim=1))  # [N, T']
        group = self.num_generations if mode == "train" else self.num_generations_eval
        # group-relative advantages: the algorithm's own, or (opd's optional outcome term) Dr.GRPO's
        outcome = ADVANTAGES[self.algorithm if self.algorithm in ADVANTAGES else "dr_grpo"](rewards, masks.float(), group)
        rows = slice(self.accelerator.process_index * local, (self.accelerator.process_index + 1) * local)
        advantages = outcome[rows, : batch.completion_ids.size(1)]  # [B, T]
        extra: dict[str, torch.Tensor] = {}
        macro = self.macro is not None and (self.algorithm == "ppo" or self.macro.pool_advantages)
        ma_ids = self.macro_ids(batch) if macro else None
        if self.algorithm == "opd":
            advantages = self.distillation_advantages(batch, scores) + self.opd.outcome_weight * advantages
        elif self.algorithm == "ppo":
            advantages, extra["returns"], extra["old_values"] = self.critic_advantages(batch, rewards[rows], ma_ids)
        if ma_ids is not None and self.macro.pool_advantages:
            from molrl.rl.macro import pool_advantages

            advantages = pool_advantages(advantages.cpu(), ma_ids.cpu(), self.macro.pooling).to(advantages.device)
        if self.algorithm in ("opd", "ppo"):  # each completion's mean token advantage
            mask = batch.completion_mask.float()
            per_completion = self.accelerator.gather((advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1.0))
        else:  # the row's advantage (also for a row masked out of the loss)
            per_completion = ADVANTAGES[self.algorithm](rewards, torch.ones_like(rewards)[:, None], group)[:, 0]
        self._log_scores(batch, scores, rewards, per_completion, group)

        out = {"prompt_ids": batch.prompt_ids, "prompt_mask": batch.prompt_mask,
               "completion_ids": batch.completion_ids, "completion_mask": batch.completion_mask,
               "advantages": advantages,
               "num_items_in_batch": self.accelerator.gather(batch.completion_mask.sum()).sum()}
        out.update(extra)
        weights = batch.sampler_weights
        if batch.token_weights is not None:  # partial rollouts: [B, T] truncated importance weights
            weights = batch.token_weights if weights is None else weights * batch.token_weights
        for key, value in (("old_per_token_logps", batch.behaviour_logps), ("ref_per_token_logps", batch.reference_logps),
                           ("importance_sampling_ratio", weights)):
            if value is not None:
                out[key] = value
        if mode == "train" and self._past_batches.maxlen:
            out = self.with_past_batches(out)
        if self.rollout_settings.sampling_error:
            self.log_sampling_error(out, group)
        return out

    def with_past_batches(self, out: dict[str, Any]) -> dict[str, Any]:
        """The step's rows after those of the last ``rollout.buffer_batches - 1`` steps (their rewards and
        advantages as scored; log-probs recomputed under the current policy, no importance correction)."""
        pad_id = self._tokenizer.pad_token_id
        keep = {k: v.detach().cpu() for k, v in out.items() if isinstance(v, torch.Tensor) and v.dim() > 0}
        batches = [*self._past_batches, keep]
        self._past_batches.append(keep)
        merged = merge_batches(batches, pad_id)
        device = self.accelerator.device
        merged = {k: v.to(device) for k, v in merged.items()}
        merged["num_items_in_batch"] = self.accelerator.gather(merged["completion_mask"].sum()).sum()
        if "old_per_token_logps" in merged:
            merged["old_per_token_logps"] = self.completion_logps(self.model, merged["prompt_ids"], merged["prompt_mask"],
                                                                  merged["completion_ids"], merged["completion_mask"])
        self._metrics["train"]["buffer/rows"].append(float(merged["completion_ids"].size(0)))
        return merged

    def log_sampling_error(self, out: dict[str, Any], group: int) -> None:
        """``sampling_error``: KL(empirical || policy) at states two or more of a prompt's completions share,
        over the rows of this update (``props.shared_state_sampling_error``), under the current policy."""
        from molrl.rl.props import shared_state_sampling_error

        logps = out.get("old_per_token_logps")
        if logps is None:  # (old_per_token_logps, when present, are the current policy's: computed at the step's start)
            logps = self.completion_logps(self.model, out["prompt_ids"], out["prompt_mask"], out["completion_ids"],
                                          out["completion_mask"])
        error, states = shared_state_sampling_error(out["completion_ids"].cpu(), logps.cpu(),
                                                    out["completion_mask"].cpu(), group)
        metrics = self._metrics[self._mode()]
        metrics["sampling_error"].append(error)
        metrics["sampling_error/shared_states"].append(float(states))

    def values(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
               completion_mask: torch.Tensor, grad: bool = False) -> torch.Tensor:
        """[B, T] the critic's value of the state before each completion token: a linear head on the policy's
        last hidden states (the trunk is shared: with ``grad`` the value loss trains the LoRA as well)."""
        model = self.accelerator.unwrap_model(self.model)
        ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention = torch.cat([prompt_mask, completion_mask], dim=1)
        with torch.set_grad_enabled(grad):
            hidden = model.get_base_model().get_decoder()(input_ids=ids, attention_mask=attention).last_hidden_state
            states = hidden[:, -completion_ids.size(1) - 1 : -1].float()  # [B, T, H]
            return model.molrl_value_head(states).squeeze(-1)

    def macro_ids(self, batch: RolloutBatch) -> torch.Tensor:
        """[B, T] macro-action index of each loss token (-1 off the mask) under ``macro.rule``."""
        from molrl.rl.macro import segment

        rule = self.macro.rule
        reference = batch.reference_logps
        if rule == "ppl" and reference is None:
            with self.frozen_model("reference") as model:
                reference = self.completion_logps(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                                  batch.completion_mask)
        rows = []
        for row in range(batch.completion_ids.size(0)):
            texts = [self._tokenizer.decode([t]) for t in batch.completion_ids[row].tolist()] if rule == "parsing" else None
            rows.append(segment(rule, batch.completion_mask[row].cpu(), rng=self._macro_rng,
                                reference_logps=None if reference is None else reference[row].cpu(), token_texts=texts))
        return torch.stack(rows).to(batch.completion_ids.device)

    def critic_advantages(self, batch: RolloutBatch, outcome: torch.Tensor,
                          ma_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(advantages, returns, old values), each [B, T]: GAE over macro actions of PPO's per-token rewards."""
        from molrl.rl.macro import macro_gae

        mask = batch.completion_mask.float()
        policy = self.policy_logps(batch)
        rewards = token_rewards(outcome, policy, batch.reference_logps, mask, self.beta)
        old = self.values(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask) * mask
        advantages, returns = torch.zeros_like(rewards), torch.zeros_like(rewards)
        for row in range(rewards.size(0)):
            advantages[row], returns[row] = macro_gae(rewards[row].cpu(), old[row].cpu(), ma_ids[row].cpu(),
                                                      self.ppo.gamma, self.ppo.lam, self.macro.pooling)
        metrics = self._metrics[self._mode()]
        if batch.reference_logps is not None:  # the KL in the rewards, per token
            metrics["kl"].append((((policy - batch.reference_logps) * mask).sum() / mask.sum().clamp(min=1.0)).item())
        metrics["critic/explained_variance"].append(explained_variance(old, returns, mask))
        metrics["critic/macro_actions_per_completion"].append(
            ((ma_ids.max(-1).values + 1).float().mean()).item())
        return advantages.to(old.device), returns.to(old.device), old

    def distillation_advantages(self, batch: RolloutBatch, scores: Scores) -> torch.Tensor:
        """[B, T] ``opd_advantages`` of the batch: the teacher scores the student's tokens in its own context."""
        from molrl.chat import render
        from molrl.tasks.prompts import CODE_INSTRUCTION, MATH_INSTRUCTION, strip_added_bos, user_message

        mask = batch.completion_mask.float()
        policy = self.policy_logps(batch)
        with self.frozen_model("reference") as model:
            reference = self.completion_logps(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                              batch.completion_mask)
        if self.opd.teacher == "model":
            prompt_ids, prompt_mask = batch.prompt_ids, batch.prompt_mask
        else:
            from trl.trainer.utils import pad

            probes = self.probe_results(batch.tasks) if self.opd.teacher == "feedback" else {}
            prefixes = []
            for row, (task, completion, grade) in enumerate(zip(batch.tasks, batch.completions, scores.grades)):
                user = user_message(task, self.prompt_settings.get("code_template", CODE_INSTRUCTION),
                                    self.prompt_settings.get("math_template", MATH_INSTRUCTION))
                messages = teacher_messages(task, user, completion, grade, self.opd.teacher, probes.get(task.id))
                text = strip_added_bos(self._tokenizer, render(self._tokenizer, messages, add_generation_prompt=True,
                                       enable_thinking=self.prompt_settings.get("enable_thinking", False)))
                tokens = batch.completion_ids[row][batch.completion_mask[row].bool()].tolist()
                prefixes.append(teacher_prefix_ids(self._tokenizer, text, tokens, task.id))
            device = self.accelerator.device
            prompt_ids = pad([torch.tensor(p) for p in prefixes], padding_value=self._tokenizer.pad_token_id,
                             padding_side="left").to(device)
            prompt_mask = pad([torch.ones(len(p), dtype=torch.long) for p in prefixes], padding_value=0,
                              padding_side="left").to(device)
        with self.frozen_model("teacher") as model:
            teacher = self.completion_logps(model, prompt_ids, prompt_mask, batch.completion_ids,
                                            batch.completion_mask)
        advantages = opd_advantages(teacher, reference, policy, mask, self.opd.lam)
        metrics, tokens = self._metrics[self._mode()], mask.sum().clamp(min=1.0)
        metrics["opd/teacher_minus_reference"].append((((teacher - reference) * mask).sum() / tokens).item())
        metrics["opd/policy_minus_reference"].append((((policy - reference) * mask).sum() / tokens).item())
        metrics["opd/advantage"].append(((advantages * mask).sum() / tokens).item())
        return advantages

    def probe_results(self, tasks: Sequence[Task]) -> dict[str, dict[str, Any]]:
        """The sandbox result of each task's probe, by task id (run once per task per run: a probe is fixed code)."""
        from molrl.collect.environment import exec_record
        from molrl.graders.code import program_for

        cache = self._probes
        todo = list({t.id: t for t in tasks if t.probe and t.id not in cache}.values())
        if todo:
            if self.scorer.pool is None:
                raise MolrlError(f"opd feedback teacher: task {todo[0].id} has a probe but the run has no sandbox pool")
            results = self.scorer.pool.run_many([program_for(t.probe, t) for t in todo])
            cache.update({t.id: exec_record(r) for t, r in zip(todo, results)})
        return {t.id: cache[t.id] for t in tasks if t.id in cache}

    # the step's second half: loss
    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model, ids, attention, inputs["completion_ids"].size(1), compute_entropy=True)
        mask = inputs["completion_mask"]
        loss, stats = policy_loss(logps, inputs["advantages"], mask, self.loss_settings,
                                  inputs.get("old_per_token_logps"), inputs.get("ref_per_token_logps"),
                                  inputs.get("importance_sampling_ratio"))
        mode = self._mode()
        if self.algorithm == "ppo":
            values = self.values(inputs["prompt_ids"], inputs["prompt_mask"], inputs["completion_ids"], mask, grad=True)
            critic = value_loss(values, inputs["old_values"], inputs["returns"], mask, self.ppo.value_clip)
            loss = loss + self.ppo.value_coef * critic
            self._metrics[mode]["critic/value_loss"].append(critic.item())
        sums = self.accelerator.reduce(torch.stack([stats.tokens, stats.kl, stats.clipped_low, stats.clipped_high,
                                                    (entropies.detach() * mask).sum()]), reduction="sum")
        tokens = sums[0].clamp(min=1.0)
        if self.loss_settings.beta != 0.0:
            self._metrics[mode]["kl"].append((sums[1] / tokens).item())
        self._metrics[mode]["entropy"].append((sums[4] / tokens).item())
        self._metrics[mode]["clip_ratio/low_mean"].append((sums[2] / tokens).item())
        self._metrics[mode]["clip_ratio/high_mean"].append((sums[3] / tokens).item())
        self._metrics[mode]["clip_ratio/region_mean"].append(((sums[2] + sums[3]) / tokens).item())
        return loss / (self.current_gradient_accumulation_steps if mode == "train" else 1.0)

    def _log_scores(self, batch: RolloutBatch, scores: Scores, rewards: torch.Tensor, per_completion: torch.Tensor,
                    group: int) -> None:
        """Reward metrics (all processes) and one completions.jsonl line per completion (main process);
        ``per_completion`` [N] is each completion's advantage (its mean over tokens for opd)."""
        from accelerate.utils import gather_object

        mode = self._mode()
        metrics = self._metrics[mode]
        name = self.scorer.__name__
        mean, std = rewards.mean().item(), rewards.std().item() if rewards.numel() > 1 else 0.0
        metrics["reward"].append(mean)
        metrics["reward_std"].append(std)
        metrics[f"rewards/{name}/mean"].append(mean)
        metrics[f"rewards/{name}/std"].append(std)
        metrics["frac_reward_zero_std"].append(zero_std_fraction(rewards, group))
        stages = gather_object(scores.stages)
        self.seen_stages.update(stages)
        for stage in sorted(self.seen_stages):  # every stage seen so far, 0 when absent, so curves have no gaps
            metrics[f"reward_stage/{stage}"].append(stages.count(stage) / len(stages))
        prompts, completions = gather_object(batch.prompts), gather_object(batch.completions)
        task_ids, errors = gather_object([t.id for t in batch.tasks]), gather_object(scores.errors)
        ids = gather_object(batch.ids) if batch.ids is not None else None
        lengths = gather_object(batch.lengths) if batch.lengths is not None else None
        off = gather_object(batch.off_policy.sum(-1).tolist()) if batch.off_policy is not None else None
        if mode != "train" or self.completions_path is None or not self.accelerator.is_main_process:
            return
        step = self.state.global_step + 1
        with open(self.completions_path, "a") as fh:
            for i, (prompt, completion) in enumerate(zip(prompts, completions)):
                record = {"step": step, "prompt": prompt, "completion": completion,
                          "rewards": {name: rewards[i].item()}, "advantage": per_completion[i].item(),
                          "task_id": task_ids[i], "reward_stage": stages[i], "reward_error": errors[i]}
                if lengths is not None:
                    record["tokens"] = lengths[i]
                if ids is not None:
                    record.update(id=ids[i], off_policy_tokens=off[i])
                fh.write(json.dumps(record, default=str) + "\n")


def pad_rows(rows: Sequence[Sequence[int] | torch.Tensor], pad_id: int, side: str,
             device: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) [B, L] of token rows padded on ``side`` (left for prompts, right for completions)."""
    from trl.trainer.utils import pad

    tensors = [torch.as_tensor(r, dtype=torch.long) for r in rows]
    return (pad(tensors, padding_value=pad_id, padding_side=side).to(device),
            pad([torch.ones_like(t) for t in tensors], padding_value=0, padding_side=side).to(device))


def merge_batches(batches: Sequence[dict[str, torch.Tensor]], pad_id: int) -> dict[str, torch.Tensor]:
    """Rows of several step batches in one: ``prompt_*`` left-padded, [B, T] tensors right-padded (ids with
    ``pad_id``, the rest with 0), [B, 1] tensors stacked; only keys every batch has."""
    from trl.trainer.utils import pad

    keys = [k for k in batches[-1] if all(k in b for b in batches)]
    merged = {}
    for key in keys:
        rows = [row for b in batches for row in b[key]]
        side = "left" if key.startswith("prompt_") else "right"
        value = pad_id if key in ("prompt_ids", "completion_ids") else 0
        merged[key] = pad(rows, padding_value=value, padding_side=side)
    return merged


def sampler_weights(trainer_logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor,
                    cap: float = SAMPLER_CAP) -> torch.Tensor:
    """[B, 1] per completion pi_trainer / pi_sampler (product over its tokens), 0 where it exceeds ``cap``.

    Corrects for vLLM sampling from slightly other probabilities than the trained model computes;
    tokens whose sampler log-prob is unknown (NaN) count as ratio 1.
    """
    diff = torch.nan_to_num((trainer_logps - sampler_logps) * mask, nan=0.0)  # [B, T]
    ratio = torch.exp(diff.sum(dim=-1, keepdim=True))  # [B, 1]
    return ratio.masked_fill(ratio > cap, 0.0)
