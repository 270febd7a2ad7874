"""The rl stage's one seam to the engines: which engine, the policy on it, and the canary that checks it.

The engines live in ``molrl.engines`` (the in-process vLLM policy in ``molrl.engines.policy``, the server tier's in
``molrl.engines.server.policy``, each named by its registry line); this module chooses one by the one rule
(``molrl.engines.choice``), gives it what it needs of the run's config (``policy_spec``), makes it the trainer's
generation (TRL's ``rollout_func``) and hands it RL's own check: the canary, which at the first sync after the adapter
has moved samples a few tokens through the engine and stops a run whose engine samples from the base. An engine with
no policy line (transformers) leaves generation to the trainer's own model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from molrl.engines.choice import EngineChoice, choose
from molrl.engines.policy import CANARY_TOKENS, PolicySpec
from molrl.engines.registry import BACKENDS
from molrl.errors import MolrlError
from molrl.rl.config import RlConfig


def rl_engine(cfg: RlConfig, *, installed: bool | None = None, gpu: bool | None = None) -> EngineChoice:
    """The engine the rl stage generates with: ``cfg.engine`` as the one choice rule (``molrl.engines.choice``)
    decides it for the run's tokens (steps x prompts x G x ``sampling.max_new_tokens``) and its rollout settings."""
    work = cfg.train.max_steps * cfg.prompts_per_step * cfg.sampling.n * cfg.sampling.max_new_tokens
    return choose("rl", cfg, work, installed=installed, gpu=gpu)


def sync_folder(cfg: RlConfig) -> Path:
    """Where the adapters (and a merge_new base) are saved for the servers: ``engine_sync_dir``, or
    ``output_dir/engine_sync``."""
    return Path(cfg.engine_sync_dir) if cfg.engine_sync_dir else Path(cfg.output_dir) / "engine_sync"


def policy_spec(cfg: RlConfig, vocab_size: int | None = None) -> PolicySpec:
    """What a policy engine reads of ``cfg`` (``vocab_size``: the ids a server's reply may hold)."""
    from molrl.rl.adapter_lora import resolve_adapter_dir

    m, s = cfg.model, cfg.sampling
    adapter = resolve_adapter_dir(m.adapter) if m.adapter is not None else None
    merged = adapter is not None and m.adapter_mode == "merge_new"
    return PolicySpec(model=str(m.path), adapter=adapter, merged_base=merged, dtype=m.dtype, seed=cfg.train.seed,
                      temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                      max_new_tokens=s.max_new_tokens, max_model_len=cfg.max_prompt_length + s.max_new_tokens,
                      gpu_memory_utilization=cfg.engine_gpu_memory_utilization, servers=tuple(cfg.engine_servers),
                      sync_dir=sync_folder(cfg), vocab_size=vocab_size)


def attach_engine(trainer: Any, cfg: RlConfig, name: str) -> Any:
    """Start engine ``name``'s policy (its registry line's) for ``trainer``'s policy, with the canary as its check,
    and make it the trainer's generation (TRL's ``rollout_func``); None for an engine without one."""
    backend = BACKENDS[name]
    if backend.policy is None:
        return None
    from molrl.models import sampled_ids

    model = trainer.accelerator.unwrap_model(trainer.model)
    peft = model.peft_config[model.active_adapter]
    targets = peft.target_modules
    config_vocab = getattr(getattr(trainer.model, "config", None), "vocab_size", None)
    vocab_size = sampled_ids(trainer.processing_class, config_vocab=config_vocab)  # the ids a reply may hold
    engine = backend.load("policy")(policy_spec(cfg, vocab_size), int(peft.r),
                                    [targets] if isinstance(targets, str) else list(targets))
    engine.check = canary
    trainer.engine, trainer.rollout_func = engine, engine.rollout
    return engine


def canary(engine: Any, trainer: Any, step: int) -> None:
    """Stop the run ("engine on the base") if the engine's log-probs of a few tokens it samples after one fixed
    prompt (the first training prompt) are nearer the base's than the trained adapter's, or are not finite;
    undecided while the adapter is too near its base to tell (``molrl.rl.mismatch.canary_verdict``), it asks again
    at the next sync."""
    import torch
    from trl.trainer.utils import use_adapter

    from molrl.rl.batch import pad_rows
    from molrl.rl.mismatch import canary_message, canary_verdict

    if not trainer.prompt_ids:  # no dataset prompt to ask with
        engine.canary_decided = True
        return
    prompt = list(next(iter(trainer.prompt_ids.values())))
    out = engine.sample_ids(prompt, CANARY_TOKENS, trainer.logprobs.temperature)
    if not out.ids:
        return
    device = trainer.accelerator.device
    rows = (*pad_rows([prompt], trainer.processing_class.pad_token_id, "left", device),
            *pad_rows([out.ids], trainer.processing_class.pad_token_id, "right", device))
    adapter = trainer.logprobs.completion(trainer.model, *rows)[0]  # [n] under the trained adapter, at T
    with use_adapter(trainer.accelerator.unwrap_model(trainer.model), adapter_name=None):  # the adapter off
        base = trainer.logprobs.completion(trainer.model, *rows)[0]  # [n] under the engine's base, at T
    verdict = canary_verdict(torch.tensor(out.logps), adapter.float().cpu(), base.float().cpu())
    engine.canary_decided = verdict.decided
    if verdict.failed:
        raise MolrlError(canary_message(step, verdict))
