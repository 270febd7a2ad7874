"""The mismatch between the engine that samples and the trainer that trains: its measures, its gate and the canary.

Every engine path hands the same three tensors to ``step_sums``: the engine's log-prob of each token it sampled
(vLLM's ``processed_logprobs``: after the sampling temperature and the logit processors; NaN where the engine did not
sample the token), the trainer's log-prob of the same token under the policy being trained at the same temperature
(``molrl.rl.logprobs.LogProbs``: ``log_softmax(logits / T)``, no top-k / top-p), and the mask of the sampled
tokens the loss reads. With ``r = p_trainer / p_engine`` per token:

- ``rollout/mismatch_kl``: the k3 estimator ``r - 1 - log r`` averaged over the step's sampled tokens: an unbiased
  estimate of KL(pi_engine || pi_trainer) per token (the tokens were drawn from the engine), >= 0 at every token;
- ``rollout/engine_logp_gap``: the mean |log r| over the same tokens;
- ``rollout/is_ess``: the effective sample size of the per-token ratios as a fraction, (sum r)^2 / (n sum r^2), in
  (0, 1]: 1 when every ratio is equal.

Each is normalised over the optimiser step's tokens (sums reduced over processes, then divided), never a
micro-batch's or one process's mean. A sampled token the mask selects whose engine log-prob is NaN or infinite has no
usable log-prob: the engine sampled it and cannot say with what probability, so the step's mismatch is unknown, NaN,
never 0. ``MismatchGate`` stops a run after the step whose mismatch_kl passes ``rollout.max_mismatch_kl`` or is not
finite (whatever the limit, 0 included). ``canary_verdict`` judges, at a sync after the adapter has left its base,
whether the engine's log-probs on one fixed prompt are nearer the trainer's adapter than the base ("engine on the
base"), and fails an engine whose log-probs of the tokens it sampled there are not finite.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from transformers import TrainerCallback

from molrl.errors import MolrlError

CAUSES = ("a stale adapter (the engine was not sent the last optimiser step's weights)",
          "a dtype that differs between engine and trainer (model.dtype)",
          "sampling settings that differ (top_p, top_k, min_p, repetition_penalty reshape the engine's processed "
          "log-probs; the trainer's apply the temperature only)")
"""What usually makes an engine's log-probs part from the trainer's, most likely first."""


@dataclass
class MismatchSums:
    """A batch's sums over its sampled tokens with a usable engine log-prob, and the count of those without one;
    added over processes, they give the step's means."""

    k3: float
    """Sum of r - 1 - log r."""
    gap: float
    """Sum of |log r|."""
    ratio: float
    """Sum of r."""
    ratio_sq: float
    """Sum of r^2."""
    tokens: float
    """n: the sampled tokens whose engine log-prob is usable (finite)."""
    unusable: float = 0.0
    """The sampled tokens whose engine log-prob is NaN or infinite."""

    def as_tensor(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """[6] the sums in field order (to reduce over processes)."""
        return torch.tensor([self.k3, self.gap, self.ratio, self.ratio_sq, self.tokens, self.unusable],
                            dtype=torch.float64, device=device)

    @classmethod
    def of_tensor(cls, sums: torch.Tensor) -> "MismatchSums":
        """The inverse of ``as_tensor``."""
        return cls(*(float(x) for x in sums.tolist()))


@dataclass
class Mismatch:
    """A step's means (``MismatchSums.means``); with no sampled token: 0, 0 and 1 (nothing to tell them apart); with a
    sampled token whose engine log-prob is unusable: NaN, NaN and NaN (unknown)."""

    kl: float
    """rollout/mismatch_kl: mean k3, an estimate of KL(pi_engine || pi_trainer) per token."""
    gap: float
    """rollout/engine_logp_gap: mean |log p_trainer - log p_engine|."""
    ess: float
    """rollout/is_ess: (sum r)^2 / (n sum r^2) in (0, 1]."""
    tokens: float = 0.0
    """The sampled tokens with a usable engine log-prob."""
    unusable: float = 0.0
    """The sampled tokens without one (NaN or infinite)."""


def step_sums(trainer_logps: torch.Tensor, engine_logps: torch.Tensor, mask: torch.Tensor) -> MismatchSums:
    """The mismatch sums of one batch: ``trainer_logps``, ``engine_logps`` and ``mask`` (the sampled tokens) are
    [B, T]; a sampled token counts where its engine log-prob is finite, and is unusable where it is NaN or infinite."""
    sampled = mask.bool()  # [B, T]
    usable = sampled & torch.isfinite(engine_logps)  # [B, T]
    log_r = (trainer_logps.double() - engine_logps.double())[usable]  # [n] log p_trainer - log p_engine
    r = torch.exp(log_r)  # [n]
    return MismatchSums(k3=(r - 1 - log_r).sum().item(), gap=log_r.abs().sum().item(), ratio=r.sum().item(),
                        ratio_sq=(r * r).sum().item(), tokens=float(usable.sum().item()),
                        unusable=float((sampled & ~usable).sum().item()))


def means(sums: MismatchSums) -> Mismatch:
    """The step's mismatch from its sums (over every process's tokens): unknown (NaN) once any sampled token has no
    usable engine log-prob."""
    if sums.unusable > 0:
        return Mismatch(math.nan, math.nan, math.nan, sums.tokens, sums.unusable)
    if sums.tokens == 0:
        return Mismatch(0.0, 0.0, 1.0)
    ess = sums.ratio ** 2 / (sums.tokens * sums.ratio_sq) if sums.ratio_sq > 0 else 1.0
    return Mismatch(kl=sums.k3 / sums.tokens, gap=sums.gap / sums.tokens, ess=ess, tokens=sums.tokens)


def engine_logp_gap(trainer_logps: torch.Tensor, engine_logps: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean |log pi_trainer - log pi_engine| over the sampled tokens of ``mask`` [B, T] (NaN when one has no usable
    engine log-prob): 0 up to numerics when the engine samples from the policy being trained."""
    return means(step_sums(trainer_logps, engine_logps, mask)).gap


def gate_message(step: int, kl: float, limit: float, mismatch: Mismatch | None = None) -> str:
    """The one line a run stops with when a step's mismatch passes its limit or is not finite (``mismatch``: the
    step's, to count its tokens without a usable engine log-prob)."""
    if mismatch is not None and mismatch.unusable > 0:
        sampled = mismatch.tokens + mismatch.unusable
        return (f"step {step}: rollout/mismatch_kl is unknown: {mismatch.unusable:.0f} of the step's {sampled:.0f} "
                "sampled tokens have no usable engine log-prob (NaN or infinite), so the engine cannot be checked "
                "against the trained policy. Check that the engine sends the sampled token's log-prob (vLLM with "
                "logprobs=0 and --logprobs-mode processed_logprobs, as molrl serve starts it) and that the model's "
                "logits are finite; resume from the last checkpoint once fixed")
    passed = f"passed rollout.max_mismatch_kl={limit:g}" if math.isfinite(kl) else \
        "is not finite (a run stops on that whatever rollout.max_mismatch_kl says)"
    return (f"step {step}: rollout/mismatch_kl={kl:.4g} {passed}: the engine's log-probs are not the trained "
            f"policy's. Likely causes: {'; '.join(CAUSES)}. Look at rollout/engine_logp_gap and rollout/is_ess in "
            "metrics.jsonl; resume from the last checkpoint once fixed")


class MismatchGate(TrainerCallback):
    """Stops training after the step whose ``rollout/mismatch_kl`` passes ``limit`` (0: no limit) or is not finite
    (a sampled token without a usable engine log-prob makes it NaN: ``means``), once that step's metrics are logged
    (or at its end, when the step logs nothing); the rollout reports each step's mismatch."""

    def __init__(self, limit: float):
        self.limit = limit
        self.passed: tuple[int, Mismatch] | None = None
        """(step, its mismatch) of the first step that failed, until the run stops on it."""

    def observe(self, step: int, mismatch: Mismatch) -> None:
        """A training step's mismatch (the same on every process: the step's, reduced over processes)."""
        kl = mismatch.kl
        failed = not math.isfinite(kl) or (self.limit > 0 and kl > self.limit)
        if failed and self.passed is None:
            self.passed = (step, mismatch)

    def _stop(self) -> None:
        if self.passed is not None:
            step, mismatch = self.passed
            raise MolrlError(gate_message(step, mismatch.kl, self.limit, mismatch))

    def on_step_end(self, args, state, control, **kwargs):
        if not control.should_log:  # else the step's metrics line is written first (on_log)
            self._stop()

    def on_log(self, args, state, control, logs=None, **kwargs):
        self._stop()


@dataclass
class CanaryVerdict:
    """What the canary tells of the engine's log-probs on its fixed prompt."""

    decided: bool
    """The adapter has left its base far enough for the engine to be told apart (else: ask at the next sync)."""
    on_base: bool
    """Decided, and the engine is nearer the base than the trainer's adapter."""
    to_adapter: float
    """Mean |engine - adapter| log-prob over the canary's tokens."""
    to_base: float
    """Mean |engine - base|."""
    apart: float
    """Mean |adapter - base|: how far the adapter has moved from its base on these tokens."""
    unusable: int = 0
    """The canary's sampled tokens whose engine log-prob is NaN or infinite (any: decided, and failed)."""

    @property
    def failed(self) -> bool:
        """The run stops on this verdict: the engine is on the base, or its log-probs are unusable."""
        return self.on_base or self.unusable > 0


CANARY_APART = 1e-3
"""Nats per token the adapter must differ from its base on the canary's tokens before the canary judges (a LoRA
that starts at B = 0 is its base until the first optimiser step moves it)."""


def canary_verdict(engine: torch.Tensor, adapter: torch.Tensor, base: torch.Tensor) -> CanaryVerdict:
    """Judge the engine's log-probs [n] of the canary's tokens against the trainer's under its adapter [n] and under
    the base [n]: decided once the adapter is ``CANARY_APART`` from the base and at least 4x as far from it as the
    engine is from the nearer of the two, so numerical noise alone never decides; a sampled token whose engine
    log-prob is NaN or infinite decides it at once, as a failure."""
    unusable = int((~torch.isfinite(engine)).sum().item())
    if unusable:
        return CanaryVerdict(True, False, math.nan, math.nan, math.nan, unusable)
    to_adapter = (engine.double() - adapter.double()).abs().mean().item()
    to_base = (engine.double() - base.double()).abs().mean().item()
    apart = (adapter.double() - base.double()).abs().mean().item()
    decided = apart >= CANARY_APART and apart >= 4 * min(to_adapter, to_base)
    return CanaryVerdict(decided, decided and to_base < to_adapter, to_adapter, to_base, apart)


def canary_message(step: int, verdict: CanaryVerdict) -> str:
    """The one line a run stops with when the canary finds the engine on the base, or its log-probs unusable."""
    if verdict.unusable:
        return (f"step {step}: the engine's log-probs are unusable: {verdict.unusable} of the tokens it sampled after "
                "the canary prompt have a NaN or infinite log-prob, so whether it samples with the adapter cannot be "
                "told. Check that the engine sends the sampled token's log-prob (vLLM with logprobs=0 and "
                "--logprobs-mode processed_logprobs, as molrl serve starts it)")
    return (f"step {step}: engine on the base: after the adapter was sent, the engine's log-probs on the canary prompt "
            f"are {verdict.to_base:.3g} nats/token from the base's and {verdict.to_adapter:.3g} from the trained "
            f"adapter's (which is {verdict.apart:.3g} from the base): the engine samples without the adapter. Check "
            "that the engine loads each new adapter (a new LoRA name and id per sync) and that lora.target_modules "
            "are modules the engine serves")


def token_logp_records(completion_ids: torch.Tensor, lengths: list[int], trainer_logps: torch.Tensor,
                       engine_logps: torch.Tensor | None, records: list[dict] | None = None) -> list[dict]:
    """Each row's ``completions.jsonl`` fields (``records``, extended) with its ``token_ids``, ``trainer_logps`` and
    ``engine_logps`` (None where the engine did not sample the token or gave no usable log-prob for it, or there is no
    engine), over its first ``lengths[i]`` completion tokens; ``completion_ids``, ``trainer_logps`` and
    ``engine_logps`` are [B, T]."""
    out = []
    for i, n in enumerate(lengths):
        engine = [None] * n if engine_logps is None else \
            [x if math.isfinite(x) else None for x in engine_logps[i, :n].float().tolist()]
        out.append({**(records[i] if records else {}), "token_ids": completion_ids[i, :n].tolist(),
                    "trainer_logps": trainer_logps[i, :n].float().tolist(), "engine_logps": engine})
    return out
