"""``run_rl``: tasks -> prompts -> policy (+ reference) -> ``RlTrainer`` (molrl.rl.trainer) -> adapter on disk.

Outputs in ``cfg.output_dir``: ``config.yaml`` (resolved), ``data_summary.json`` (tasks kept and
left out), ``metrics.jsonl`` (one line per logged step: reward, per-stage reward fractions, KL,
timings, eval-hook results), ``completions.jsonl`` (one line per sampled completion with its
rewards and advantage), ``checkpoints/checkpoint-N`` (a re-run resumes from the newest) and the
final ``adapter/`` (PEFT; its base is ``policy.base`` for a plain base or ``continue``, the
merged MoL model for ``merge_new``, which therefore also writes the full merged ``model/``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from datasets import Dataset
from trl import GRPOConfig as TrlGRPOConfig

from molrl.config import save_config
from molrl.console import use_trainer_progress
from molrl.errors import MolrlError
from molrl.graders.code import CodeRewardConfig
from molrl.rl.callbacks import EvalHookCallback
from molrl.rl.config import RlConfig
from molrl.rl.data import build_prompt_rows, load_task_source
from molrl.rl.policy import build_policy
from molrl.rl.reference import install_reference, trainable_parameter_count
from molrl.rl.score import Scorer
from molrl.rl.trainer import RlTrainer
from molrl.runfiles import MetricsFileCallback, drop_records_after, last_whole_checkpoint
from molrl.sandbox import SandboxConfig, SandboxPool

log = logging.getLogger(__name__)


def run_rl(cfg: RlConfig) -> Path:
    """Train per ``cfg`` (resuming from its newest checkpoint); returns the output dir."""

    state = PartialState()  # under accelerate launch: this process's rank; files are written by rank 0
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    checkpoints = out / "checkpoints"
    resume = last_whole_checkpoint(checkpoints)
    if state.is_main_process:
        save_config(cfg, out / "config.yaml")
        if resume is not None:
            step = int(Path(resume).name.split("-")[-1])
            log.info("resuming from %s (step %d)", resume, step)
            for name in ("metrics.jsonl", "completions.jsonl"):
                drop_records_after(out / name, step)
        else:  # a fresh start logs every step again: lines of a killed attempt without a checkpoint go
            for name in ("metrics.jsonl", "completions.jsonl"):
                (out / name).unlink(missing_ok=True)
    state.wait_for_everyone()
    trainer, policy, pool = build_trainer(cfg)
    try:
        trainer.train(resume_from_checkpoint=resume)
        trainer.rollouts["train"].save_final(out)  # what the rollout policy left (partial rollouts: their buffer)
        _save_final(trainer, policy, out)
    finally:
        if pool is not None:
            pool.close()
    return out


def build_trainer(cfg: RlConfig) -> tuple[Any, Any, Any]:
    """The ready-to-train ``RlTrainer``, its ``Policy`` and the sandbox pool (None without code or toy tasks)."""

    if cfg.use_vllm and importlib.util.find_spec("vllm") is None:
        raise MolrlError("use_vllm=true but vllm is not installed: pip install 'molrl[gpu]' on a GPU machine, "
                         "or set use_vllm=false to generate with transformers")
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    policy = build_policy(cfg)
    eval_tasks = load_task_source(cfg.eval.tasks, "eval.tasks") if cfg.eval.every_steps > 0 else []
    dataset, scorer, pool = _prompts_and_scorer(cfg, policy.tokenizer, out, eval_tasks)
    try:
        callbacks: list[Any] = [MetricsFileCallback(out / "metrics.jsonl")]
        if eval_tasks:
            callbacks.append(EvalHookCallback.from_config(cfg, policy, eval_tasks, pool))
        trainer = RlTrainer(
            model=policy.model,
            scorer=scorer,
            config=cfg,
            args=trl_args(cfg, out / "checkpoints", torch.cuda.is_available()),
            train_dataset=dataset,
            processing_class=policy.tokenizer,
            peft_config=policy.peft_config,
            callbacks=callbacks,
            completions_path=out / "completions.jsonl",
        )
        use_trainer_progress(trainer, f"{cfg.algorithm} {out.name}", {"reward": "reward", "kl": "kl", "completions/mean_length": "len"})
        described = install_reference(trainer, cfg.policy.reference, policy.adapter_mode, policy.load_base)
    except BaseException:
        if pool is not None:
            pool.close()
        raise
    policy.trainer = trainer
    log.info("policy: %s; KL reference: %s; %d trainable parameters",
             policy.description, described, trainable_parameter_count(trainer.model))
    return trainer, policy, pool


def _prompts_and_scorer(cfg: RlConfig, tokenizer: Any, out: Path, eval_tasks: list) -> tuple[Any, Any, Any]:
    """The prompt dataset (summary in data_summary.json), the scorer, and the sandbox pool (shared with
    the evaluation hook, so it exists when either the training or the held-out tasks need it)."""

    tasks = load_task_source(cfg.train, "train")
    rows, summary = build_prompt_rows(
        tasks, tokenizer, enable_thinking=cfg.enable_thinking, max_prompt_length=cfg.max_prompt_length,
        code_template=cfg.code_prompt, math_template=cfg.math_prompt,
    )
    if PartialState().is_main_process:
        (out / "data_summary.json").write_text(json.dumps(dataclasses.asdict(summary), indent=2))
    if not rows:
        raise MolrlError(
            f"{cfg.train.path or cfg.train.format}: no task left to train on ({summary.tasks} read, "
            f"{len(summary.unscorable)} unscorable, {len(summary.too_long)} longer than max_prompt_length="
            f"{cfg.max_prompt_length}); see data_summary.json"
        )
    pool = None
    probes = cfg.algorithm == "opd" and cfg.opd.teacher == "feedback" and any(t.probe for t in tasks)
    if {t.kind for t in [*tasks, *eval_tasks]} & {"code", "toy"} or probes or cfg.rollout.turns > 1:
        pool = SandboxPool(SandboxConfig(workers=cfg.reward.sandbox_workers, timeout_s=cfg.reward.timeout_s))
    scorer = Scorer(pool, CodeRewardConfig(mode=cfg.reward.code_mode), cfg.reward.failure_reward)
    return Dataset.from_list(rows), scorer, pool


def trl_args(cfg: RlConfig, output_dir: Path, cuda: bool) -> Any:
    """TRL ``GRPOConfig`` for our config (one optimiser step = prompts_per_step groups per process)."""
    completions_per_step = cfg.prompts_per_step * cfg.num_generations
    return TrlGRPOConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=cfg.micro_batch_size,
        gradient_accumulation_steps=completions_per_step // cfg.micro_batch_size,
        num_generations=cfg.num_generations,
        max_completion_length=cfg.max_completion_length,
        mask_truncated_completions=cfg.mask_truncated_completions,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type=cfg.lr_scheduler,
        warmup_steps=cfg.warmup_steps,
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        beta=cfg.beta,
        epsilon=cfg.epsilon,
        num_iterations=cfg.num_iterations,
        max_steps=cfg.max_steps,
        seed=cfg.seed,
        gradient_checkpointing=cfg.gradient_checkpointing,
        activation_checkpointing=cfg.gradient_checkpointing,
        bf16=cuda and cfg.policy.dtype in ("bfloat16", "bf16"),
        fp16=False,
        use_cpu=not cuda,
        disable_dropout=True,
        logging_steps=cfg.log_every,
        report_to="none",
        save_strategy="steps",
        save_steps=cfg.save_steps,
        save_total_limit=2,
        use_vllm=cfg.use_vllm,
        vllm_mode=cfg.vllm_mode,
        vllm_server_base_url=cfg.vllm_server_url if cfg.vllm_mode == "server" else None,
        vllm_gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
        dataloader_num_workers=0,
    )


def _save_final(trainer: Any, policy: Any, out: Path) -> None:
    """adapter/ (the trained adapter only), plus model/ (fully merged) for merge_new; called on every rank."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    trainer.algorithm.save(model, out, trainer.accelerator.is_main_process)  # e.g. ppo's critic, beside the policy
    for frozen in trainer.frozen_adapters():  # TRL's reference, an algorithm's teacher or critic, PROPS' phi
        if frozen in getattr(model, "peft_config", {}):
            model.delete_adapter(frozen)
    trainer.save_model(str(out / "adapter"))  # gathers sharded (ZeRO / FSDP) weights; rank 0 writes
    if trainer.accelerator.is_main_process:
        policy.tokenizer.save_pretrained(str(out / "adapter"))
        if policy.adapter_mode == "merge_new":
            merged = model.merge_and_unload()
            merged.save_pretrained(str(out / "model"))
            policy.tokenizer.save_pretrained(str(out / "model"))
        log.info("saved %s", out / "adapter")
    trainer.accelerator.wait_for_everyone()


