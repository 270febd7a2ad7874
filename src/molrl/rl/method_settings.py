"""The RL stage's method sections of its config: the algorithms' (``ppo``, ``macro``, ``opd``), the rollout
policies' (``rollout``, ``props``) and the extra loss terms' (``terms``); ``molrl.rl.config.RlConfig`` holds them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from molrl.config.ranges import Count, LearningRate, Positive, Probability, Range, Size, Weight


@dataclass
class PpoSettings:
    """PPO with a learned critic (``algorithm=ppo``): per-token KL rewards, GAE over macro actions."""

    gamma: Probability = 1.0
    """GAE discount."""
    lam: Probability = 0.95
    """GAE lambda (the MA-RLHF authors' value)."""
    value_clip: Positive = 0.2
    """The value loss clips new values to old value +- this."""
    value_coef: Weight = 0.5
    """Weight of the value loss beside the policy loss (critic=shared: both train the shared trunk)."""
    critic: Literal["separate", "shared", "group_mean"] = "separate"
    """separate: a value model of its own (its own LoRA adapter on the base and a value head, its own optimiser
    and learning rate; MA-RLHF's layout); shared: a value head on the policy's own trunk, trained with the policy
    by the same optimiser; group_mean: no learned critic, every state valued at its group's mean reward (a
    control: with gamma = lam = 1 and beta = 0 its advantages are Dr.GRPO's)."""
    critic_init: str = "policy"
    """critic=separate: its adapter starts as a copy of the policy's adapter at the start of the run (policy),
    as a fresh LoRA on the base (fresh), or from a PEFT adapter directory (e.g. a reward model's)."""
    critic_learning_rate: LearningRate | None = None
    """critic=separate: Adam learning rate of the critic (None: the policy's train.learning_rate)."""
    critic_epochs: Count = 1
    """critic=separate: passes over each step's batch when fitting the critic."""
    critic_minibatches: Count = 1
    """critic=separate: minibatches per pass."""
    critic_warmup_steps: Size = 0
    """The first this many steps train the critic only: every advantage is 0, so the policy does not move."""


@dataclass
class MacroSettings:
    """Macro actions (MA-RLHF): how tokens are grouped for credit assignment (``molrl.rl.macro``)."""

    rule: str = "token"
    """token (plain token level), fixed:N (every N tokens; the authors use 5), randomized, ppl, parsing or turn."""
    pooling: Literal["equal", "unit", "position"] = "equal"
    """How an MA's token values (and pooled advantages) are weighted: equally, the last token, or by 1/position."""
    pool_advantages: bool = False
    """Replace each token's advantage by its MA's pooled advantage (any algorithm with per-token advantages)."""


@dataclass
class OpdSettings:
    """On-policy distillation with reward extrapolation (``algorithm=opd``; G-OPD, arXiv 2602.12125).

    Per token of the student's own completion: A_t = lam * (log pi_T - log pi_ref) - (log pi_theta - log pi_ref).
    """

    lam: Annotated[float, Range(0, 1000, low_open=True)] = 1.0
    """lambda: 1 is standard on-policy distillation; above 1 extrapolates past the teacher (ExOPD: 1.25)."""
    teacher: Literal["feedback", "reference", "model"] = "feedback"
    """What the teacher reads before the student's completion: feedback: the environment's feedback on this
    very completion (a previous turn holding the completion and its test / verdict feedback in the collection
    trace format); reference: the task's reference solution; model: the student's own prompt."""
    teacher_weights: Literal["frozen", "current"] = "frozen"
    """frozen: teacher_model, or (without one) the frozen base (the policy's adapter disabled); current: the
    policy being trained, at this step (self-distillation with privileged context, as SDPO / OPSD)."""
    teacher_model: Path | None = None
    """The frozen teacher: a PEFT adapter directory on the policy's base (switched in, no second copy), or a
    full model directory (a separate frozen model, the paper's larger teacher); none: the frozen base."""
    reference: str = "student_base"
    """pi_ref: student_base (the policy's base, its adapter disabled), student_initial (the policy as the run
    starts, its starting adapter frozen: the G-OPD paper's choice), or a PEFT adapter / full model directory
    (for example the teacher's pre-RL base: the reward correction)."""
    outcome_weight: Weight = 0.0
    """Weight of the outcome reward's group-relative advantage (R - group mean) added to every token's."""


@dataclass
class RolloutSettings:
    """How a step's completions are sampled: partial rollouts (APRIL), the behaviour policy (PROPS), the buffer."""

    partial: bool = False
    """Active partial rollouts (APRIL, ``molrl.rl.rollouts.partial_state``): start more groups than a step needs, stop once
    enough have finished, keep the unfinished ones (tokens and behaviour log-probs) and resume them first."""
    over_provision: Annotated[float, Range(1, 1000)] = 2.0
    """Partial rollouts: groups in flight per group a step trains on (the APRIL authors recommend about 2)."""
    off_policy: Literal["importance", "mask"] = "importance"
    """Partial rollouts: tokens a resumed completion got from an older policy are importance-weighted
    (min(pi_old / pi_behaviour, importance_cap)) or left out of the loss (slime's mask-offpolicy)."""
    importance_cap: Positive = 2.0
    """Partial rollouts: the truncation of the off-policy tokens' importance weights."""
    behaviour: Literal["policy", "props"] = "policy"
    """policy: sample from the policy being trained; props: from a behaviour adapter (PROPS, ``props``) that
    lowers the probability of what the buffered data over-samples (experimental)."""
    rounds: Count | None = None
    """Each step samples its groups' completions in this many rounds (G split evenly); PROPS updates its
    behaviour adapter before each round. None: 2 with behaviour=props, else 1."""
    buffer_batches: Count | None = None
    """The policy trains on the last this many steps' batches (outcome-advantage algorithms only).
    None: 2 with behaviour=props (the PROPS authors' b), else 1."""
    merged_generation: bool = False
    """Generate with transformers from the policy's LoRA adapter merged into its base weights (``molrl.engines.lora_merge``):
    a decoding step then costs the base model's, not the base's plus two small matmuls per adapted layer; the base
    weights are copied back exactly afterwards (one copy of the adapted weights is held while generating). Not
    with behaviour=props (it samples from a second adapter) or engine=vllm (the engine holds its own weights)."""
    max_mismatch_kl: Annotated[float, Range(0, 1000)] = 0.05
    """Stop the run after a step whose ``rollout/mismatch_kl`` (KL(engine || trainer) per sampled token, k3, over
    the step: ``molrl.rl.mismatch``) passes this; 0: no limit (a mismatch that is not finite, as when a sampled
    token has no usable engine log-prob, stops the run whatever this says). Measured on the in-process engine:
    1e-13 healthy in fp32, 1e-4 in bf16, 1.3 with a stale adapter; peers report 0.01-0.03 for bf16 on GPUs
    (benchmarks/RESULTS.md, "The mismatch gate")."""
    max_staleness: Annotated[int, Range(0, 1)] = 0
    """0: each step samples its rows with the adapter it trains (synchronous); 1: one-step-off overlap (engine=
    vllm_server only, ``molrl.rl.rollouts.overlap``): the next step's rows are generated on the servers while this
    step trains, sampled with this step's adapter, and trained on by the next with ``tis_cap``'s correction."""
    tis_cap: Annotated[float, Range(1, 1000)] = 2.0
    """max_staleness=1: truncated importance sampling of the rows sampled one step earlier: each token's loss is
    weighted by min(pi_trainer / pi_engine, tis_cap) (trainer: the step's policy before its update; engine: the
    servers' processed log-prob under the adapter that sampled it)."""
    sampling_error: bool = True
    """Log ``sampling_error``: KL(empirical || policy) at the states two or more of a prompt's completions share,
    over the data of each update, from the loss's own log-probs (or, where those come after an update, from the
    behaviour log-probs of the step's start): no forward pass of its own."""
    sampling_error_split: Annotated[float, Range(0, 1000)] | None = None
    """Also log the sampling error split by the policy's entropy at the state, below and above this many nats
    (``sampling_error/low_entropy``, ``sampling_error/high_entropy``); from the loss's entropies, or one more
    forward pass where the error reads behaviour log-probs (several optimiser steps per generation, vLLM, partial)."""

    def policy(self, max_turns: int) -> str:
        """The rollout policy's name in ``molrl.rl.rollouts.ROLLOUTS`` for episodes of ``max_turns`` turns at most
        (``episode.max_turns``): turns, partial, props, overlap or sync."""
        by_setting = "partial" if self.partial else "props" if self.behaviour == "props" else \
            "overlap" if self.max_staleness == 1 else "sync"
        return "turns" if max_turns > 1 else by_setting

    def resolved_rounds(self) -> int:
        """Sampling rounds per step (``rounds``, or its default)."""
        return self.rounds if self.rounds is not None else (2 if self.behaviour == "props" else 1)

    def resolved_buffer(self) -> int:
        """Steps' batches the policy trains on (``buffer_batches``, or its default)."""
        return self.buffer_batches if self.buffer_batches is not None else (2 if self.behaviour == "props" else 1)


@dataclass
class TermSettings:
    """MoL's loss terms beside the policy gradient (``molrl.rl.terms``), under MoL's ``loss`` names, each normalised
    over its own tokens."""

    ce_weight: Weight = 0.0
    """Weight of the CE on feedback tokens of multi-turn completions (MoL's feedback term; ECHO's authors use
    0.01-0.05); 0: none."""
    kl_weight: Weight = 0.0
    """Weight of the full-vocabulary KL(policy || base) on decision tokens (MoL's decision term; base: adapter
    disabled); 0: none."""


@dataclass
class PropsSettings:
    """PROPS (arXiv 2311.08290): the behaviour adapter's update, defaults of the authors."""

    clip: Positive = 0.3
    """epsilon of the clipped behaviour objective max(rho, clip(rho, 1 - eps, 1 + eps)), rho = pi_phi / pi_theta."""
    lambda_kl: Weight = 0.3
    """Weight of KL(pi_theta || pi_phi) (full vocabulary, per buffered state) in the behaviour objective."""
    target_kl: Positive = 0.05
    """The update stops once the mean KL(pi_theta || pi_phi) passes this (delta; the authors' discrete-action
    scripts use 0.01)."""
    learning_rate: LearningRate = 1e-3
    """Adam learning rate of the behaviour adapter."""
    update_epochs: Size = 16
    """Passes over the buffer per behaviour update (0: phi stays a copy of theta, sampling is on-policy)."""
    minibatches: Count = 4
    """Minibatches per pass."""
    copy_every: Count = 1
    """phi is re-copied from theta every this many behaviour updates (the authors' code: every update)."""
    min_entropy: Annotated[float, Range(0, 1000)] = 0.0
    """States where pi_theta's entropy is below this (nats) are left out of the behaviour objective, so
    near-deterministic states (format tokens) keep phi = theta. A deviation from the paper, whose states all
    have spread action distributions; 0 (the default) keeps every state, as the paper does."""
