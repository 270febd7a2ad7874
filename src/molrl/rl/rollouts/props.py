"""PROPS (arXiv 2311.08290): sample from a behaviour policy that corrects what the buffered data over-samples.

The behaviour policy phi is a second LoRA adapter on the policy's base, never trained by the loop. Before
each round of a step's sampling it is copied from theta (every ``props.copy_every`` updates) and moved to
minimise the clipped behaviour objective (``molrl.rl.rollouts.props_math.behaviour_objective``) on the buffered steps'
rows and the step's earlier rounds, until KL(pi_theta || pi_phi) passes ``props.target_kl``; then it samples
the round. The training buffer (``rollout.buffer_batches``, 2 by default here) is ``Synchronous``'s.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
from trl.trainer.utils import use_adapter

from molrl.errors import MolrlError
from molrl.rl.batch import join, pad_rows
from molrl.rl.config import RlConfig
from molrl.rl.rollouts.props_math import behaviour_objective
from molrl.rl.rollouts.sync import Synchronous

ADAPTER = "behaviour"
"""The behaviour adapter's name."""


class Props(Synchronous):
    """Rounds sampled by the behaviour adapter, updated before each round."""

    def __init__(self, trainer: Any, cfg: RlConfig, training: bool = True):
        super().__init__(trainer, cfg, training)
        model = trainer.accelerator.unwrap_model(trainer.model)
        if not hasattr(model, "add_adapter") or not hasattr(model, "peft_config"):
            raise MolrlError("rollout.behaviour=props needs a LoRA policy (its behaviour policy is a second adapter)")
        cuda = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=cuda):  # its initial weights (overwritten from theta) draw no sample
            model.add_adapter(ADAPTER, copy.deepcopy(model.peft_config[model.active_adapter]))
        for name, param in model.named_parameters():
            if f".{ADAPTER}." in name:
                param.requires_grad_(False)
        self.updates = 0
        self.optimizer: torch.optim.Optimizer | None = None

    def adapters(self) -> tuple[str, ...]:
        return (ADAPTER,)

    def generate_round(self, prompts: list[str], sampled: list[tuple[list[int], list[int]]]) -> tuple:
        """Update phi on the buffer and the step's earlier rounds, then sample the round from it."""
        self.behaviour_update(sampled)
        with use_adapter(self.trainer.accelerator.unwrap_model(self.trainer.model), ADAPTER):
            return self.trainer._generate(prompts)

    def buffered_rows(self, sampled: list[tuple[list[int], list[int]]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(prompt ids, completion ids) of every buffered row and of ``sampled``, empty completions left out."""
        rows: list[tuple[torch.Tensor, torch.Tensor]] = []
        for past in self.past:
            for i in range(past["prompt_ids"].size(0)):
                rows.append((past["prompt_ids"][i][past["prompt_mask"][i].bool()],
                             past["completion_ids"][i][past["completion_mask"][i].bool()]))
        rows += [(torch.tensor(p), torch.tensor(c)) for p, c in sampled]
        return [r for r in rows if r[1].numel() > 0]

    def behaviour_update(self, sampled: list[tuple[list[int], list[int]]]) -> None:
        """phi from theta, then minimise ``behaviour_objective`` on the buffered rows and ``sampled``,
        stopping once KL(pi_theta || pi_phi) passes ``props.target_kl``."""
        trainer, cfg = self.trainer, self.cfg.props
        model = trainer.accelerator.unwrap_model(trainer.model)
        policy = model.active_adapter  # outside any adapter switch: the adapter being trained
        params = dict(model.named_parameters())
        behaviour_params = [p for n, p in params.items() if f".{ADAPTER}." in n]
        if self.updates % cfg.copy_every == 0:
            with torch.no_grad():
                for name, param in params.items():
                    if f".{ADAPTER}." in name:
                        param.copy_(params[name.replace(f".{ADAPTER}.", f".{policy}.")])
        self.updates += 1
        start, device, pad_id = time.perf_counter(), trainer.accelerator.device, trainer.processing_class.pad_token_id
        rows = self.buffered_rows(sampled)
        if cfg.update_epochs == 0 or not rows:
            return
        if self.optimizer is None:
            self.optimizer = torch.optim.Adam(behaviour_params, lr=cfg.learning_rate, eps=1e-5)
        size = max(1, len(rows) // cfg.minibatches)
        order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(self.cfg.train.seed + self.updates))
        kl, steps = torch.tensor(0.0), 0
        for _ in range(cfg.update_epochs):
            for first in range(0, len(rows), size):
                chosen = [rows[i] for i in order[first:first + size].tolist()]
                prompt_ids, prompt_mask = pad_rows([p for p, _ in chosen], pad_id, "left", device)
                completion_ids, mask = pad_rows([c for _, c in chosen], pad_id, "right", device)
                kl = self.minibatch_step(model, prompt_ids, prompt_mask, completion_ids, mask, behaviour_params)
                steps += 1
                if kl.item() > cfg.target_kl:
                    break
            if kl.item() > cfg.target_kl:
                break
        metrics = trainer.metrics()
        metrics["props/kl"].append(kl.item())
        metrics["props/minibatch_steps"].append(float(steps))
        metrics["props/rows"].append(float(len(rows)))
        metrics["time/behaviour_update_s"].append(time.perf_counter() - start)

    def minibatch_step(self, model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                       completion_ids: torch.Tensor, mask: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
        """One Adam step of phi on a minibatch of rows; returns the minibatch's KL(pi_theta || pi_phi)."""
        trainer, cfg = self.trainer, self.cfg.props
        ids, attention = join(prompt_ids, prompt_mask, completion_ids, mask)
        length, tempered = completion_ids.size(1), trainer.logprobs.tempered
        with torch.no_grad():
            theta = tempered(model(input_ids=ids, attention_mask=attention).logits[:, -length - 1:-1])
            if cfg.min_entropy > 0:  # near-deterministic states stay out of the objective (a deviation, see config)
                logp = torch.log_softmax(theta.float(), -1)
                mask = mask * (-(logp.exp() * logp).sum(-1) >= cfg.min_entropy)
        with use_adapter(model, ADAPTER):
            phi = tempered(model(input_ids=ids, attention_mask=attention).logits[:, -length - 1:-1])
            gather = completion_ids.unsqueeze(-1)
            # in float32: bf16 log-softmax would round the ratios the clip acts on
            loss, kl = behaviour_objective(torch.log_softmax(phi.float(), -1).gather(-1, gather).squeeze(-1),
                                           torch.log_softmax(theta.float(), -1).gather(-1, gather).squeeze(-1),
                                           phi, theta, mask.float(), cfg.clip, cfg.lambda_kl)
            self.optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, trainer.args.max_grad_norm)
            self.optimizer.step()
        return kl
