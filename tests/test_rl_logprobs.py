"""The RL stage's sampling log-probs come from one module at one temperature (``molrl.rl.logprobs``)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from grpo_helpers import save_tiny_model, toy_config

RL = Path(__file__).resolve().parents[1] / "src" / "molrl" / "rl"


def test_only_the_logprobs_module_reads_the_temperature_or_computes_sampling_log_probs():
    """Every file of the RL package, enumerated: the trainer's temperature, TRL's log-prob computation and a fused
    head at a temperature appear in ``logprobs.py`` alone (the rollout config's own key aside)."""
    patterns = [r"trainer\.temperature", r"self\.temperature", r"_get_per_token_logps_and_entropies\(",
                r"add_fused_lm_head\(", r"/ *temperature\b"]
    found = {}
    for path in sorted(RL.rglob("*.py")):
        if path.name == "logprobs.py":
            continue
        text = path.read_text()
        hits = [p for p in patterns if re.search(p, text)]
        if hits:
            found[str(path.relative_to(RL))] = hits
    assert found == {}


def test_completion_log_probs_are_log_softmax_of_the_logits_over_the_sampling_temperature(tmp_path):
    from molrl.rl.run import build_trainer

    cfg = toy_config(tmp_path / "run", save_tiny_model(tmp_path / "base"), temperature=0.7)
    trainer, _, pool = build_trainer(cfg)
    try:
        torch.manual_seed(0)
        prompt = torch.randint(3, 200, (2, 5))
        completion = torch.randint(3, 200, (2, 4))
        ones = torch.ones_like
        got = trainer.logprobs.completion(trainer.model, prompt, ones(prompt), completion, ones(completion))
        with torch.no_grad():
            logits = trainer.model(input_ids=torch.cat([prompt, completion], 1)).logits[:, 4:-1].float()  # [2, 4, V]
        want = torch.log_softmax(logits / 0.7, -1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)
        assert trainer.logprobs.temperature == 0.7
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(trainer.logprobs.tempered(logits), logits / 0.7)
    finally:
        pool.close()
