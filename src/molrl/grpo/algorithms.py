"""The three policy-gradient objectives this stage offers, as TRL ``GRPOConfig`` settings.

All three use group-relative advantages and the PPO-clipped token ratio
``r_t = pi_theta(o_t | q, o_<t) / pi_old(o_t | q, o_<t)``; they differ in two places:

* advantage scale: ``A_i = R_i - mean_j R_j`` (Dr.GRPO), or that divided by ``std_j R_j + 1e-4``
  (GRPO), over the G completions of one prompt;
* aggregation: GRPO averages token losses within each completion, then over completions
  (``1/G sum_i 1/|o_i| sum_t``), which favours short right answers and long wrong ones;
  Dr.GRPO sums token losses and divides by a constant, ``B * max_completion_length``.

``dr_grpo`` is the Dr.GRPO paper's objective (arXiv 2503.20783): no std division, constant
normaliser. ``dr_grpo_std`` keeps the constant normaliser but still divides advantages by the
group std, which is what the MoL-RL authors' public training code runs; it is offered under its
own name so either can be reproduced.
"""

from __future__ import annotations

# algorithm name -> (TRL loss_type, TRL scale_rewards)
TRL_SETTINGS: dict[str, tuple[str, str]] = {
    "grpo": ("grpo", "group"),
    "dr_grpo": ("dr_grpo", "none"),
    "dr_grpo_std": ("dr_grpo", "group"),
}


def trl_loss_settings(algorithm: str) -> dict[str, str]:
    """TRL ``GRPOConfig`` keyword arguments (loss_type, scale_rewards) for an algorithm name."""
    try:
        loss_type, scale_rewards = TRL_SETTINGS[algorithm]
    except KeyError:
        raise ValueError(f"algorithm {algorithm!r}; expected one of {', '.join(TRL_SETTINGS)}") from None
    return {"loss_type": loss_type, "scale_rewards": scale_rewards}
