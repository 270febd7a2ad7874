"""The engine-trainer mismatch in closed form: k3, the gap, the importance ratios' ESS, the gate and the canary."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from molrl.errors import MolrlError
from molrl.rl.mismatch import (
    CANARY_APART,
    Mismatch,
    MismatchGate,
    MismatchSums,
    canary_message,
    canary_verdict,
    means,
    step_sums,
)

LN2 = math.log(2.0)


def test_k3_gap_and_ess_over_the_sampled_tokens():
    # log r = log p_trainer - log p_engine: row 0: ln 2, 0, (masked out: NaN, not sampled by the engine); row 1:
    # -ln 2, (masked out)
    trainer = torch.tensor([[LN2 - 1.0, -2.0, -3.0], [-LN2 - 0.5, -9.0, 0.0]])
    engine = torch.tensor([[-1.0, -2.0, math.nan], [-0.5, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    step = means(step_sums(trainer, engine, mask))
    # r = 2, 1, 1/2 over n = 3 tokens; k3 = r - 1 - ln r: (1 - ln 2) + 0 + (-1/2 + ln 2) = 1/2
    assert step.kl == pytest.approx(0.5 / 3)
    assert step.gap == pytest.approx(2 * LN2 / 3)
    # ESS = (2 + 1 + 1/2)^2 / (3 (4 + 1 + 1/4)) = 12.25 / 15.75
    assert step.ess == pytest.approx(12.25 / 15.75)


def test_equal_log_probs_give_zero_mismatch_and_full_ess():
    logps = torch.tensor([[-0.3, -1.2], [-2.0, -0.1]])
    step = means(step_sums(logps, logps.clone(), torch.ones(2, 2)))
    assert (step.kl, step.gap, step.ess) == (0.0, 0.0, 1.0)


def test_a_step_without_sampled_tokens_reads_as_no_mismatch():
    step = means(step_sums(torch.zeros(1, 2), torch.full((1, 2), math.nan), torch.zeros(1, 2)))
    assert (step.kl, step.gap, step.ess) == (0.0, 0.0, 1.0)


UNUSABLE = {"nan": math.nan, "minus_infinity": -math.inf, "plus_infinity": math.inf}


@pytest.mark.parametrize("value", UNUSABLE.values(), ids=UNUSABLE.keys())
@pytest.mark.parametrize("unusable_tokens", [1, 3])
def test_a_sampled_token_without_a_usable_engine_logp_makes_the_step_unknown_not_zero(value, unusable_tokens):
    # three sampled tokens whose trainer and engine log-probs agree, then the engine's last 1 (or all 3) unusable
    trainer = torch.full((1, 3), -1.0)
    engine = trainer.clone()
    engine[0, 3 - unusable_tokens:] = value
    sums = step_sums(trainer, engine, torch.ones(1, 3))
    assert (sums.tokens, sums.unusable) == (3 - unusable_tokens, unusable_tokens)
    step = means(MismatchSums.of_tensor(sums.as_tensor()))  # as the reduce over processes hands it back
    assert math.isnan(step.kl) and math.isnan(step.gap) and math.isnan(step.ess)
    assert (step.tokens, step.unusable) == (3 - unusable_tokens, unusable_tokens)


def test_the_step_mean_is_over_all_its_tokens_not_a_mean_of_batch_means():
    # batch a: one token with r = 2; batch b: three tokens with r = 1. Step: k3 = (1 - ln 2) / 4, not half of it
    a = step_sums(torch.tensor([[LN2]]), torch.tensor([[0.0]]), torch.ones(1, 1))
    b = step_sums(torch.zeros(1, 3), torch.zeros(1, 3), torch.ones(1, 3))
    summed = MismatchSums.of_tensor(a.as_tensor() + b.as_tensor())  # what the reduce over processes does
    assert means(summed).kl == pytest.approx((1 - LN2) / 4)
    assert means(summed).kl != pytest.approx((means(a).kl + means(b).kl) / 2)


def test_k3_estimates_kl_engine_to_trainer_on_tokens_the_engine_sampled():
    # engine p = (0.5, 0.5), trainer q = (0.8, 0.2): mean k3 under the engine's draws is KL(p || q)
    p, q = torch.tensor([0.5, 0.5]), torch.tensor([0.8, 0.2])
    draws = torch.multinomial(p, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    step = means(step_sums(q.log()[draws][None], p.log()[draws][None], torch.ones(1, draws.numel())))
    assert step.kl == pytest.approx((p * (p / q).log()).sum().item(), rel=0.02)  # 0.2231


def trainer_state(should_log: bool) -> tuple:
    return SimpleNamespace(), SimpleNamespace(global_step=3), SimpleNamespace(should_log=should_log)


def test_the_gate_stops_after_the_step_that_passes_it_naming_value_limit_and_causes():
    gate = MismatchGate(0.05)
    gate.observe(2, Mismatch(0.049, 0.1, 0.9, tokens=8))
    gate.on_log(*trainer_state(True))  # at the limit or under it: the run goes on
    gate.observe(3, Mismatch(0.2, 0.3, 0.8, tokens=8))
    gate.on_step_end(*trainer_state(True))  # the step logs: its metrics line is written before the stop
    with pytest.raises(MolrlError, match=r"step 3: rollout/mismatch_kl=0.2 passed rollout.max_mismatch_kl=0.05.*"
                                         r"stale adapter.*dtype.*sampling settings"):
        gate.on_log(*trainer_state(True))
    with pytest.raises(MolrlError, match="step 3"):  # a step that logs nothing stops at its end
        gate.on_step_end(*trainer_state(False))


def test_a_gate_of_zero_never_stops_on_a_finite_mismatch():
    gate = MismatchGate(0.0)
    gate.observe(1, Mismatch(50.0, 5.0, 0.1, tokens=8))
    gate.on_log(*trainer_state(True))


@pytest.mark.parametrize("limit", [0.0, 0.05])
@pytest.mark.parametrize("value", UNUSABLE.values(), ids=UNUSABLE.keys())
def test_the_gate_stops_on_a_step_with_sampled_tokens_and_no_usable_engine_logp_whatever_its_limit(limit, value):
    step = means(step_sums(torch.full((1, 4), -1.0), torch.full((1, 4), value), torch.ones(1, 4)))
    gate = MismatchGate(limit)
    gate.observe(2, step)
    with pytest.raises(MolrlError, match=r"step 2: rollout/mismatch_kl is unknown: 4 of the step's 4 sampled tokens "
                                         r"have no usable engine log-prob \(NaN or infinite\).*resume") as err:
        gate.on_log(*trainer_state(True))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("limit", [0.0, 0.05])
def test_the_gate_stops_on_an_infinite_mismatch_of_usable_logps_whatever_its_limit(limit):
    # the trainer gives a token the engine sampled probability 0: r = 0, k3 = r - 1 - log r = inf
    step = means(step_sums(torch.tensor([[-math.inf]]), torch.tensor([[-1.0]]), torch.ones(1, 1)))
    assert step.kl == math.inf
    gate = MismatchGate(limit)
    gate.observe(1, step)
    with pytest.raises(MolrlError, match=r"step 1: rollout/mismatch_kl=inf is not finite"):
        gate.on_step_end(*trainer_state(False))


def test_the_canary_waits_while_the_adapter_is_its_base():
    # a LoRA with B = 0: adapter and base give the same log-probs, whichever the engine holds
    same = torch.tensor([-1.0, -2.0, -0.5])
    verdict = canary_verdict(same + 1e-4, same, same.clone())
    assert not verdict.decided and not verdict.on_base


def test_the_canary_finds_the_engine_on_the_base():
    base = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    adapter = base + torch.tensor([0.3, -0.2, 0.1, 0.4])
    verdict = canary_verdict(base + 1e-5, adapter, base)
    assert verdict.decided and verdict.on_base
    assert verdict.apart == pytest.approx(0.25)


def test_the_canary_passes_an_engine_on_the_adapter_and_holds_off_when_noise_rivals_the_move():
    base = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    adapter = base + 0.05
    healthy = canary_verdict(adapter + 1e-3, adapter, base)
    assert healthy.decided and not healthy.on_base
    noisy = canary_verdict(base + 0.03, adapter, base)  # the engine 0.03 from base, 0.02 from the adapter
    assert not noisy.decided  # the adapter moved 0.05: less than 4x the engine's distance to either
    small = canary_verdict(base + CANARY_APART / 10, base + CANARY_APART / 2, base)
    assert not small.decided  # below CANARY_APART nothing is judged


@pytest.mark.parametrize("value", UNUSABLE.values(), ids=UNUSABLE.keys())
def test_the_canary_fails_an_engine_whose_sampled_logps_are_unusable_even_while_the_adapter_is_its_base(value):
    # the adapter has not moved (the canary could not yet judge where the engine samples from), yet one of the
    # engine's log-probs is unusable: decided, and failed
    same = torch.tensor([-1.0, -2.0, -0.5])
    verdict = canary_verdict(torch.tensor([-1.0, value, -0.5]), same, same.clone())
    assert verdict.decided and verdict.failed and not verdict.on_base and verdict.unusable == 1
    message = canary_message(1, verdict)
    assert message.startswith("step 1: the engine's log-probs are unusable: 1 of the tokens") and "\n" not in message
