"""One-step-off overlap (``rollout.max_staleness: 1``, ``engine: vllm_server``): the next step's rows are generated on
the engine servers while this step trains.

At step t (the trainer holding weights a_t) the policy takes the rows it submitted at step t-1, sampled on the servers
under adapter a_{t-1} while step t-1 trained, and submits step t+1's prompts under a_t before it scores and trains
(the loop's batches are read one ahead: ``Lookahead``). A row is trained on one optimiser step after the adapter that
sampled it: ``rollout/staleness`` 1, and each ``completions.jsonl`` row records ``engine_adapter``, the adapter it was
sampled under, ``engine_adapter_step``, the optimiser step whose weights that adapter holds, and its ``staleness``.

The loss corrects for it with truncated importance sampling (``molrl.rl.loss.truncated_importance_weights``): each
token's loss is weighted by ``min(pi_trainer / pi_engine, rollout.tis_cap)``, where pi_trainer is the trainer's
log-prob at the sampling temperature under a_t, the weights the step starts from (the loss's old log-probs, the
ratio's denominator), and pi_engine the servers' processed log-prob under a_{t-1}. It replaces the synchronous path's
per-completion engine correction, and is normalised over the step with the loss it multiplies. The mismatch gate
compares the engine with the adapter that sampled (a_{t-1}'s weights, kept in memory from the submit), so
``rollout/mismatch_kl`` stays the engine's error, not the policy's one-step move.

A step with nothing pending samples synchronously, exactly as ``Synchronous`` does (staleness 0): the first step, the
first of each pass over the data (an epoch's last batch has no next one to read ahead), and the first after a resume:
a killed run's pending rows are not checkpointed; they are dropped and the step regenerates them. The last step
submits nothing.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from molrl.rl.batch import RolloutBatch
from molrl.rl.loss import truncated_importance_weights
from molrl.rl.rollouts.sync import Synchronous


class Lookahead:
    """The training loop's batch iterator, readable one batch ahead (``RlTrainer.get_batch_samples`` reads through
    it): ``peek`` gives the next step's generation batch without taking it."""

    def __init__(self) -> None:
        self.source: Iterator | None = None
        self.ahead: list[Any] = []

    def wrap(self, iterator: Iterator) -> "Lookahead":
        """Read from ``iterator`` (an epoch's; a new one drops what was read ahead of the old)."""
        if iterator is not self and iterator is not self.source:
            self.source, self.ahead = iterator, []
        return self

    def __iter__(self) -> "Lookahead":
        return self

    def __next__(self) -> Any:
        if self.ahead:
            return self.ahead.pop(0)
        if self.source is None:
            raise StopIteration
        return next(self.source)

    def peek(self) -> Any | None:
        """The next batch, left to be taken; None at the epoch's end."""
        if not self.ahead and self.source is not None:
            try:
                self.ahead.append(next(self.source))
            except StopIteration:
                return None
        return self.ahead[0] if self.ahead else None


@dataclass
class Pending:
    """A step's rows submitted to the servers a step early."""

    prompts: list[str]
    """The rows' prompt texts, in the order of the batch they were submitted for."""
    prompt_ids: list[list[int]]
    """Their token ids."""
    futures: list[Any]
    """One reply future per row (``ServerPool.submit``)."""
    adapter: str
    """The adapter name they are sampled under."""
    weights: dict[str, torch.Tensor]
    """The trained parameters of that adapter (to measure the engine's mismatch against)."""
    cancel: threading.Event = field(default_factory=threading.Event)
    """Set to stop the requests (the rows are dropped)."""


def trained_state(model: Any) -> dict[str, torch.Tensor]:
    """A copy of ``model``'s trainable parameters by name (a LoRA adapter's: a few MB)."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


@contextmanager
def parameters_as(model: Any, state: dict[str, torch.Tensor]) -> Iterator[None]:
    """``model``'s parameters named in ``state`` set to it while the context lasts, then put back exactly."""
    params = dict(model.named_parameters())
    saved = {name: params[name].detach().clone() for name in state}
    with torch.no_grad():
        for name, value in state.items():
            params[name].copy_(value)
    try:
        yield
    finally:
        with torch.no_grad():
            for name, value in saved.items():
                params[name].copy_(value)


class OneStepOff(Synchronous):
    """Single-turn groups sampled one step ahead on the engine servers, trained on with TIS."""

    def __init__(self, trainer: Any, cfg: Any, training: bool = True):
        super().__init__(trainer, cfg, training)
        self.pending: Pending | None = None
        self.ready: Pending | None = None  # this step's rows, taken from ``pending``
        self.sampling_state: dict[str, torch.Tensor] | None = None  # the weights that sampled ``ready``

    def rollout(self, inputs: list[dict[str, Any]]) -> RolloutBatch:
        """The step's rows: those submitted a step early for these prompts, or (none pending) sampled now; the next
        step's are submitted once these are in."""
        trainer = self.trainer
        pending, self.pending = self.pending, None
        if pending is not None and pending.prompts != [x["prompt"] for x in inputs]:
            pending.cancel.set()  # not the batch the loop gave: dropped (it cannot happen while the loop reads ahead)
            pending = None
        self.ready = pending
        self.sampling_state = pending.weights if pending is not None else None
        adapter = pending.adapter if pending is not None else None
        try:
            batch = super().rollout(inputs)
        finally:
            self.ready, self.sampling_state = None, None
        staleness = 0 if pending is None else 1
        if pending is not None:
            self.correct(batch)
        trainer.metrics()["rollout/staleness"].append(float(staleness))
        batch.records = [{**(batch.records[i] if batch.records else {}), **trainer.engine.sampled_under(adapter),
                          "staleness": staleness} for i in range(len(batch.prompts))]
        return batch

    def generate_round(self, prompts: list[str], sampled: list[tuple[list[int], list[int]]]) -> tuple:
        """TRL's generation of the step's ``prompts`` with the pending replies as the engine's (or sampled now);
        then the next step's prompts are submitted."""
        trainer, ready = self.trainer, self.ready
        if ready is None:
            result = super().generate_round(prompts, sampled)
            self.submit_next()
            return result
        replies = trainer.engine.pool.gather(ready.futures)  # sampled while the last step trained
        self.submit_next()

        def taken(_prompts: list, _trainer: Any) -> dict[str, list]:
            return {"prompt_ids": ready.prompt_ids, "completion_ids": [r.ids for r in replies],
                    "logprobs": [r.logps for r in replies]}

        engine_rollout, trainer.rollout_func = trainer.rollout_func, taken
        try:
            return trainer._generate(prompts)  # TRL's decoding and length metrics, as on the synchronous path
        finally:
            trainer.rollout_func = engine_rollout

    def submit_next(self) -> None:
        """Submit the next step's rows under the current adapter (synced first), unless this is the last step or the
        epoch's last batch."""
        trainer = self.trainer
        following = trainer.lookahead.peek()
        if following is None or trainer.state.global_step + 1 >= trainer.state.max_steps:
            return
        engine, prompts = trainer.engine, [x["prompt"] for x in following]
        prompt_ids = trainer._tokenize_prompts(prompts)[0]
        cancel = threading.Event()
        futures = engine.submit(trainer, prompt_ids, engine.params(trainer, self.cfg.sampling.max_new_tokens), cancel)
        model = trainer.accelerator.unwrap_model(trainer.model)
        self.pending = Pending(prompts, prompt_ids, futures, engine.lora, trained_state(model), cancel)

    def sampler_policy_logps(self, logps_of: Any, current: torch.Tensor) -> torch.Tensor:
        """[B, T] the trainer's log-probs under the adapter the engine sampled with: the one it held when the rows
        were submitted."""
        if self.sampling_state is None:
            return current
        with parameters_as(self.trainer.accelerator.unwrap_model(self.trainer.model), self.sampling_state):
            return logps_of(self.trainer.model)

    def correct(self, batch: RolloutBatch) -> None:
        """Weight each sampled token's loss by its TIS weight (``rollout.tis_cap``) and log the weights' mean, max and
        the fraction at the cap over the step's sampled tokens."""
        trainer, cap = self.trainer, self.cfg.rollout.tis_cap
        weights = truncated_importance_weights(batch.behaviour_logps, batch.engine_logps, cap)  # [B, T]
        batch.sampler_weights, batch.token_weights = None, weights
        mask = batch.completion_mask.bool()  # [B, T]
        sums = torch.stack([weights[mask].sum(), (weights[mask] >= cap).sum().float(), mask.sum().float()])
        sums = trainer.accelerator.reduce(sums.double(), reduction="sum")
        top = trainer.accelerator.gather((weights[mask].max() if mask.any() else weights.new_zeros(())).reshape(1))
        tokens = sums[2].clamp(min=1.0)
        metrics = trainer.metrics()
        metrics["rollout/tis_weight_mean"].append((sums[0] / tokens).item())
        metrics["rollout/tis_capped_fraction"].append((sums[1] / tokens).item())
        metrics["rollout/tis_weight_max"].append(top.max().item())
