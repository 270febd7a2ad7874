"""``run_rl``: tasks -> prompts -> policy (+ reference) -> ``RlTrainer`` (molrl.rl.trainer) -> adapter on disk.

Outputs in ``cfg.output_dir``: ``config.yaml`` (resolved), ``data_summary.json`` (tasks kept and
left out), ``molrl_provenance.json`` (base, lineage and the tasks trained on, the MoL run's included:
``molrl.records.provenance``; each checkpoint and the final weights carry a copy inside),
``metrics.jsonl`` (one line per logged step: reward, per-stage reward fractions, KL,
timings, eval-hook results; also to ``train.report_to``'s backends: tensorboard event files under
``checkpoints/runs/`` by default), ``completions.jsonl`` (one line per sampled completion with its
rewards and advantage), ``checkpoints/checkpoint-N`` (a re-run resumes from the newest) and the
final ``adapter/`` (PEFT; its base is ``model.path`` for a plain base or ``continue``, the
merged MoL model for ``merge_new``, which therefore also writes the full merged ``model/``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from molrl.config import check_values
from molrl.cpu import use_threads
from molrl.errors import MolrlError
from molrl.records.provenance import config_fingerprint, made, read_provenance, trained_on, write_provenance
from molrl.records.rerun import CHECKPOINTS, NEW_RUN, save_run_config, training_rerun
from molrl.rl.adapter_lora import take_adapter_lora
from molrl.rl.config import RlConfig
from molrl.tasks.held_out import shows_tests
from molrl.logs.trackers import report_backends
from molrl.config.training_args import training_arguments
from molrl.records.locks import folder_lock
from molrl.records.writes import write_folder, write_text

log = logging.getLogger(__name__)

# torch, accelerate, datasets, TRL and peft are imported inside the functions that train: a re-run that is
# refused or already finished answers before any of them loads (several seconds).


def run_rl(cfg: RlConfig) -> Path:
    """Train per ``cfg`` (a re-run follows ``molrl.records.rerun``'s rule: finished, refused, extended or resumed); returns
    the output dir. One run at a time writes an output dir (``molrl.records.locks.folder_lock``)."""
    check_values(cfg, "RlConfig")
    out = Path(cfg.output_dir)
    report_backends(cfg.train.report_to, "train.report_to")  # a backend that is not installed stops the run now
    take_adapter_lora(cfg)
    with folder_lock(out, f"start a new run with {NEW_RUN['rl']}", stage="rl"), _sync_dir_held(cfg, out):
        _train(cfg, out)
    return out


def _sync_dir_held(cfg: RlConfig, out: Path) -> contextlib.AbstractContextManager[None]:
    """With an engine that loads adapters from ``engine_sync_dir`` (vllm_server), the lock of that folder, held for this
    run: a second run given the same folder is refused in one line, before anything loads. None otherwise, or when
    that folder is the output folder, held with it."""
    from molrl.engines.registry import able

    if not able({cfg.engine}, "sync_dir"):
        return contextlib.nullcontext()
    from molrl.rl.engine import sync_folder

    folder = sync_folder(cfg)
    if folder.resolve() == out.resolve():
        return contextlib.nullcontext()
    return folder_lock(folder, "give each run its own engine_sync_dir (unset, it is engine_sync under output_dir)")


def _train(cfg: RlConfig, out: Path) -> None:
    """``run_rl``'s work, under the output's lock."""
    rerun = training_rerun("rl", cfg, out, out / "adapter", cfg.train.max_steps)
    if rerun.finished:
        return
    use_threads(cfg.threads, "rl")
    from accelerate import PartialState

    from molrl.records.runfiles import drop_records_after, load_checkpoint

    state = PartialState()  # under accelerate launch: this process's rank; files are written by rank 0
    out.mkdir(parents=True, exist_ok=True)
    if state.is_main_process:
        save_run_config("rl", cfg, out / "config.yaml")
        for name in ("metrics.jsonl", "completions.jsonl"):
            if rerun.checkpoint is not None:
                drop_records_after(out / name, rerun.step)
            else:  # a fresh start logs every step again: lines of a killed attempt without a checkpoint go
                (out / name).unlink(missing_ok=True)
    state.wait_for_everyone()
    trainer, policy, pool = build_trainer(cfg)
    try:
        if rerun.at_last_step:  # killed after its last checkpoint, before the final save: nothing left to train
            trainer.rollouts["train"].load_state(Path(rerun.checkpoint))
            trainer.algorithm.load_state(Path(rerun.checkpoint))
            load_checkpoint(trainer, rerun.checkpoint)
        else:
            trainer.train(resume_from_checkpoint=rerun.checkpoint)
        trainer.rollouts["train"].save_final(out)  # what the rollout policy left (partial rollouts: their buffer)
        _save_final(trainer, policy, out, loss_scales(cfg))
    finally:
        if pool is not None:
            pool.close()
        if trainer.engine is not None:
            trainer.engine.close()


def build_trainer(cfg: RlConfig) -> tuple[Any, Any, Any]:
    """The ready-to-train ``RlTrainer``, its ``Policy`` and the sandbox pool (None without code or toy tasks)."""

    import torch

    from molrl.rl.callbacks import EvalHookCallback
    from molrl.tasks.source import load_task_source
    from molrl.rl.policy import build_policy
    from molrl.rl.reference import install_reference, trainable_parameter_count
    from molrl.rl.trainer import RlTrainer
    from molrl.nonfinite import NonFiniteGuard
    from molrl.records.runfiles import MetricsFileCallback, ProvenanceCallback, ResumedSchedule
    from molrl.logs.progress import use_trainer_progress

    from molrl.rl.engine import attach_engine, rl_engine
    from molrl.rl.score import completions_made_by

    engine = rl_engine(cfg)  # before anything loads: engine=vllm without vLLM stops here
    engine.log("rl", cfg)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    policy = build_policy(cfg)
    eval_tasks = load_task_source(cfg.eval.data, "eval.data") if cfg.eval.every_steps > 0 else []
    dataset, scorer, pool, record = _prompts_and_scorer(cfg, policy.tokenizer, out, eval_tasks)
    if cfg.lora.dropout > 0:
        log.warning("lora.dropout=%s: dropout stays on while training, so the loss's log-probs differ from the "
                    "sampler's by its noise (and so does rollout.sampling_error); 0 turns every dropout off",
                    cfg.lora.dropout)
    trainer = None
    try:
        callbacks: list[Any] = [MetricsFileCallback(out / "metrics.jsonl"), NonFiniteGuard(loss_scales(cfg)),
                                ResumedSchedule(), ProvenanceCallback(record)]
        if eval_tasks:
            callbacks.append(EvalHookCallback.from_config(cfg, policy, eval_tasks, pool))
        trainer = RlTrainer(
            model=policy.model,
            scorer=scorer,
            config=cfg,
            args=trl_args(cfg, out / CHECKPOINTS, torch.cuda.is_available()),
            train_dataset=dataset,
            processing_class=policy.tokenizer,
            peft_config=policy.peft_config,
            callbacks=callbacks,
            completions_path=out / "completions.jsonl",
            made_by=completions_made_by(cfg, engine.name),
        )
        use_trainer_progress(trainer, f"{cfg.algorithm} {out.name}", {"reward": "reward", "kl": "kl", "completions/mean_length": "len"})
        described = install_reference(trainer, cfg.model.reference, policy.adapter_mode, policy.load_base)
        attach_engine(trainer, cfg, engine.name)  # the in-process engine or the servers; none for transformers
    except BaseException:
        if pool is not None:
            pool.close()
        if trainer is not None and trainer.engine is not None:
            trainer.engine.close()
        raise
    policy.trainer = trainer
    log.info("policy: %s; KL reference: %s; %d trainable parameters",
             policy.description, described, trainable_parameter_count(trainer.model))
    return trainer, policy, pool


def _prompts_and_scorer(cfg: RlConfig, tokenizer: Any, out: Path, eval_tasks: list) -> tuple[Any, Any, Any, Any]:
    """The prompt dataset (summary in data_summary.json), the scorer, the sandbox pool (shared with
    the evaluation hook, so it exists when either the training or the held-out tasks need it) and the provenance
    record of the weights the run makes (in the run folder; each checkpoint and the adapter get a copy)."""
    from accelerate import PartialState
    from datasets import Dataset

    from molrl.graders.code import CodeRewardConfig
    from molrl.rl.algorithms import ALGORITHMS
    from molrl.rl.data import build_prompt_rows
    from molrl.tasks.source import load_task_source
    from molrl.rl.score import Scorer
    from molrl.sandbox import SandboxPool

    tasks = load_task_source(cfg.data, "data")
    record = made("rl", config_fingerprint(cfg), cfg.model.path,
                  [read_provenance(cfg.model.path), read_provenance(cfg.model.adapter)], *trained_on(tasks))
    rows, summary = build_prompt_rows(
        tasks, tokenizer, enable_thinking=cfg.thinking, max_prompt_length=cfg.max_prompt_length,
        code_template=cfg.code_prompt, math_template=cfg.math_prompt,
        hold_back_tests=shows_tests(cfg.episode.max_turns, cfg.episode),
        keep_constant_answer=cfg.reward.constant_answer_tasks,
    )
    if PartialState().is_main_process:
        write_text(out / "data_summary.json", json.dumps(dataclasses.asdict(summary), indent=2))
        write_provenance(out, record)  # what eval refuses to score with these weights
    if not rows:
        raise MolrlError(
            f"{cfg.data.path or cfg.data.format}: no task left to train on ({summary.tasks} read, "
            f"{len(summary.unscorable)} unscorable, {len(summary.too_long)} longer than max_prompt_length="
            f"{cfg.max_prompt_length}); see data_summary.json"
        )
    pool = None
    runs_code = ALGORITHMS[cfg.algorithm].runs_code(cfg, tasks)
    if {t.kind for t in [*tasks, *eval_tasks]} & {"code", "toy"} or runs_code or cfg.episode.max_turns > 1:
        pool = SandboxPool(cfg.sandbox)
    scorer = Scorer(pool, CodeRewardConfig(mode=cfg.reward.code_mode))
    return Dataset.from_list(rows), scorer, pool, record


def trl_args(cfg: RlConfig, output_dir: Path, cuda: bool) -> Any:
    """TRL ``GRPOConfig`` for our config (one optimiser step = prompts_per_step groups per process); TRL's own vLLM
    is never used: molrl's engines are attached to the trainer (``molrl.rl.engine``)."""
    from trl import GRPOConfig as TrlGRPOConfig

    completions_per_step, t, sp = cfg.prompts_per_step * cfg.sampling.n, cfg.train, cfg.sampling
    return training_arguments(
        TrlGRPOConfig, t, cfg.model.dtype, output_dir, cuda,
        gradient_accumulation_steps=completions_per_step // t.micro_batch_size,
        num_generations=sp.n,
        max_completion_length=sp.max_new_tokens,
        mask_truncated_completions=cfg.mask_truncated_completions,
        temperature=sp.temperature,
        top_p=sp.top_p,
        top_k=sp.top_k,
        beta=cfg.beta,
        epsilon=cfg.epsilon,
        num_iterations=cfg.num_iterations,
        disable_dropout=cfg.lora.dropout == 0,  # a LoRA dropout the user set stays on (TRL turns every dropout off)
        use_vllm=False,
    )


def loss_scales(cfg: RlConfig) -> str:
    """The config values a non-finite loss or gradient is most likely to come from, for its error line."""
    return (f"sampling.temperature={cfg.sampling.temperature:g}, train.learning_rate={cfg.train.learning_rate:g}, beta={cfg.beta:g}, "
            f"algorithm={cfg.algorithm}")


def _save_final(trainer: Any, policy: Any, out: Path, scales: str) -> None:
    """adapter/ (the trained adapter only), plus model/ (fully merged) for merge_new, refused when not finite
    (``scales`` names the settings to change); called on every rank."""
    from molrl.nonfinite import check_finite_weights

    model = trainer.accelerator.unwrap_model(trainer.model)
    trainer.algorithm.save(model, out, trainer.accelerator.is_main_process)  # e.g. ppo's critic, beside the policy
    for frozen in trainer.frozen_adapters():  # TRL's reference, an algorithm's teacher or critic, PROPS' phi
        if frozen in getattr(model, "peft_config", {}):
            model.delete_adapter(frozen)
    check_finite_weights(model, str(out / "adapter"), scales)
    main = trainer.accelerator.is_main_process
    # adapter/ is renamed into place last: its presence means the run finished (molrl.records.rerun.whole_weights)
    with write_folder(out / "adapter", writer=main) as adapter:
        trainer.save_model(str(adapter))  # gathers sharded (ZeRO / FSDP) weights; rank 0 writes
        if main:
            policy.tokenizer.save_pretrained(str(adapter))
            write_provenance(adapter, read_provenance(out))  # the run's record, written at its start
        if main and policy.adapter_mode == "merge_new":
            with write_folder(out / "model") as merged_dir:
                model.merge_and_unload().save_pretrained(str(merged_dir))
                policy.tokenizer.save_pretrained(str(merged_dir))
                write_provenance(merged_dir, read_provenance(out))
    if main:
        log.info("saved %s", out / "adapter")
    trainer.accelerator.wait_for_everyone()
