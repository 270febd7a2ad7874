"""PPO with a learned critic over macro actions (MA-RLHF, arXiv 2410.02743).

Per-token rewards are ``-beta (log pi_theta - log pi_ref)`` on each loss token plus the outcome reward
on the last (``token_rewards``); advantages and returns are GAE over macro actions of those rewards
and the critic's values (``molrl.rl.macro.macro_gae``); the loss is the clipped policy term (mean over
loss tokens, no KL term: the KL is in the rewards) plus ``value_coef`` times the clipped value loss.
The critic is a zero-initialised linear head on the policy's last hidden states; its trunk is the
policy's (the value loss trains the LoRA as well). It is saved beside the adapter as ``value_head.pt``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from molrl.rl.algorithms.base import Algorithm
from molrl.rl.batch import AdvantageInputs, LossInputs, join
from molrl.rl.loss import explained_variance, value_loss
from molrl.rl.macro import macro_gae


def token_rewards(outcome: torch.Tensor, policy: torch.Tensor, reference: torch.Tensor | None, mask: torch.Tensor,
                  beta: float) -> torch.Tensor:
    """PPO's per-token rewards [B, T]: ``-beta (log pi_theta - log pi_ref)`` on each loss token, plus the
    outcome reward ``outcome`` [B] on the last one."""
    rewards = torch.zeros_like(policy) if reference is None or beta == 0.0 else -beta * (policy - reference)
    rewards = rewards * mask
    last = (mask.cumsum(-1) == mask.sum(-1, keepdim=True)) & mask.bool()  # [B, T] the last loss token
    return rewards + last * outcome.unsqueeze(1)


class Ppo(Algorithm):
    """PPO: GAE over macro actions with a value head on the policy's trunk."""

    aggregation = "token_mean"
    kl_in_loss = False
    uses_macro_actions = True

    def __init__(self, trainer: Any, cfg: Any):
        super().__init__(trainer, cfg)
        model = trainer.accelerator.unwrap_model(trainer.model)
        head = torch.nn.Linear(model.config.hidden_size, 1).to(trainer.accelerator.device)
        torch.nn.init.zeros_(head.weight)
        torch.nn.init.zeros_(head.bias)
        model.add_module("molrl_value_head", head)  # a submodule, so the optimiser trains it

    def values(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
               completion_mask: torch.Tensor, grad: bool = False) -> torch.Tensor:
        """[B, T] the critic's value of the state before each completion token (with ``grad``, the value
        loss trains the shared trunk's LoRA as well as the head)."""
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        ids, attention = join(prompt_ids, prompt_mask, completion_ids, completion_mask)
        with torch.set_grad_enabled(grad):
            hidden = model.get_base_model().get_decoder()(input_ids=ids, attention_mask=attention).last_hidden_state
            states = hidden[:, -completion_ids.size(1) - 1 : -1].float()  # [B, T, H]
            return model.molrl_value_head(states).squeeze(-1)

    def token_advantages(self, inputs: AdvantageInputs, ma_ids: torch.Tensor):
        """GAE over macro actions of the per-token rewards; the returns and old values go to the value loss."""
        trainer, batch, ppo = self.trainer, inputs.batch, self.cfg.ppo
        mask = batch.completion_mask.float()
        policy = trainer.policy_logps(batch)
        rewards = token_rewards(inputs.rewards[inputs.rows], policy, batch.reference_logps, mask, self.cfg.beta)
        old = self.values(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask) * mask
        advantages, returns = torch.zeros_like(rewards), torch.zeros_like(rewards)
        for row in range(rewards.size(0)):
            advantages[row], returns[row] = macro_gae(rewards[row].cpu(), old[row].cpu(), ma_ids[row].cpu(),
                                                      ppo.gamma, ppo.lam, self.cfg.macro.pooling)
        metrics = trainer.metrics()
        if batch.reference_logps is not None:  # the KL in the rewards, per token
            metrics["kl"].append((((policy - batch.reference_logps) * mask).sum() / mask.sum().clamp(min=1.0)).item())
        metrics["critic/explained_variance"].append(explained_variance(old, returns, mask))
        metrics["critic/macro_actions_per_completion"].append(((ma_ids.max(-1).values + 1).float().mean()).item())
        return advantages.to(old.device), {"returns": returns.to(old.device), "old_values": old}

    def loss_terms(self, inputs: LossInputs) -> dict[str, tuple[float, torch.Tensor]]:
        values = self.values(inputs.prompt_ids, inputs.prompt_mask, inputs.completion_ids, inputs.completion_mask,
                             grad=True)
        critic = value_loss(values, inputs.extra["old_values"], inputs.extra["returns"], inputs.completion_mask,
                            self.cfg.ppo.value_clip)
        return {"critic/value_loss": (self.cfg.ppo.value_coef, critic)}

    def save(self, model: Any, out: Path, main_process: bool) -> None:
        """The critic is not part of the policy: ``value_head.pt`` beside it."""
        if main_process:
            torch.save(model.molrl_value_head.state_dict(), out / "value_head.pt")
        del model.molrl_value_head
