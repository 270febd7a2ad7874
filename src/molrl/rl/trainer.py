"""One RL step, top to bottom: rollout -> score -> advantages -> loss (``RlTrainer.step``, ``RlTrainer._compute_loss``).

A step samples G completions for each of a batch of prompts, grades them in the sandbox, turns the
grades into per-token advantages and takes a clipped policy-gradient step on them. Each arrow crosses a
typed contract (``molrl.rl.batch``):

1. the rollout policy (``molrl.rl.rollouts``: sync, partial, props): prompts -> ``RolloutBatch``;
2. ``molrl.rl.score``: (tasks, completions) -> ``Scores`` through the grading dispatch evaluation uses; a row whose
   grading failed (a sandbox error, a grader error) is no verdict: it keeps no loss token and stays out of its
   group's statistics, and a run whose sandbox fails past ``sandbox.max_error_rate`` of its rows stops;
3. the algorithm (``molrl.rl.algorithms``: grpo, dr_grpo, dr_grpo_std, opd, ppo):
   ``AdvantageInputs`` -> ``Advantages``;
4. ``molrl.rl.loss.policy_loss`` on ``LossInputs``, plus the algorithm's own terms (PPO's value loss) and the
   configured ones (``molrl.rl.terms``: CE on feedback tokens, KL to the base on decision tokens), each divided by
   the optimiser step's count of its own tokens (``step_counts``) so that neither accumulation nor processes
   change what a step trains.

Simplifications: the trainer never asks which algorithm or rollout policy it holds; a step's rows are
scored once, when sampled (a buffered row keeps its advantage); the KL term is per token on sampled
tokens (KL3), not a full-vocabulary KL; evaluation inside TRL's loop samples synchronously.

TRL's ``GRPOTrainer`` stays underneath for what it does well and we cannot test here: the training
loop (when generation runs, micro-batch splitting, accumulation, when the optimiser steps,
checkpoints, resume), generation with transformers or vLLM (colocate or server, with weight sync),
its log-prob computation, and DeepSpeed / FSDP placement. ``RlTrainer`` replaces its scoring,
advantages and loss through two overrides; ``TRL_SURFACE`` lists every private TRL name molrl relies
on (``tests/test_rl_step.py`` checks them against the pinned TRL).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer

from molrl.errors import MolrlError
from molrl.rl.algorithms import ALGORITHMS
from molrl.rl.batch import AdvantageInputs, LossInputs, LossOutputs, RolloutBatch, StepCounts, join, with_origin
from molrl.rl.config import RlConfig
from molrl.rl.logprobs import LogProbs
from molrl.rl.loss import PolicyLossSettings, policy_loss, policy_normaliser
from molrl.rl.mismatch import MismatchGate, token_logp_records
from molrl.rl.rollouts import ROLLOUTS, Synchronous
from molrl.rl.rollouts.overlap import Lookahead
from molrl.rl.score import Scorer, log_scores
from molrl.rl.terms import CompletionLogits, build_terms
from molrl.rl.watch import RunWatch, WatchSettings
from molrl.sandbox.errors import ErrorCount

TRL_SURFACE = {
    "methods": {  # private GRPOTrainer methods: (parameters we rely on)
        "_generate_and_score_completions": ("inputs",),  # overridden: rollout -> score -> advantages
        "_compute_loss": ("model", "inputs"),  # overridden: loss
        "_generate": ("prompts",),  # called: generation (transformers or vLLM, with weight sync)
        "_get_per_token_logps_and_entropies": ("model", "input_ids", "attention_mask", "logits_to_keep",
                                               "batch_size", "compute_entropy"),  # called: log-probs
        "_tokenize_prompts": ("prompts",),  # overridden: a prompt's ids are its row's prompt_ids (content as text)
        "_save_checkpoint": ("model", "trial"),  # overridden: a rollout policy's state goes in first
        "_get_output_dir": ("trial",),  # called: where that checkpoint is
        "get_batch_samples": ("epoch_iterator", "num_batches", "device"),  # overridden: read through the lookahead
    },
    "attributes": ("_metrics", "eos_token_ids", "ref_model", "current_gradient_accumulation_steps", "use_vllm",
                   "vllm_importance_sampling_correction", "pad_to_multiple_of", "generation_config",
                   "generation_kwargs", "model_wrapped", "rollout_func"),
}
"""The private TRL names molrl relies on, checked against the pinned TRL by a test. The run's sampling and loss
settings are not among them: molrl's code reads those from ``RlConfig`` (``RlTrainer.cfg``), and TRL gets its own
copies from ``molrl.rl.run.trl_args``."""


def prompt_ids_by_text(dataset: Any) -> dict[str, list[int]]:
    """Each row's ``prompt_ids`` by its ``prompt`` text (empty when the dataset has no such column)."""
    if dataset is None or "prompt_ids" not in getattr(dataset, "column_names", ()):
        return {}
    return dict(zip(dataset["prompt"], dataset["prompt_ids"]))


class RlTrainer(GRPOTrainer):
    """TRL's loop and generation with molrl's rollout policy, scoring, algorithm and loss."""

    def __init__(self, *args: Any, scorer: Scorer, config: RlConfig, completions_path: Path | None = None,
                 made_by: dict[str, Any] | None = None, **kwargs: Any):
        super().__init__(*args, reward_funcs=[scorer], **kwargs)
        self.cfg = config  # what molrl's code reads of the run's settings (TRL's copies are for TRL's own code)
        self.scorer, self.completions_path, self.seen_stages = scorer, completions_path, set()
        self.made_by = made_by  # what each completions.jsonl row records of its making (score.completions_made_by)
        self.sandbox_errors = ErrorCount(config.sandbox.max_error_rate, "rl")  # the run's rows the sandbox failed
        self.logprobs = LogProbs(self)  # every sampling log-prob, at the one temperature
        self.engine: Any = None  # a policy engine once attached (molrl.rl.engine: engine=vllm or vllm_server)
        self.lookahead = Lookahead()  # the loop's batches, one readable ahead (rollout.max_staleness=1 submits it)
        self.mismatch_gate = MismatchGate(config.rollout.max_mismatch_kl)  # after the metrics file's callback
        self.add_callback(self.mismatch_gate)
        self.add_callback(RunWatch(WatchSettings.from_config(config)))  # what a step's metrics say goes wrong, once
        self.prompt_ids = prompt_ids_by_text(self.train_dataset)
        # the rollout policy first: PROPS adds its adapter before an algorithm loads frozen ones
        self.rollouts = {"train": ROLLOUTS[config.rollout.policy(config.episode.max_turns)](self, config),
                         "eval": Synchronous(self, config, training=False)}
        self.algorithm = ALGORITHMS[config.algorithm](self, config)
        self.terms = build_terms(config.loss)
        self.loss_settings = PolicyLossSettings(self.algorithm.aggregation, config.sampling.max_new_tokens,
                                                config.epsilon, config.epsilon,
                                                config.beta if self.algorithm.kl_in_loss else 0.0)

    # the step's first half: rollout -> score -> advantages
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return self.step(inputs).to_dict()

    def step(self, inputs: list[dict[str, Any]]) -> LossInputs:
        """Sample ``inputs`` (``prompt`` and ``task_json`` rows), score the completions, and return what the loss
        trains on: every row whose reward is a verdict (a row whose grading failed is logged, never trained on)."""
        rollout, mode = self.rollouts[self._mode()], self._mode()
        batch = rollout.rollout(inputs)  # 1. rollout
        if self.engine is not None:  # each row names the engine's adapter that sampled it (its newest tokens)
            batch.records = with_origin(batch.records, len(batch.prompts), self.engine.sampled_under())
        start = time.perf_counter()
        scores = self.scorer.score(batch.tasks, batch.completions, batch.stop_reasons)  # 2. score
        self.metrics()["time/reward_s"].append(time.perf_counter() - start)
        device, local, rank = self.accelerator.device, len(batch.tasks), self.accelerator.process_index
        verdicts = torch.tensor(scores.verdicts(), dtype=torch.bool, device=device)  # [B]
        batch.leave_out(verdicts)  # a failed row has no loss token: no term of any algorithm trains on it
        rewards = self.accelerator.gather(torch.tensor(scores.rewards, dtype=torch.float32, device=device))  # [N]
        judged = self.accelerator.gather(verdicts.int()).bool()  # [N]
        masks = self.accelerator.gather(self.accelerator.pad_across_processes(batch.completion_mask, dim=1))  # [N, T']
        advantages = self.algorithm.advantages(AdvantageInputs(  # 3. advantages
            batch, scores, rewards, judged, masks.float(), self.group_size(), slice(rank * local, (rank + 1) * local)))
        main = mode == "train" and self.accelerator.is_main_process
        if mode == "train" and self.cfg.completion_logps:  # completions.jsonl: each row's tokens and both log-probs
            batch.records = token_logp_records(batch.completion_ids, batch.lengths, self.policy_logps(batch),
                                               batch.engine_logps, batch.records)
        excluded = log_scores(self.metrics(), self.seen_stages, self.scorer.__name__, batch, scores, rewards, judged,
                              advantages.per_completion, self.group_size(), gather_object,
                              self.completions_path if main else None, self.state.global_step + 1, self.made_by)
        self.sandbox_errors.add(excluded.count("sandbox_error"), len(excluded))  # past sandbox.max_error_rate: stop
        return rollout.finish(LossInputs(  # 4. what the loss reads, with the generation batch's counts
            batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask, advantages.tokens,
            behaviour_logps=batch.behaviour_logps, reference_logps=batch.reference_logps, weights=batch.loss_weights(),
            extra=advantages.extra, attention_mask=batch.attention_mask, feedback_mask=batch.feedback_mask,
            verdict_mask=verdicts.float()[:, None]).counted(self.accelerator.gather))

    # the step's second half: loss
    def _compute_loss(self, model: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        batch = LossInputs.from_dict(inputs)
        counts, settings = self.step_counts(batch), self.loss_settings
        ids, attention = join(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.attention())
        self.algorithm.before_loss_forward()  # PPO's shared critic reads its values off this forward
        logps, entropies = self.logprobs.of(  # [B, T] at the sampling temperature
            model, ids, attention, batch.completion_ids.size(1), entropies=True)
        self.rollouts[self._mode()].record_loss_logps(batch, logps.detach(), entropies.detach())  # sampling error
        out = policy_loss(logps, batch, settings,
                          policy_normaliser(settings.aggregation, counts, settings.max_completion_length))
        loss, shares = out.loss, {}
        for name, (weight, term) in self.algorithm.loss_terms(batch, counts).items():  # PPO's value loss
            loss, shares[name] = loss + weight * term, term.detach()
        logits = CompletionLogits(self, model, batch)  # temperature 1: one forward shared by the terms
        for term in self.terms:  # CE on feedback, KL to the base on decisions: each over its own tokens
            value = term.loss(logits, batch, counts)
            loss, shares[term.metric] = loss + term.weight * value, value.detach()
        self.log_step_means(out, (entropies.detach().float() * batch.completion_mask).sum(), counts, shares)
        # DDP (and DeepSpeed, FSDP) average gradients over processes; each process's loss is its share of the step's
        return loss * self.accelerator.num_processes

    def step_counts(self, batch: LossInputs) -> StepCounts:
        """The counts of the optimiser step ``batch`` is a micro-batch of (``StepCounts``).

        TRL's rule (its ``dapo`` loss): a generation batch feeds ``steps_per_generation`` micro-batches per process
        and an optimiser step takes ``current_gradient_accumulation_steps`` of them, so the step's counts are the
        generation batch's times accumulation steps / ``steps_per_generation``: exactly the generation batch's when
        they are equal (molrl's runs, each of ``num_iterations`` passes one step), their mean share otherwise. In
        evaluation a batch is neither split nor accumulated: its generation batch's.
        """
        counts = batch.counts()
        if self._mode() != "train":
            return counts
        return counts.scaled(self.current_gradient_accumulation_steps / self.args.steps_per_generation)

    def log_step_means(self, out: LossOutputs, entropy: torch.Tensor, counts: StepCounts,
                       shares: dict[str, torch.Tensor]) -> None:
        """Log this micro-batch's part of the step's means (summed over processes, times the step's micro-batches,
        whose values TRL averages): the KL, entropy, clip ratios and each term's ``shares``; ``entropy`` is the
        micro-batch's sum over loss tokens."""
        metrics, parts = self.metrics(), (self.current_gradient_accumulation_steps if self._mode() == "train" else 1)
        sums = self.accelerator.reduce(torch.stack([out.kl, out.clipped_low, out.clipped_high, entropy.float(),
                                                    *shares.values()]).float(), reduction="sum") * parts
        tokens = counts.tokens.float().clamp(min=1.0)
        if self.loss_settings.beta != 0.0:
            metrics["kl"].append((sums[0] / tokens).item())
        metrics["entropy"].append((sums[3] / tokens).item())
        metrics["clip_ratio/low_mean"].append((sums[1] / tokens).item())
        metrics["clip_ratio/high_mean"].append((sums[2] / tokens).item())
        metrics["clip_ratio/region_mean"].append(((sums[1] + sums[2]) / tokens).item())
        for name, total in zip(shares, sums[4:]):
            metrics[name].append(total.item())

    # the loop's batches, read through the lookahead (the next step's prompts are known while this one trains)
    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> tuple[list, Any]:
        return super().get_batch_samples(self.lookahead.wrap(epoch_iterator), num_batches, device)

    # prompts: ids encoded by molrl (a task's text never becomes control tokens), not TRL's re-tokenisation
    def _tokenize_prompts(self, prompts: list) -> tuple[list[list[int]], None, dict]:
        missing = [p for p in prompts if p not in self.prompt_ids]
        if missing:
            raise MolrlError(f"RL prompt {str(missing[0])[:60]!r}... has no prompt_ids in the dataset; build the rows "
                             "with molrl.rl.data.build_prompt_rows")
        return [list(self.prompt_ids[p]) for p in prompts], None, {}

    # what the pieces read
    def _mode(self) -> str:
        return "train" if self.model.training else "eval"

    def metrics(self) -> dict[str, list[float]]:
        """This mode's metric lists (averaged and logged by TRL at each logging step)."""
        return self._metrics[self._mode()]

    def group_size(self) -> int:
        """G: completions per prompt (``sampling.n``; evaluation inside TRL's loop samples as many)."""
        return self.cfg.sampling.n

    def policy_logps(self, batch: RolloutBatch) -> torch.Tensor:
        """[B, T] log-probs of the batch under the policy that sampled it (recorded, or the current one)."""
        if batch.behaviour_logps is not None:
            return batch.behaviour_logps
        return self.logprobs.completion(self.model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                        batch.attention())

    def frozen_adapters(self) -> tuple[str, ...]:
        """Adapters beside the trained one: TRL's ``ref``, the algorithm's and the rollout policy's."""
        return ("ref", *self.algorithm.frozen_adapters(), *self.rollouts["train"].adapters())

    # checkpoints: the rollout policy's and the algorithm's state travel with the trainer's
    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        folder = Path(self._get_output_dir(trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        self.rollouts["train"].save_state(folder)  # before the trainer's state file, which marks a whole checkpoint
        self.algorithm.save_state(folder)
        super()._save_checkpoint(model, trial)

    def train(self, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        """TRL's training loop; a resumed run gets its rollout policy's and algorithm's state back first."""
        if isinstance(resume_from_checkpoint, (str, Path)):
            self.rollouts["train"].load_state(Path(resume_from_checkpoint))
            self.algorithm.load_state(Path(resume_from_checkpoint))
        return super().train(resume_from_checkpoint, *args, **kwargs)
