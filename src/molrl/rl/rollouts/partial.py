"""Active partial rollouts (APRIL, arXiv 2509.18521): no step waits for the longest completion.

A step resumes the buffered groups and starts new ones up to ``rollout.over_provision`` times the groups
it trains on, stops generating once enough whole groups have finished, trains on those and keeps the
rest (tokens and behaviour log-probs) for the next step. The rule's types and pure functions are
``molrl.rl.rollouts.partial_state``; this module is the policy: generation with transformers (a stopping criterion) or
the colocated vLLM engine (aborted requests), the off-policy treatment of resumed tokens, the buffer's
checkpoint (``rollout_state.json``) and what is left at the end (``rollout_buffer.json``).
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path
from typing import Any

import torch

from molrl.errors import MolrlError
from molrl.rl.batch import RolloutBatch, pad_rows, pad_values
from molrl.rl.config import RlConfig
from molrl.rl.rollouts.partial_state import (
    GroupTracker,
    PartialCompletion,
    PartialGroup,
    RolloutState,
    StopWhenGroupsDone,
    choose_trained,
    groups_to_start,
    importance_weights,
    off_policy_mask,
)
from molrl.rl.rollouts.sync import Synchronous
from molrl.records.writes import write_text

Generated = tuple[list[int], dict[tuple[int, int], tuple[list[int], bool]]]
"""(groups in the order they finished, (group, row) -> (new tokens, finished))."""


class Partial(Synchronous):
    """Over-provisioned groups; a step trains on the first to finish and buffers the rest."""

    def __init__(self, trainer: Any, cfg: RlConfig, training: bool = True):
        super().__init__(trainer, cfg, training)
        self.state = RolloutState()
        self.engine_logps: dict[tuple[int, int], list[float]] = {}  # the engine's log-probs of the step's new tokens

    def rollout(self, inputs: list[dict[str, Any]]) -> RolloutBatch:
        """Resume the buffered groups, start new ones, stop once enough have finished, train on those."""
        trainer, state, settings = self.trainer, self.state, self.cfg.rollout
        group, step = self.cfg.sampling.n, trainer.state.global_step + 1
        needed = len(inputs) // group
        state.pending.extend(dict(x) for x in inputs[::group])  # one row per group (a group shares its prompt)
        fresh = groups_to_start(len(state.buffer), needed, settings.over_provision)
        if sum(grp.done for grp in state.buffer) >= needed:  # the buffer alone fills the step: nothing to generate
            fresh = 0
        rows = [state.pending.pop(0) for _ in range(min(fresh, len(state.pending)))]
        rows += [self.extra_prompt() for _ in range(fresh - len(rows))]
        prompt_ids = trainer._tokenize_prompts([r["prompt"] for r in rows])[0] if rows else []
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
            finish_order, new_tokens = self.generate(flight, todo, done_before, needed)
        generation_s, start = time.perf_counter() - start, time.perf_counter()
        for (g, c), (tokens, finished) in new_tokens.items():
            comp = flight[g].completions[c]
            comp.tokens += tokens
            comp.steps += [step] * len(tokens)
            comp.finished = finished
        trained = choose_trained(finish_order, needed)
        logps = self.record_behaviour(flight, new_tokens, trained)
        if trainer.engine is not None:
            self.log_engine_mismatch(new_tokens, logps)
        trained_set = set(trained)
        state.buffer = [grp for g, grp in enumerate(flight) if g not in trained_set]
        logps_s = time.perf_counter() - start
        batch = self.trained_batch(flight, trained, logps, step)
        self.log(batch, generation_s, logps_s, resumed, sum(len(tokens) for tokens, _ in new_tokens.values()))
        return batch

    def record_behaviour(self, flight: list[PartialGroup], new_tokens: dict, trained: list[int]) -> dict:
        """One forward pass under the step's policy: the behaviour log-probs of the new tokens (appended to their
        completions), and the trained rows' own; returns (group, row) -> log-probs."""
        group = self.cfg.sampling.n
        touched = sorted({*new_tokens, *((g, c) for g in trained for c in range(group))})
        touched = [(g, c) for g, c in touched if flight[g].completions[c].tokens]
        current = self.row_logps([flight[g].prompt_ids for g, _ in touched],
                                 [flight[g].completions[c].tokens for g, c in touched])
        logps = dict(zip(touched, current))
        for key, (tokens, _) in new_tokens.items():
            if tokens:
                flight[key[0]].completions[key[1]].behaviour_logps += logps[key][len(logps[key]) - len(tokens):]
        return logps

    def trained_batch(self, flight: list[PartialGroup], trained: list[int], logps: dict, step: int) -> RolloutBatch:
        """The ``RolloutBatch`` of the trained groups, with resumed tokens importance-weighted or masked."""
        trainer, settings = self.trainer, self.cfg.rollout
        chosen = [(g, c) for g in trained for c in range(self.cfg.sampling.n)]
        comps = [flight[g].completions[c] for g, c in chosen]
        completion_lists = [comp.tokens for comp in comps]
        texts = trainer.processing_class.batch_decode(completion_lists, skip_special_tokens=True)
        device, multiple = trainer.accelerator.device, trainer.pad_to_multiple_of
        current = pad_values([logps.get(key, []) for key in chosen], 0.0, "right", device, torch.float32, multiple)
        batch = self.to_batch([flight[g].row for g, _ in chosen], [flight[g].prompt_ids for g, _ in chosen],
                              completion_lists, texts, None, behaviour=current)
        width = batch.completion_ids.size(1)
        recorded = pad_values([comp.behaviour_logps for comp in comps], 0.0, "right", device, torch.float32, width=width)
        steps = pad_values([comp.steps for comp in comps], step, "right", device, torch.long, width=width)
        batch.off_policy = off_policy_mask(steps, step, batch.completion_mask)
        if settings.off_policy == "mask":
            batch.completion_mask = batch.completion_mask * (~batch.off_policy).int()
        else:
            batch.token_weights = importance_weights(batch.behaviour_logps, recorded, batch.off_policy,
                                                     settings.importance_cap)
        batch.ids = [comp.id for comp in comps]
        return batch

    def log(self, batch: RolloutBatch, generation_s: float, logps_s: float, resumed: int, generated: int) -> None:
        """The step's partial-rollout metrics."""
        trainer, state = self.trainer, self.state
        metrics = trainer.metrics()
        tokens = torch.tensor(batch.lengths, dtype=torch.float32)
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
        trainer.state.num_input_tokens_seen += generated

    def log_engine_mismatch(self, new_tokens: dict, logps: dict) -> None:
        """The step's engine-trainer mismatch (``Synchronous.log_mismatch``) over the tokens the engine sampled in
        it: the engine's log-probs of them against the step's policy's (``record_behaviour``); resumed tokens, sampled
        under an earlier policy, are the off-policy treatment's, not the engine's mismatch."""
        keys = [key for key, (tokens, _) in new_tokens.items() if tokens]
        new = [len(new_tokens[key][0]) for key in keys]
        engine = self.engine_logps
        device = self.trainer.accelerator.device
        trainer_logps = pad_values([logps[k][len(logps[k]) - n:] for k, n in zip(keys, new)] or [[]], 0.0, "right",
                                   device, torch.float32)  # [B, T]
        engine_logps = pad_values([engine.get(k, [])[:n] for k, n in zip(keys, new)] or [[]], math.nan, "right",
                                  device, torch.float32, width=trainer_logps.size(1))  # [B, T], NaN: unknown
        mask = pad_values([[1] * n for n in new] or [[]], 0, "right", device, torch.long)  # [B, T]
        self.log_mismatch(trainer_logps, engine_logps, mask)

    def generate(self, flight: list[PartialGroup], todo: list[tuple[int, int]], done_before: list[int],
                 needed: int) -> Generated:
        """Generate the unfinished completions of ``flight`` (``todo``: (group, row) pairs), each from its prompt and
        tokens so far with its remaining budget, until ``needed`` groups have finished."""
        trainer = self.trainer
        sequences = [flight[g].prompt_ids + flight[g].completions[c].tokens for g, c in todo]
        budgets = [self.cfg.sampling.max_new_tokens - len(flight[g].completions[c].tokens) for g, c in todo]
        groups = [g for g, _ in todo]
        sizes = [len(grp.completions) for grp in flight]
        before = [sum(c.finished for c in grp.completions) for grp in flight]
        if trainer.engine is not None:
            tracker = GroupTracker(groups, sizes, before, needed, done_before)
            engine_logps: list[list[float]] = []
            tokens = self.generate_vllm(sequences, budgets, tracker, engine_logps)
            self.engine_logps = dict(zip(todo, engine_logps))
            return tracker.finish_order, {key: (tokens[i], tracker.done[i]) for i, key in enumerate(todo)}
        new, stopper = self.continue_rows(sequences, max(budgets), lambda width: StopWhenGroupsDone(
            groups, budgets, trainer.eos_token_ids, width, sizes, before, needed, done_before))
        return stopper.finish_order, {key: (new[i][:stopper.lengths[i]], stopper.done[i]) for i, key in enumerate(todo)}

    def generate_vllm(self, sequences: list[list[int]], budgets: list[int], tracker: GroupTracker,
                      logps: list[list[float]] | None = None) -> list[list[int]]:
        """``generate`` on the policy's engine (``molrl.rl.engine``, its adapter sent after each optimiser step): one
        request per row (its prompt and tokens so far, its remaining budget), aborted once enough groups have
        finished (the engine's ``generate_partial``); ``logps`` receives the engine's log-probs."""
        trainer = self.trainer
        engine = trainer.engine
        engine.sync(trainer)
        params = [engine.params(trainer, budget) for budget in budgets]
        return engine.generate_partial(trainer, sequences, params, tracker, logps)

    def row_logps(self, prompts: list[list[int]], completions: list[list[int]]) -> list[list[float]]:
        """Each row's completion-token log-probs under the current policy (one batched no-grad pass)."""
        if not prompts:
            return []
        trainer = self.trainer
        device, pad_id = trainer.accelerator.device, trainer.processing_class.pad_token_id
        logps = trainer.logprobs.completion(trainer.model, *pad_rows(prompts, pad_id, "left", device),
                                         *pad_rows(completions, pad_id, "right", device))
        return [logps[i, : len(c)].float().tolist() for i, c in enumerate(completions)]

    def extra_prompt(self) -> dict[str, Any]:
        """The next prompt drawn beyond the data loader's, to over-provision (a seeded shuffle per pass)."""
        trainer, state = self.trainer, self.state
        data = trainer.train_dataset
        epoch, index = divmod(state.extra_draws, len(data))
        seed = (self.cfg.train.seed * 7919 + epoch) * 31 + trainer.accelerator.process_index  # each process its own draws
        order = random.Random(seed).sample(range(len(data)), len(data))
        state.extra_draws += 1
        row = data[order[index]]
        return {"prompt": row["prompt"], "task_json": row["task_json"]}

    # state
    def state_file(self, folder: Path) -> Path:
        """The buffer's file in a checkpoint folder (one per process under several processes)."""
        trainer = self.trainer
        name = "rollout_state.json" if trainer.accelerator.num_processes == 1 else \
            f"rollout_state-{trainer.accelerator.process_index}.json"
        return Path(folder) / name

    def save_state(self, folder: Path) -> None:
        """The buffer, written atomically (the trainer's own state file comes after it, so a checkpoint that has
        that file is whole)."""
        write_text(self.state_file(folder), json.dumps(self.state.to_json()))

    def load_state(self, checkpoint: Path) -> None:
        path = self.state_file(checkpoint)
        if not path.is_file():
            raise MolrlError(f"{path}: missing; this checkpoint was not written by a run with rollout.partial=true "
                             "(resume it with rollout.partial=false, or start a fresh output_dir)")
        self.state = RolloutState.from_json(json.loads(path.read_text()))

    def save_final(self, out: Path) -> None:
        """What partial rollouts left unfinished: ``rollout_buffer.json``."""
        if self.trainer.accelerator.is_main_process:
            write_text(Path(out) / "rollout_buffer.json", json.dumps(self.state.to_json()))
