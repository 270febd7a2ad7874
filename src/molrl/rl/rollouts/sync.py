"""Synchronous rollouts, and what every rollout policy is: prompts in, a ``RolloutBatch`` out, with its own
state and checkpoint.

A rollout policy subclasses ``Synchronous`` and is entered by name in ``molrl.rl.rollouts.ROLLOUTS``.
Shared here: sampling a step's groups in rounds (``rollout.rounds``; a subclass may act before each
round), turning sampled token rows into a ``RolloutBatch`` (padding, the behaviour, vLLM-correction and
reference log-probs), the training buffer of earlier steps' rows (``rollout.buffer_batches``), and the
sampling-error metric (from the loss's own log-probs where they are the sampling policy's: ``WaitingError``).
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from transformers import StoppingCriteriaList
from trl.models.utils import unwrap_model_for_generation
from trl.trainer.utils import use_adapter

from molrl.engines.lora_merge import merged_lora
from molrl.rl.batch import LossInputs, RolloutBatch, TokenRoles, merge_batches, pad_rows, pad_values
from molrl.rl.config import RlConfig
from molrl.rl.loss import sampler_weights
from molrl.rl.mismatch import MismatchSums, means, step_sums
from molrl.rl.rollouts.props_math import sampling_error_by_entropy, shared_state_sampling_error
from molrl.task_types import Task


@dataclass
class WaitingError:
    """An update's rows whose sampling error waits for the loss's log-probs of them, which come a micro-batch at a
    time in TRL's shuffled order (``Synchronous.record_loss_logps``)."""

    completion_ids: torch.Tensor
    """[B, T] the update's completion ids, in the generation batch's order (rows of a group together)."""
    completion_mask: torch.Tensor
    """[B, T] 1 on its loss tokens."""
    group: int
    """G: rows ``g*G .. g*G+G-1`` share a prompt."""
    logps: torch.Tensor | None = None
    """[B, T] the loss's log-probs (at the sampling temperature), filled in row by row."""
    entropies: torch.Tensor | None = None
    """[B, T] the policy's entropy at each state, filled in alongside."""
    seen: set[int] = field(default_factory=set)
    """The rows filled in so far."""

    def add(self, rows: torch.Tensor, logps: torch.Tensor, entropies: torch.Tensor) -> bool:
        """Put a micro-batch's ``logps`` and ``entropies`` [b, T] at its ``rows`` [b]; True once every row is in."""
        if self.logps is None or self.entropies is None:
            self.logps = logps.new_zeros(self.completion_ids.shape)  # [B, T]
            self.entropies = entropies.new_zeros(self.completion_ids.shape)  # [B, T]
        self.logps[rows] = logps
        self.entropies[rows] = entropies
        self.seen.update(rows.tolist())
        return len(self.seen) == self.completion_ids.size(0)


class Synchronous:
    """Synchronous sampling: every completion of the step, from the policy being trained, in ``rounds`` rounds."""

    def __init__(self, trainer: Any, cfg: RlConfig, training: bool = True):
        self.trainer, self.cfg = trainer, cfg
        self.rounds = cfg.rollout.resolved_rounds() if training else 1
        self.past: deque = deque(maxlen=(cfg.rollout.resolved_buffer() if training else 1) - 1)  # earlier steps' rows
        self.waiting: WaitingError | None = None  # the last update's rows, until the loss has read them all

    # the policy
    def rollout(self, inputs: list[dict[str, Any]]) -> RolloutBatch:
        """Sample the completions of ``inputs`` (``prompt`` and ``task_json`` rows) and score them under the models."""
        prompts = [x["prompt"] for x in inputs]
        start = time.perf_counter()
        prompt_lists, completion_lists, completions, sampler_lists = self.sample(prompts)
        self.trainer.metrics()["time/generation_s"].append(time.perf_counter() - start)
        return self.to_batch(inputs, prompt_lists, completion_lists, completions, sampler_lists)

    def sample(self, prompts: list[str]) -> tuple[list, list, list, list | None]:
        """(prompt ids, completion ids, completion texts, sampler log-probs) of each row, in rows' order.

        Rows ``g*G .. g*G+G-1`` share prompt g; each group's completions are sampled in ``rounds`` rounds of G/R.
        """
        group, out = self.cfg.sampling.n, [None] * len(prompts)
        per_round = group // self.rounds
        sampled: list[tuple[list[int], list[int]]] = []  # (prompt ids, completion ids) of the step's earlier rounds
        for r in range(self.rounds):
            rows = [i for i in range(len(prompts)) if r * per_round <= i % group < (r + 1) * per_round]
            result = self.generate_round([prompts[i] for i in rows], sampled)
            for j, i in enumerate(rows):
                out[i] = (result[0][j], result[1][j], result[3][j], None if result[4] is None else result[4][j])
                sampled.append((result[0][j], result[1][j]))
        prompt_lists, completion_lists, completions, sampler_lists = (list(x) for x in zip(*out))
        return prompt_lists, completion_lists, completions, (None if sampler_lists[0] is None else sampler_lists)

    def generate_round(self, prompts: list[str], sampled: list[tuple[list[int], list[int]]]) -> tuple:
        """TRL's generation of one round's ``prompts`` (``sampled``: the step's earlier rounds' rows)."""
        with self.generation_weights():
            return self.trainer._generate(prompts)

    def generation_weights(self) -> Any:
        """The context generation runs in: the policy's adapter merged (``rollout.merged_generation``) or as is."""
        if not self.cfg.rollout.merged_generation:
            return contextlib.nullcontext()
        return merged_lora(self.trainer.accelerator.unwrap_model(self.trainer.model))

    def continue_rows(self, sequences: list[list[int]], max_new_tokens: int,
                      stopper_for: Callable[[int], Any]) -> tuple[list[list[int]], Any]:
        """The new tokens of each token row continued with the trainer's generation settings (token ids in, token
        ids out), under the stopping criterion ``stopper_for(padded width)``; returns them (untrimmed) and it."""
        trainer = self.trainer
        ids, mask = pad_rows(sequences, trainer.processing_class.pad_token_id, "left", trainer.accelerator.device)
        stopper = stopper_for(ids.size(1))
        config = copy.deepcopy(trainer.generation_config)
        config.max_new_tokens = max_new_tokens
        with (unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                          gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
                                          generation_kwargs=trainer.generation_kwargs,
                                          gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs)
              as model, torch.no_grad(), self.generation_weights()):
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                                 stopping_criteria=StoppingCriteriaList([stopper]))
        return out[:, ids.size(1):].tolist(), stopper

    # the batch
    def to_batch(self, inputs: list[dict[str, Any]], prompt_lists: list, completion_lists: list, completions: list[str],
                 sampler_lists: list | None, behaviour: torch.Tensor | None = None,
                 roles: TokenRoles | None = None) -> RolloutBatch:
        """The ``RolloutBatch`` of sampled rows: padded tensors, behaviour log-probs (computed when the loss needs
        them, or ``behaviour`` as given), the vLLM correction and the reference log-probs; ``roles``: which tokens
        of multi-turn rows were sampled and which are feedback (None: every completion token was sampled)."""
        trainer = self.trainer
        device, pad_id, multiple = trainer.accelerator.device, trainer.processing_class.pad_token_id, \
            trainer.pad_to_multiple_of
        prompt_ids, prompt_mask = pad_rows(prompt_lists, pad_id, "left", device, multiple)
        completion_ids, completion_mask = pad_rows(completion_lists, pad_id, "right", device, multiple)
        attention = feedback = None
        if roles is None:
            ends = [*trainer.eos_token_ids, pad_id]
            finished = torch.tensor([len(r) > 0 and r[-1] in ends for r in completion_lists], device=device)
        else:
            attention, finished = completion_mask, torch.tensor(roles.finished, device=device)
            completion_mask = pad_values(roles.sampled, 0, "right", device, torch.long, multiple)  # [B, T]
            feedback = pad_values(roles.feedback, 0, "right", device, torch.long, multiple)  # [B, T]
        if self.cfg.mask_truncated_completions:
            completion_mask = completion_mask * finished.unsqueeze(1).int()

        def logps_of(model: Any) -> torch.Tensor:
            return trainer.logprobs.completion(model, prompt_ids, prompt_mask, completion_ids,
                                            completion_mask if attention is None else attention)

        on_engine = sampler_lists is not None and trainer.engine is not None
        reference = weights = sampler = None
        generate_every = trainer.args.steps_per_generation * self.cfg.num_iterations
        if behaviour is None and (trainer.args.gradient_accumulation_steps % generate_every != 0 or on_engine):
            behaviour = logps_of(trainer.model)
        if on_engine:  # the engine's log-probs of what it sampled against the trainer's, under the same policy
            sampler = pad_values([[math.nan if x is None else x for x in r] for r in sampler_lists], 0.0, "right",
                                 device, torch.float32, multiple)
            self.log_mismatch(self.sampler_policy_logps(logps_of, behaviour), sampler, completion_mask)
            if trainer.vllm_importance_sampling_correction:
                weights = sampler_weights(behaviour, sampler, completion_mask)
        if self.cfg.beta != 0.0:
            if trainer.ref_model is not None:
                reference = logps_of(trainer.ref_model)
            else:  # the policy's adapter disabled, or its frozen "ref" adapter (see molrl.rl.reference)
                model = trainer.accelerator.unwrap_model(trainer.model)
                with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
                    reference = logps_of(trainer.model)
        tasks = {text: Task.from_json(text) for text in {x["task_json"] for x in inputs}}  # a group shares its task
        return RolloutBatch(prompt_ids, prompt_mask, completion_ids, completion_mask, behaviour, weights, reference,
                            [tasks[x["task_json"]] for x in inputs], [x["prompt"] for x in inputs], completions, finished,
                            lengths=[len(r) for r in completion_lists], attention_mask=attention,
                            feedback_mask=feedback, engine_logps=sampler)

    def sampler_policy_logps(self, logps_of: Callable[[Any], torch.Tensor], current: torch.Tensor) -> torch.Tensor:
        """[B, T] the trainer's log-probs under the weights the engine sampled the batch with (``logps_of(model)``
        computes them for a model): here the current policy's, ``current``."""
        return current

    def log_mismatch(self, trainer_logps: torch.Tensor, engine_logps: torch.Tensor, mask: torch.Tensor) -> None:
        """Log the step's engine-trainer mismatch (``molrl.rl.mismatch``: ``rollout/mismatch_kl``,
        ``rollout/engine_logp_gap``, ``rollout/is_ess``) over the sampled tokens of ``mask`` on every process, from
        the engine's log-probs ``engine_logps`` and the trainer's ``trainer_logps`` [B, T] at the sampling
        temperature; a training step's mismatch goes to the trainer's ``MismatchGate``."""
        trainer = self.trainer
        sums = step_sums(trainer_logps, engine_logps, mask).as_tensor(trainer.accelerator.device)
        step = means(MismatchSums.of_tensor(trainer.accelerator.reduce(sums, reduction="sum")))
        metrics = trainer.metrics()
        metrics["rollout/mismatch_kl"].append(step.kl)
        metrics["rollout/engine_logp_gap"].append(step.gap)
        metrics["rollout/is_ess"].append(step.ess)
        if trainer.model.training:
            trainer.mismatch_gate.observe(trainer.state.global_step + 1, step)

    # what the loss trains on
    def finish(self, inputs: LossInputs) -> LossInputs:
        """The rows the loss trains on: the step's, after the buffer's (``rollout.buffer_batches``), with the
        sampling error of them logged (``rollout.sampling_error``): now, or once the loss has read every row."""
        if self.past.maxlen:
            inputs = self.with_past_batches(inputs)
        if self.cfg.rollout.sampling_error:
            self.waiting = None
            if self.error_from_loss(inputs):
                self.waiting = WaitingError(inputs.completion_ids, inputs.completion_mask, self.trainer.group_size())
                inputs.row_index = torch.arange(inputs.completion_ids.size(0), device=inputs.completion_ids.device)
            else:
                self.log_sampling_error(inputs)
        return inputs

    def with_past_batches(self, inputs: LossInputs) -> LossInputs:
        """The step's rows after those of the last ``rollout.buffer_batches - 1`` steps (their rewards and
        advantages as scored; log-probs recomputed under the current policy, no importance correction)."""
        trainer = self.trainer
        keep = {k: v.detach().cpu() for k, v in inputs.to_dict().items() if v.dim() > 0}
        batches = [*self.past, keep]
        self.past.append(keep)
        device = trainer.accelerator.device
        merged = {k: v.to(device) for k, v in merge_batches(batches, trainer.processing_class.pad_token_id).items()}
        out = LossInputs.from_dict(merged).counted(trainer.accelerator.gather)  # the merged rows' counts
        if out.behaviour_logps is not None:
            out.behaviour_logps = trainer.logprobs.completion(trainer.model, out.prompt_ids, out.prompt_mask,
                                                           out.completion_ids, out.attention())
        trainer.metrics()["buffer/rows"].append(float(out.completion_ids.size(0)))
        return out

    def error_from_loss(self, inputs: LossInputs) -> bool:
        """Whether the loss's own log-probs give this update's sampling error: it has no behaviour log-probs (so
        each optimiser step takes whole generation batches, and the loss reads every row under the policy that
        sampled it, before that policy steps) and TRL's split of it into micro-batches drops no row."""
        trainer = self.trainer
        parts = trainer.args.steps_per_generation if trainer.model.training else 1  # evaluation: one whole batch
        return inputs.behaviour_logps is None and inputs.completion_ids.size(0) % parts == 0

    def record_loss_logps(self, batch: LossInputs, logps: torch.Tensor, entropies: torch.Tensor) -> None:
        """Take the loss's detached log-probs and entropies [b, T] of a micro-batch (rows ``batch.row_index`` of the
        update ``finish`` returned); once every row's are in, log the update's sampling error from them."""
        waiting = self.waiting
        if waiting is None or batch.row_index is None or not waiting.add(batch.row_index, logps, entropies):
            return
        self.waiting = None
        self.log_error(waiting.completion_ids, waiting.completion_mask, waiting.group, waiting.logps, waiting.entropies)

    def log_sampling_error(self, inputs: LossInputs) -> None:
        """The sampling error of this update's rows, now: from its behaviour log-probs (the current policy's,
        computed at the step's start), else from a no-grad forward pass of the current policy."""
        trainer = self.trainer
        logps = inputs.behaviour_logps
        if logps is None:
            logps = trainer.logprobs.completion(trainer.model, inputs.prompt_ids, inputs.prompt_mask, inputs.completion_ids,
                                             inputs.attention())
        entropies = None
        if self.cfg.rollout.sampling_error_split is not None:
            entropies = trainer.logprobs.completion(trainer.model, inputs.prompt_ids, inputs.prompt_mask,
                                                     inputs.completion_ids, inputs.completion_mask, entropies=True)
        self.log_error(inputs.completion_ids, inputs.completion_mask, trainer.group_size(), logps, entropies)

    def log_error(self, completion_ids: torch.Tensor, completion_mask: torch.Tensor, group: int, logps: torch.Tensor,
                  entropies: torch.Tensor | None) -> None:
        """``sampling_error``: KL(empirical || policy) at states two or more of a prompt's completions share,
        over the rows of an update (``props.shared_state_sampling_error``), and its split by the entropy at the state
        (``rollout.sampling_error_split``); ``logps`` and ``entropies`` [B, T] are the current policy's."""
        ids, mask, logps = completion_ids.cpu(), completion_mask.cpu(), logps.cpu()
        error, states = shared_state_sampling_error(ids, logps, mask, group)
        metrics = self.trainer.metrics()
        metrics["sampling_error"].append(error)
        metrics["sampling_error/shared_states"].append(float(states))
        threshold = self.cfg.rollout.sampling_error_split
        if threshold is not None and entropies is not None:
            split = sampling_error_by_entropy(ids, logps, entropies.cpu(), mask, group, threshold)
            for name, (value, count) in split.items():
                metrics[f"sampling_error/{name}_entropy"].append(value)
                metrics[f"sampling_error/{name}_entropy_states"].append(float(count))

    # state
    def adapters(self) -> tuple[str, ...]:
        """Adapter names this policy added beside the trained one (dropped before the policy is saved)."""
        return ()

    def save_state(self, folder: Path) -> None:
        """Write this policy's state into checkpoint ``folder`` (before the trainer's own files)."""

    def load_state(self, checkpoint: Path) -> None:
        """Read this policy's state back from a checkpoint a run resumes from."""

    def save_final(self, out: Path) -> None:
        """Write what the run leaves of this policy's state into ``out`` at its end."""
