"""PPO with a critic over macro actions (MA-RLHF, arXiv 2410.02743).

Per-token rewards are ``-beta (log pi_theta - log pi_ref)`` on each loss token plus the outcome reward
on the last (``token_rewards``); advantages and returns are GAE over macro actions of those rewards
and the critic's values (``molrl.rl.macro.macro_gae``); the policy loss is the clipped term (mean over
loss tokens, no KL term: the KL is in the rewards).

The critic (``ppo.critic``):

- ``separate`` (MA-RLHF's layout): a value model of its own, a LoRA adapter on the policy's base plus a
  linear value head, initialised from the policy's adapter, a fresh LoRA or a given adapter, fitted on each
  step's returns by its own Adam optimiser and learning rate (``critic_epochs`` passes) before the policy
  moves. With separate networks the order does not change the update: the advantages were formed with the
  old values. ``critic_warmup_steps`` fit the critic while every advantage is 0.
- ``shared``: a zero-initialised value head on the policy's own trunk; ``value_coef`` times the clipped
  value loss is added to the policy loss, so one optimiser trains both. The loss applies the head to the
  last hidden states of the policy's own forward (a hook on the trunk keeps them), so the trunk runs once.
  The head sits outside that forward, so DDP, which expects a parameter's gradient from its forward only, is
  told to leave it out, and its gradients are averaged over processes as they arrive.
- ``group_mean``: no learned critic; each state's value is its group's mean reward over its verdict rows (a control:
  with gamma = lam = 1 and beta = 0 the advantages are Dr.GRPO's, R - mean).

A row whose grading failed has no loss token (``molrl.rl.trainer``), so it has no reward, advantage, return or
value-loss term here.

The critic is saved beside the adapter (``value_head.pt``) and in every checkpoint (``critic.pt``).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig
from trl.trainer.utils import use_adapter

from molrl.rl.algorithms.base import Algorithm, copy_adapter
from molrl.rl.batch import AdvantageInputs, LossInputs, StepCounts, join
from molrl.rl.groups import group_stats
from molrl.rl.loss import explained_variance, value_loss
from molrl.rl.macro import macro_gae
from molrl.records.writes import write_bytes

CRITIC = "critic"
"""The separate critic's adapter name."""


def token_rewards(outcome: torch.Tensor, policy: torch.Tensor, reference: torch.Tensor | None, mask: torch.Tensor,
                  beta: float) -> torch.Tensor:
    """PPO's per-token rewards [B, T]: ``-beta (log pi_theta - log pi_ref)`` on each loss token, plus the
    outcome reward ``outcome`` [B] on the last one."""
    rewards = torch.zeros_like(policy) if reference is None or beta == 0.0 else -beta * (policy - reference)
    rewards = rewards * mask
    last = (mask.cumsum(-1) == mask.sum(-1, keepdim=True)) & mask.bool()  # [B, T] the last loss token
    return rewards + last * outcome.unsqueeze(1)


class Ppo(Algorithm):
    """PPO: GAE over macro actions with a separate, shared or group-mean critic."""

    aggregation = "token_mean"
    kl_in_loss = False
    uses_macro_actions = True

    def __init__(self, trainer: Any, cfg: Any):
        super().__init__(trainer, cfg)
        self.critic = cfg.ppo.critic
        model = trainer.accelerator.unwrap_model(trainer.model)
        if self.critic == "group_mean":
            return
        head = torch.nn.Linear(model.config.hidden_size, 1).to(trainer.accelerator.device)
        torch.nn.init.zeros_(head.weight)
        torch.nn.init.zeros_(head.bias)
        if self.critic == "shared":
            model.add_module("molrl_value_head", head)  # a submodule, so the policy's optimiser trains it
            self._states: list[torch.Tensor] | None = None  # the loss forward's last hidden states, while it runs
            self._hooks = [model.get_base_model().get_decoder().register_forward_hook(self._keep_states)]
            if trainer.accelerator.num_processes > 1:
                names = [f"molrl_value_head.{name}" for name, _ in head.named_parameters()]
                torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)
                self._hooks += [p.register_hook(self._averaged) for p in head.parameters()]
            return
        self.head = head  # not a submodule: the policy's optimiser never sees the critic
        self.add_critic_adapter(model)
        self.critic_params = [p for n, p in model.named_parameters() if f".{CRITIC}." in n]
        self.critic_params += list(head.parameters())
        lr = cfg.ppo.critic_learning_rate or cfg.train.learning_rate
        self.optimizer = torch.optim.Adam(self.critic_params, lr=lr)
        for p in self.critic_params:
            p.requires_grad_(False)  # on only while the critic is fitted

    def add_critic_adapter(self, model: Any) -> None:
        """The critic's LoRA adapter on the policy's base, initialised as ``ppo.critic_init`` says."""
        init = self.cfg.ppo.critic_init
        if init == "policy":
            copy_adapter(model, model.active_adapter, CRITIC)
        elif init == "fresh":
            cuda = [torch.cuda.current_device()] if torch.cuda.is_available() else []
            with torch.random.fork_rng(devices=cuda):
                model.add_adapter(CRITIC, LoraConfig(r=self.cfg.lora.rank, lora_alpha=self.cfg.lora.alpha,
                                                     target_modules=list(self.cfg.lora.target_modules)))
        else:
            model.load_adapter(str(init), adapter_name=CRITIC, is_trainable=True)

    def frozen_adapters(self) -> tuple[str, ...]:
        return (*super().frozen_adapters(), *((CRITIC,) if self.critic == "separate" else ()))

    # the shared critic's values, from the policy's own forward
    def _keep_states(self, module: Any, args: Any, output: Any) -> None:
        if self._states is not None and torch.is_grad_enabled():
            self._states.append(output.last_hidden_state)  # [B, L, H]

    def _averaged(self, grad: torch.Tensor) -> torch.Tensor:
        """A micro-batch's gradient of the shared head, averaged over processes (as DDP does for the others)."""
        return self.trainer.accelerator.reduce(grad, reduction="mean")

    def before_loss_forward(self) -> None:
        if self.critic == "shared":
            self._states = []

    def loss_values(self, completion_tokens: int) -> torch.Tensor:
        """[B, T] the shared head's values of the loss forward's states before each completion token (with grad)."""
        states, self._states = self._states, None
        if not states:
            raise RuntimeError("the shared critic saw no loss forward: the trainer calls before_loss_forward first")
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        states = torch.cat(states)[:, -completion_tokens - 1 : -1].float()  # [B, T, H]
        with torch.autocast(device_type=states.device.type, enabled=False):
            return model.molrl_value_head(states).squeeze(-1)

    def values(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
               completion_mask: torch.Tensor, grad: bool = False) -> torch.Tensor:
        """[B, T] the critic's value of the state before each completion token."""
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        ids, attention = join(prompt_ids, prompt_mask, completion_ids, completion_mask)
        separate = self.critic == "separate"
        with torch.set_grad_enabled(grad), use_adapter(model, CRITIC if separate else model.active_adapter):
            hidden = model.get_base_model().get_decoder()(input_ids=ids, attention_mask=attention).last_hidden_state
            states = hidden[:, -completion_ids.size(1) - 1 : -1].float()  # [B, T, H]
            head = self.head if separate else model.molrl_value_head
            return head(states).squeeze(-1)

    def old_values(self, inputs: AdvantageInputs) -> torch.Tensor:
        """[B, T] the critic's values of the batch's states before this step's update."""
        batch = inputs.batch
        if self.critic == "group_mean":
            mean = group_stats(inputs.rewards, inputs.verdicts, inputs.group).mean  # over the group's verdict rows
            return mean[inputs.rows].unsqueeze(1).expand_as(batch.completion_mask).float()
        return self.values(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.attention())

    def token_advantages(self, inputs: AdvantageInputs, ma_ids: torch.Tensor):
        """GAE over macro actions of the per-token rewards; the returns and old values go to the critic."""
        trainer, batch, ppo = self.trainer, inputs.batch, self.cfg.ppo
        mask = batch.completion_mask.float()
        policy = trainer.policy_logps(batch)
        rewards = token_rewards(inputs.rewards[inputs.rows], policy, batch.reference_logps, mask, self.cfg.beta)
        old = self.old_values(inputs) * mask
        advantages, returns = torch.zeros_like(rewards), torch.zeros_like(rewards)
        for row in range(rewards.size(0)):
            advantages[row], returns[row] = macro_gae(rewards[row].cpu(), old[row].cpu(), ma_ids[row].cpu(),
                                                      ppo.gamma, ppo.lam, self.cfg.macro.pooling)
        advantages, returns = advantages.to(old.device), returns.to(old.device)
        metrics = trainer.metrics()
        if batch.reference_logps is not None:  # the KL in the rewards, per token
            metrics["kl"].append((((policy - batch.reference_logps) * mask).sum() / mask.sum().clamp(min=1.0)).item())
        metrics["critic/explained_variance"].append(explained_variance(old, returns, mask))
        metrics["critic/macro_actions_per_completion"].append(((ma_ids.max(-1).values + 1).float().mean()).item())
        if self.critic == "separate" and trainer.model.training:
            self.fit_critic(batch, returns, old)
        if trainer.state.global_step < ppo.critic_warmup_steps:
            advantages = torch.zeros_like(advantages)  # the critic's warm-up: the policy does not move
        return advantages, {"returns": returns, "old_values": old}

    def fit_critic(self, batch: Any, returns: torch.Tensor, old: torch.Tensor) -> None:
        """The separate critic's Adam steps on the clipped value loss of this batch (its own optimiser)."""
        ppo, accelerator = self.cfg.ppo, self.trainer.accelerator
        rows = batch.completion_ids.size(0)
        size = max(1, rows // ppo.critic_minibatches)
        losses = []
        for p in self.critic_params:
            p.requires_grad_(True)
        try:
            for _ in range(ppo.critic_epochs):
                for first in range(0, rows, size):
                    part = slice(first, first + size)
                    values = self.values(batch.prompt_ids[part], batch.prompt_mask[part], batch.completion_ids[part],
                                         batch.attention()[part], grad=True)
                    # over the minibatch's loss tokens of every process (each fits the same number of minibatches)
                    tokens = accelerator.reduce(batch.completion_mask[part].sum().float(), reduction="sum")
                    loss = value_loss(values, old[part], returns[part], batch.completion_mask[part], ppo.value_clip,
                                      tokens)
                    self.optimizer.zero_grad()
                    (loss * accelerator.num_processes).backward()  # its gradients are averaged over processes next
                    if accelerator.num_processes > 1:  # outside DDP's forward: average the critic's gradients here
                        for p in self.critic_params:
                            if p.grad is not None:
                                p.grad = accelerator.reduce(p.grad, reduction="mean")
                    torch.nn.utils.clip_grad_norm_(self.critic_params, self.trainer.args.max_grad_norm)
                    self.optimizer.step()
                    losses.append(accelerator.reduce(loss.detach(), reduction="sum").item())
        finally:
            for p in self.critic_params:
                p.requires_grad_(False)
        self.trainer.metrics()["critic/value_loss"].append(sum(losses) / len(losses))

    def loss_terms(self, inputs: LossInputs, counts: StepCounts) -> dict[str, tuple[float, torch.Tensor]]:
        if self.critic != "shared":  # a separate critic is fitted on its own; group_mean learns nothing
            return {}
        values = self.loss_values(inputs.completion_ids.size(1))
        critic = value_loss(values, inputs.extra["old_values"], inputs.extra["returns"], inputs.completion_mask,
                            self.cfg.ppo.value_clip, counts.tokens)  # over the step's loss tokens
        return {"critic/value_loss": (self.cfg.ppo.value_coef, critic)}

    def critic_state(self, model: Any) -> dict[str, Any]:
        """The critic's weights (and its optimiser's state, when separate)."""
        if self.critic == "shared":
            return {"head": model.molrl_value_head.state_dict()}
        adapter = {n: p.detach().cpu() for n, p in model.named_parameters() if f".{CRITIC}." in n}
        return {"head": self.head.state_dict(), "adapter": adapter, "optimizer": self.optimizer.state_dict()}

    def save_state(self, folder: Path) -> None:
        if self.critic == "group_mean" or not self.trainer.accelerator.is_main_process:
            return
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(self.critic_state(self.trainer.accelerator.unwrap_model(self.trainer.model)), folder / "critic.pt")

    def load_state(self, checkpoint: Path) -> None:
        path = checkpoint / "critic.pt"
        if self.critic == "group_mean" or not path.is_file():
            return
        state = torch.load(path, map_location=self.trainer.accelerator.device, weights_only=True)
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        if self.critic == "shared":
            model.molrl_value_head.load_state_dict(state["head"])
            return
        self.head.load_state_dict(state["head"])
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, value in state["adapter"].items():
                params[name].copy_(value)
        self.optimizer.load_state_dict(state["optimizer"])

    def save(self, model: Any, out: Path, main_process: bool) -> None:
        """The critic is not part of the policy: ``value_head.pt`` beside it."""
        if self.critic == "group_mean":
            return
        if main_process:
            buffer = io.BytesIO()
            torch.save(self.critic_state(model), buffer)
            write_bytes(out / "value_head.pt", buffer.getvalue())
        if self.critic == "shared":
            for hook in self._hooks:
                hook.remove()
            del model.molrl_value_head
