"""The RL step's typed contracts, and the one helper each for joining, padding and merging token rows.

A step crosses four seams (B completions of the local process, T completion tokens, N completions
over all processes, P prompt tokens):

- a rollout policy turns prompts into a ``RolloutBatch``;
- grading turns it into ``Scores`` (``molrl.rl.score``);
- an algorithm turns ``AdvantageInputs`` into ``Advantages``;
- the loss reads ``LossInputs``, which TRL's loop splits into micro-batches as a dict of tensors
  (``to_dict`` / ``from_dict``), and returns ``LossOutputs``.

``LossInputs`` carries the generation batch's counts (loss tokens, feedback tokens, completions over all
processes) as 0-dim tensors, which TRL's shuffling and splitting hand unchanged to every micro-batch, so
each term divides by the step's count of its tokens (``StepCounts``), not the micro-batch's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from trl.trainer.utils import pad

from molrl.task_types import Task


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
    ``mask_truncated_completions`` is set, and on every token of a row whose grading failed: ``leave_out``)."""
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
    attention_mask: torch.Tensor | None = None
    """[B, T] multi-turn: 1 on every completion token (sampled, feedback and template), what attention sees
    while ``completion_mask`` selects the sampled ones for the loss; None: ``completion_mask`` is both."""
    feedback_mask: torch.Tensor | None = None
    """[B, T] multi-turn: 1 on feedback tokens (the environment's text); None without feedback."""
    engine_logps: torch.Tensor | None = None
    """[B, T] the engine's log-prob of each token it sampled, at the sampling temperature (NaN: not sampled by it);
    None: no engine log-probs (transformers, partial rollouts)."""
    records: list[dict] | None = None
    """B dicts of fields each row's ``completions.jsonl`` line adds (multi-turn: the whole episode); None: none."""
    stop_reasons: list[str | None] | None = None
    """B multi-turn: why each episode ended (``molrl.episode.loop.Episode.stop_reason``); None: single-turn."""

    def attention(self) -> torch.Tensor:
        """[B, T] the completion tokens attention sees."""
        return self.completion_mask if self.attention_mask is None else self.attention_mask

    def loss_weights(self) -> torch.Tensor | None:
        """[B, T] or [B, 1] what multiplies each token's loss: the vLLM correction times partial rollouts'
        importance weights; None when neither applies."""
        weights = self.sampler_weights
        if self.token_weights is not None:
            weights = self.token_weights if weights is None else weights * self.token_weights
        return weights

    def leave_out(self, verdicts: torch.Tensor) -> None:
        """Take every row whose reward is no verdict (``verdicts`` [B] bool, False) out of the loss: none of its tokens
        is a loss token or a feedback token, so no term of any algorithm trains on it; attention sees it as before."""
        if bool(verdicts.all()):
            return
        if self.attention_mask is None:
            self.attention_mask = self.completion_mask
        keep = verdicts.to(self.completion_mask.dtype)[:, None]  # [B, 1]
        self.completion_mask = self.completion_mask * keep
        if self.feedback_mask is not None:
            self.feedback_mask = self.feedback_mask * keep.to(self.feedback_mask.dtype)


@dataclass
class TokenRoles:
    """Which completion tokens of multi-turn rows the policy sampled and which the environment wrote."""

    sampled: list[list[int]]
    """B rows, 1 per token the policy sampled (decision tokens: the policy gradient's), else 0."""
    feedback: list[list[int]]
    """B rows, 1 per feedback token (tool text as the template renders it), else 0."""
    finished: list[bool]
    """B: the episode ended by itself (an answer, or its budget of turns or solutions), not at the token limit."""


@dataclass
class AdvantageInputs:
    """What an algorithm's advantages are computed from."""

    batch: RolloutBatch
    """The local rows, with their log-probs as sampled."""
    scores: Any
    """``molrl.rl.score.Scores`` of the local rows (the grades a feedback teacher reads)."""
    rewards: torch.Tensor
    """[N] rewards of every process's rows (gathered; a failed row's is never read)."""
    verdicts: torch.Tensor
    """[N] bool, gathered: the rows whose reward is a verdict; a failed row is left out of its group's statistics
    (``molrl.rl.groups``) and has no loss token."""
    masks: torch.Tensor
    """[N, T'] completion masks of every process's rows, padded to the longest (float)."""
    group: int
    """Group size G: rows ``g*G .. g*G+G-1`` of ``rewards`` share a prompt."""
    rows: slice
    """The local rows within the N gathered ones."""


@dataclass
class Advantages:
    """An algorithm's answer: per-token advantages and what its loss terms need."""

    tokens: torch.Tensor
    """[B, T] advantage of each local completion token."""
    per_completion: torch.Tensor
    """[N] each completion's advantage as logged (its mean over tokens where advantages are per token)."""
    extra: dict[str, torch.Tensor] = field(default_factory=dict)
    """[B, ...] per-row tensors the algorithm's loss terms read back (``LossInputs.extra``)."""


@dataclass
class StepCounts:
    """What a step's token-level terms divide by: its counts over all micro-batches and processes, each [] float64."""

    tokens: torch.Tensor
    """Loss tokens (decision tokens of multi-turn rows): ``token_mean``, ``DecisionKL``, PPO's value loss."""
    feedback: torch.Tensor
    """Feedback tokens: ``FeedbackCE``."""
    completions: torch.Tensor
    """Completions whose reward is a verdict: ``sequence_mean``, and ``constant`` (times ``max_completion_length``)."""

    @classmethod
    def of(cls, completion_mask: torch.Tensor, feedback_mask: torch.Tensor | None = None,
           verdict_mask: torch.Tensor | None = None) -> StepCounts:
        """The counts of one batch's rows alone; ``completion_mask`` and ``feedback_mask`` [B, T], ``verdict_mask``
        [B, 1] (None: every row is a verdict)."""
        tokens = completion_mask.sum().double()
        feedback = tokens * 0 if feedback_mask is None else feedback_mask.sum().double()
        rows = float(completion_mask.size(0)) if verdict_mask is None else verdict_mask.sum().double()
        return cls(tokens, feedback, torch.as_tensor(rows, dtype=torch.float64, device=completion_mask.device))

    def scaled(self, factor: float) -> StepCounts:
        """Every count times ``factor`` (an optimiser step's share of a generation batch)."""
        return StepCounts(self.tokens * factor, self.feedback * factor, self.completions * factor)


@dataclass
class LossInputs:
    """A micro-batch as the loss reads it (TRL's loop slices it along rows; 0-dim counts go whole to each slice)."""

    prompt_ids: torch.Tensor
    """[B, P] prompt token ids, left-padded."""
    prompt_mask: torch.Tensor
    """[B, P] 1 on prompt tokens."""
    completion_ids: torch.Tensor
    """[B, T] completion token ids, right-padded."""
    completion_mask: torch.Tensor
    """[B, T] 1 on loss tokens."""
    advantages: torch.Tensor
    """[B, T] per-token advantages."""
    num_items_in_batch: torch.Tensor | None = None
    """[] loss tokens of the whole generation batch over all processes; None: this batch's own (``counted``)."""
    behaviour_logps: torch.Tensor | None = None
    """[B, T] log-probs under the sampling policy; None: the trained policy sampled them (ratio 1 in value)."""
    reference_logps: torch.Tensor | None = None
    """[B, T] log-probs under the KL reference; None when beta = 0."""
    weights: torch.Tensor | None = None
    """[B, T] or [B, 1] multiplies each token's loss (vLLM correction, partial rollouts' importance weights)."""
    extra: dict[str, torch.Tensor] = field(default_factory=dict)
    """[B, ...] the algorithm's own per-row tensors (``Advantages.extra``: PPO's returns and old values)."""
    attention_mask: torch.Tensor | None = None
    """[B, T] multi-turn: 1 on every completion token attention sees; None: ``completion_mask``."""
    feedback_mask: torch.Tensor | None = None
    """[B, T] multi-turn: 1 on feedback tokens; None without feedback."""
    num_feedback_in_batch: torch.Tensor | None = None
    """[] feedback tokens of the whole generation batch over all processes; None: this batch's own."""
    num_completions_in_batch: torch.Tensor | None = None
    """[] completions of the whole generation batch over all processes; None: this batch's own."""
    verdict_mask: torch.Tensor | None = None
    """[B, 1] 1 on rows whose reward is a verdict, 0 on rows left out of the loss (grading failed, their loss masks
    all 0: ``RolloutBatch.leave_out``), which no completion count includes; None: every row."""
    row_index: torch.Tensor | None = None
    """[B] long: each row's place in its generation batch, which TRL shuffles before splitting, so that what the
    loss computes per micro-batch can be put back in the batch's order (``rollout.sampling_error``); None: untracked."""

    def attention(self) -> torch.Tensor:
        """[B, T] the completion tokens attention sees."""
        return self.completion_mask if self.attention_mask is None else self.attention_mask

    def counted(self, gather: Callable[[torch.Tensor], torch.Tensor]) -> LossInputs:
        """These rows with their generation batch's counts: this process's summed over all by ``gather``
        (``accelerator.gather``, called on every process alike)."""
        local = StepCounts.of(self.completion_mask, self.feedback_mask, self.verdict_mask)
        total = gather(torch.stack([local.tokens, local.feedback, local.completions])[None]).sum(0)  # [3]
        return replace(self, num_items_in_batch=total[0], num_feedback_in_batch=total[1],
                       num_completions_in_batch=total[2])

    def counts(self) -> StepCounts:
        """The generation batch's counts (a count never set is this batch's own)."""
        local = StepCounts.of(self.completion_mask, self.feedback_mask, self.verdict_mask)
        given = (self.num_items_in_batch, self.num_feedback_in_batch, self.num_completions_in_batch)
        return StepCounts(*(mine if count is None else count.double()
                            for mine, count in zip((local.tokens, local.feedback, local.completions), given)))

    def to_dict(self) -> dict[str, torch.Tensor]:
        """The flat dict of tensors TRL's loop shuffles and splits (None fields left out)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        out.update({f"extra.{k}": v for k, v in self.extra.items()})
        return {k: v for k, v in out.items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict[str, torch.Tensor]) -> LossInputs:
        """The inverse of ``to_dict``."""
        names = {f.name for f in fields(cls)} - {"extra"}
        extra = {k[len("extra."):]: v for k, v in data.items() if k.startswith("extra.")}
        return cls(**{k: v for k, v in data.items() if k in names}, extra=extra)


@dataclass
class LossOutputs:
    """The policy loss of a micro-batch and the detached sums logged over processes."""

    loss: torch.Tensor
    """[] the micro-batch's share of the step's aggregated clipped policy-gradient loss (with the KL term when
    beta > 0): its sum divided by the step's count."""
    tokens: torch.Tensor
    """[] loss tokens."""
    kl: torch.Tensor
    """[] sum of the per-token KL3 to the reference (0 when beta = 0)."""
    clipped_low: torch.Tensor
    """[] tokens whose ratio fell under 1 - epsilon_low with a negative advantage."""
    clipped_high: torch.Tensor
    """[] tokens whose ratio rose over 1 + epsilon_high with a positive advantage."""


def join(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
         completion_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention) [B, P+T]: each left-padded prompt followed by its right-padded completion."""
    return torch.cat([prompt_ids, completion_ids], dim=1), torch.cat([prompt_mask, completion_mask], dim=1)


def pad_values(rows: Sequence[Sequence[float] | torch.Tensor], value: float, side: str, device: Any = None,
               dtype: torch.dtype | None = None, multiple_of: int | None = None,
               width: int | None = None) -> torch.Tensor:
    """[B, L] the rows padded with ``value`` on ``side`` to the longest (rounded up to ``multiple_of``),
    or to ``width`` when given (at least the longest)."""
    tensors = [torch.as_tensor(r, dtype=dtype) for r in rows]
    out = pad(tensors, padding_value=value, padding_side=side, pad_to_multiple_of=multiple_of)
    if width is not None and out.size(1) < width:
        extra = width - out.size(1)
        out = F.pad(out, (extra, 0) if side == "left" else (0, extra), value=value)
    return out.to(device)


def pad_rows(rows: Sequence[Sequence[int] | torch.Tensor], pad_id: int, side: str, device: Any = None,
             multiple_of: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) [B, L] of token rows padded on ``side`` (left for prompts, right for completions)."""
    ids = pad_values(rows, pad_id, side, device, torch.long, multiple_of)
    mask = pad_values([[1] * len(r) for r in rows], 0, side, device, torch.long, multiple_of)
    return ids, mask


def merge_batches(batches: Sequence[dict[str, torch.Tensor]], pad_id: int) -> dict[str, torch.Tensor]:
    """Rows of several step batches in one: ``prompt_*`` left-padded, [B, T] tensors right-padded (ids with
    ``pad_id``, the rest with 0), [B, 1] tensors stacked; only keys every batch has."""
    keys = [k for k in batches[-1] if all(k in b for b in batches)]
    merged = {}
    for key in keys:
        rows = [row for b in batches for row in b[key]]
        side = "left" if key.startswith("prompt_") else "right"
        value = pad_id if key in ("prompt_ids", "completion_ids") else 0
        merged[key] = pad(rows, padding_value=value, padding_side=side)
    return merged


def with_origin(records: list[dict] | None, rows: int, origin: dict[str, Any]) -> list[dict]:
    """``rows`` rows' ``completions.jsonl`` fields (``records``, None: none yet) with ``origin``'s keys added where a
    row does not already name them (a rollout policy that sampled a row under another adapter names its own)."""
    return [{**origin, **(records[i] if records else {})} for i in range(rows)]
