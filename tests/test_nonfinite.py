"""Training stops at the first non-finite gradient and never saves non-finite weights (``molrl.nonfinite``)."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from molrl.cli import main
from molrl.nonfinite import NonFiniteError, NonFiniteGuard, check_finite_weights, gradient_norm

REPO = Path(__file__).resolve().parents[1]
MOL_TINY = ["--config", str(REPO / "configs" / "mol_tiny.yaml"), "train.max_steps=2", "train.report_to=[none]"]
GRPO_TINY = ["--config", str(REPO / "configs" / "rl_tiny.yaml"), "train.max_steps=1", "sampling.max_new_tokens=4",
             "train.report_to=[none]"]


def errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def _linear_with_grad(value: float) -> torch.nn.Linear:
    layer = torch.nn.Linear(2, 2)
    layer(torch.ones(1, 2)).sum().backward()
    layer.weight.grad[0, 0] = value
    return layer


def test_gradient_norm_is_the_two_norm_of_every_gradient():
    layer = torch.nn.Linear(2, 1, bias=False)
    assert gradient_norm(layer) == 0.0  # no gradient yet
    layer.weight.grad = torch.tensor([[3.0, 4.0]])
    assert gradient_norm(layer) == pytest.approx(5.0)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_the_guard_stops_at_a_non_finite_gradient_naming_step_and_settings(value):
    guard = NonFiniteGuard("loss.temperature=1e-300")
    with pytest.raises(NonFiniteError, match=r"^step 4: the loss's gradient norm is (nan|inf) .* "
                                             r"The settings that scale the loss: loss.temperature=1e-300;"):
        guard.on_pre_optimizer_step(None, SimpleNamespace(global_step=3), None, model=_linear_with_grad(value))


def test_the_guard_lets_a_finite_gradient_through():
    assert NonFiniteGuard("x").on_pre_optimizer_step(None, SimpleNamespace(global_step=0), None,
                                                     model=_linear_with_grad(1e15)) is None


def test_weights_with_a_nan_are_not_saved_and_frozen_ones_are_not_looked_at():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    with torch.no_grad():
        model[0].weight[0, 0] = float("nan")
    model[0].requires_grad_(False)
    check_finite_weights(model, "adapter", "x")  # the NaN is in a frozen tensor
    model[0].requires_grad_(True)
    with pytest.raises(NonFiniteError, match=r"^adapter not saved: 1 of 4 trained tensors hold NaN or infinite values "
                                             r"\(first: 0.weight\)"):
        check_finite_weights(model, "adapter", "x")


def test_finding_10_mol_loss_temperature_1e_300_stops_at_step_1_and_saves_no_adapter(tmp_path, cli_logs, caplog):
    out = tmp_path / "run"
    assert main(["mol", *MOL_TINY, "loss.temperature=1e-300", f"output_dir={out}"]) == 1  # before: 0
    assert len(errors(caplog)) == 1
    assert errors(caplog)[0].startswith("step 1: the loss's gradient norm is nan (not finite)")
    assert "loss.temperature=1e-300" in errors(caplog)[0]
    assert not (out / "adapter").exists() and not list((out / "checkpoints").glob("checkpoint-*"))


def test_finding_10_mol_non_finite_weights_are_never_saved(tmp_path, cli_logs, caplog, monkeypatch):
    """With the per-step stop switched off, the NaN steps are applied; the final save still refuses them."""
    monkeypatch.setattr("molrl.nonfinite.gradient_norm", lambda model: 0.0)
    out = tmp_path / "run"
    assert main(["mol", *MOL_TINY, "loss.temperature=1e-300", f"output_dir={out}"]) == 1
    assert errors(caplog) and errors(caplog)[-1].startswith("the checkpoint of step 2 not saved: ")
    assert "trained tensors hold NaN or infinite values" in errors(caplog)[-1]
    assert not (out / "adapter").exists() and not list((out / "checkpoints").glob("checkpoint-*"))


def test_finding_10_mol_non_finite_weights_are_never_saved_as_the_final_adapter(tmp_path, cli_logs, caplog,
                                                                               monkeypatch):
    monkeypatch.setattr("molrl.nonfinite.gradient_norm", lambda model: 0.0)
    monkeypatch.setattr("molrl.nonfinite.NonFiniteGuard.on_step_end", lambda *args, **kwargs: None)
    out = tmp_path / "run"
    assert main(["mol", *MOL_TINY, "loss.temperature=1e-300", f"output_dir={out}"]) == 1
    assert errors(caplog) and errors(caplog)[-1].startswith(f"{out / 'adapter'} not saved: ")
    assert not (out / "adapter").exists()


def test_rl_stops_at_a_non_finite_gradient_and_saves_no_adapter(tmp_path, cli_logs, caplog, monkeypatch):
    monkeypatch.setattr("molrl.nonfinite.gradient_norm", lambda model: float("nan"))
    out = tmp_path / "run"
    assert main(["rl", *GRPO_TINY, f"output_dir={out}"]) == 1
    assert len(errors(caplog)) == 1 and errors(caplog)[0].startswith("step 1: the loss's gradient norm is nan")
    assert "sampling.temperature=0.9, train.learning_rate=" in errors(caplog)[0]
    assert not (out / "adapter").exists()


def _poison(model, where, hint):
    """``check_finite_weights`` after the first trained tensor has been filled with NaN."""
    with torch.no_grad():
        next(p for p in model.parameters() if p.requires_grad).fill_(float("nan"))
    check_finite_weights(model, where, hint)


@pytest.mark.parametrize("at", ["checkpoint", "final"])
def test_rl_non_finite_weights_are_never_saved(tmp_path, cli_logs, caplog, monkeypatch, at):
    monkeypatch.setattr("molrl.nonfinite.check_finite_weights", _poison)
    if at == "final":
        monkeypatch.setattr("molrl.nonfinite.NonFiniteGuard.on_step_end", lambda *args, **kwargs: None)
    out = tmp_path / "run"
    assert main(["rl", *GRPO_TINY, f"output_dir={out}"]) == 1
    where = "the checkpoint of step 1" if at == "checkpoint" else str(out / "adapter")
    assert len(errors(caplog)) == 1 and errors(caplog)[0].startswith(f"{where} not saved: 1 of ")
    assert not (out / "adapter").exists()
    assert at == "final" or not list((out / "checkpoints").glob("checkpoint-*"))
