"""Shared pieces of the GRPO tests: a tiny model directory that can learn, a MoL-style adapter, configs."""

from __future__ import annotations

from pathlib import Path

import torch

from molrl.rl.config import RlConfig, TaskSource, rl_lora, rl_sampling, rl_train


def save_tiny_model(path: Path, eos_logit: float | None = None) -> Path:
    """A tiny ChatML model saved as an HF directory.

    Initialised with std 0.1 instead of 0.02: at 0.02 the tied output embeddings are so small that
    every next-token distribution is near uniform and a LoRA update barely moves it. ``eos_logit``
    (for example 2.0) gives EOS about that logit at a typical state, so completions end at varied
    lengths (``molrl.tiny.with_eos_logit``).
    """
    from molrl.tiny import build_tiny_pair, with_eos_logit

    model, tok = build_tiny_pair("chatml", initializer_range=0.1)
    if eos_logit is not None:
        with_eos_logit(model, tok.eos_token_id, eos_logit)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def save_mol_adapter(base: Path, path: Path, seed: int = 1) -> Path:
    """A LoRA adapter with random non-zero weights on ``base``, saved like the MoL stage's adapter/."""
    from peft import LoraConfig, get_peft_model

    from molrl.models import load_model

    torch.manual_seed(seed)
    model = get_peft_model(load_model(str(base)), LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False,
        task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    model.save_pretrained(path / "adapter")
    return path


def toy_config(out: Path, base: Path, *, max_steps: int = 3, save_steps: int = 1000, micro_batch_size: int = 8,
               n: int = 8, max_new_tokens: int = 8, temperature: float = 0.9, **overrides) -> RlConfig:
    """A short toy-task run on ``base`` (8 completions of 8 tokens per step); ``max_steps``, ``save_steps`` and
    ``micro_batch_size`` go to its ``train`` section, ``n``, ``max_new_tokens`` and ``temperature`` to its
    ``sampling``."""
    settings = dict(
        output_dir=out,
        model=str(base),
        lora=rl_lora(rank=16, alpha=32),
        data=TaskSource(format="toy", limit=32),
        sampling=rl_sampling(n=n, max_new_tokens=max_new_tokens, temperature=temperature),
        max_prompt_length=256,
        train=rl_train(learning_rate=2e-2, max_steps=max_steps, save_steps=save_steps,
                            micro_batch_size=micro_batch_size),
    )
    settings.update(overrides)
    cfg = RlConfig(**settings)
    cfg.sandbox.workers = 2
    # the checker is a one-line program: past 10 s only load stops it, and a run that left one task out of its loss
    # could not equal the run it is compared with
    cfg.sandbox.timeout_s = 120.0
    return cfg


def kill_when(script: str, marker: Path, limit_s: float = 600.0) -> None:
    """Run ``script`` in a one-thread Python process and SIGKILL it as soon as ``marker`` exists."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + limit_s
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert marker.exists(), proc.stderr.read().decode()[-2000:] if proc.poll() is not None else "no checkpoint in time"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def loss_inputs(advantages, mask, behaviour=None, reference=None, weights=None):
    """The ``LossInputs`` the policy loss reads, for tensors of [B, T] (ids: zeros, unread by the loss)."""
    from molrl.rl.batch import LossInputs

    ids = torch.zeros(mask.shape, dtype=torch.long)
    return LossInputs(ids[:, :1], torch.ones_like(ids[:, :1]), ids, mask, advantages, behaviour_logps=behaviour,
                      reference_logps=reference, weights=weights)
