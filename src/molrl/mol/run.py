"""``run_mol``: traces -> tokenised examples -> model (+ LoRA) -> MolTrainer -> adapter on disk.

Outputs in ``cfg.output_dir``: ``config.yaml`` (resolved), ``data_stats.json``, ``molrl_provenance.json`` (the
base, the lineage and the tasks its traces were collected on: ``molrl.records.provenance``; each checkpoint and the final
weights carry a copy inside), ``metrics.jsonl``
(one JSON object per logged step), ``checkpoints/checkpoint-N`` (a re-run resumes from the newest) with
the tensorboard logs under ``checkpoints/runs/``, as the RL stage keeps them, and the final ``adapter/``
(PEFT, loadable with plain peft) or ``model/`` (full fine-tuning). With ``loss.base_targets`` hidden or topk, the
base's targets are cached in ``loss.base_targets_dir`` (default ``base_targets/``), built before training when
missing (``molrl.mol.base_cache``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any

from molrl.config import ConfigError, check_values
from molrl.cpu import use_threads
from molrl.mol.config import MolConfig
from molrl.records.provenance import Provenance, TrainedTask, config_fingerprint, made, read_provenance, write_provenance
from molrl.records.rerun import CHECKPOINTS, NEW_RUN, save_run_config, training_rerun
from molrl.logs.trackers import report_backends
from molrl.config.training_args import training_arguments
from molrl.records.locks import folder_lock
from molrl.records.writes import write_folder, write_text

log = logging.getLogger(__name__)


def run_mol(cfg: MolConfig) -> Path:
    """Train per ``cfg`` (a re-run follows ``molrl.records.rerun``'s rule: finished, refused, extended or resumed); returns
    the output dir. One run at a time writes an output dir (``molrl.records.locks.folder_lock``)."""
    check_values(cfg, "MolConfig")
    check_config(cfg)
    out = Path(cfg.output_dir)
    with folder_lock(out, f"start a new run with {NEW_RUN['mol']}", stage="mol"):
        _train(cfg, out)
    return out


def _train(cfg: MolConfig, out: Path) -> None:
    """``run_mol``'s work, under the output's lock."""
    final = out / ("adapter" if cfg.lora.enabled else "model")
    rerun = training_rerun("mol", cfg, out, final, cfg.train.max_steps)
    if rerun.finished:
        return
    use_threads(cfg.threads, "mol")
    # torch, transformers and peft load only now: everything above (config, re-run rule) answers in well under a second
    from molrl.models import load_tokenizer
    from molrl.mol.data import check_feedback, load_examples
    from molrl.nonfinite import check_finite_weights
    from molrl.records.runfiles import ProvenanceCallback, drop_records_after, load_checkpoint

    save_run_config("mol", cfg, out / "config.yaml")
    tokenizer = load_tokenizer(cfg.model.path)
    examples, stats = load_examples(cfg.data.traces, tokenizer, cfg.data.max_length, cfg.thinking,
                                    cfg.data.exclude_benchmarks)
    summary = {k: v for k, v in dataclasses.asdict(stats).items() if k != "task_texts"}  # the texts: in the record
    write_text(out / "data_stats.json", json.dumps(summary, indent=2))
    record = provenance(cfg, stats)
    write_provenance(out, record)  # the tasks its traces came from: eval will not score them with these weights
    log.info("%d traces (%d general), %d tokens; %d without decision tokens, %d without feedback tokens, "
             "%d truncated to %d tokens", stats.traces, stats.general, stats.tokens, stats.without_decision,
             stats.without_feedback, stats.truncated, cfg.data.max_length)
    check_feedback(stats, cfg.loss.mode)

    trainer = build_trainer(cfg, examples, tokenizer)
    if cfg.loss.cached_base and not rerun.at_last_step:
        from molrl.mol.base_cache import prepare

        trainer.base_targets = prepare(cfg, examples, tokenizer, trainer)  # built here when missing, before training
    trainer.add_callback(ProvenanceCallback(record))  # each checkpoint carries it
    if trainer.is_world_process_zero():  # the one process that writes metrics.jsonl
        # Lines past the resumed step (all of them on a fresh start) are logged again by this run.
        drop_records_after(out / "metrics.jsonl", rerun.step)
    if rerun.at_last_step:  # killed after its last checkpoint, before the final weights: nothing left to train
        load_checkpoint(trainer, rerun.checkpoint)
    else:
        trainer.train(resume_from_checkpoint=rerun.checkpoint)
    if weights_dtype(cfg) != cfg.model.dtype:  # full fine-tuning trained float32 master weights: save in the asked dtype
        from molrl.models import DTYPES

        trainer.model.to(DTYPES[cfg.model.dtype])
    check_finite_weights(trainer.model, str(final), loss_scales(cfg))
    with write_folder(final, writer=trainer.is_world_process_zero()) as folder:  # whole, or not there at all
        trainer.save_model(str(folder))
        if trainer.is_world_process_zero():
            write_provenance(folder, record)
    log.info("saved %s", final)


def provenance(cfg: MolConfig, stats: Any) -> Provenance:
    """The record of the weights this run makes: its base (or the merged model's own record), and the tasks of its
    domain traces (``DataStats.benchmark_tasks``, ``task_keys`` and ``task_texts``)."""
    tasks = [TrainedTask(*entry) for entry in stats.benchmark_tasks]
    return made("mol", config_fingerprint(cfg), cfg.model.path, [read_provenance(cfg.model.path)], tasks,
                stats.task_keys, stats.task_texts)


def build_trainer(cfg: MolConfig, examples: list[dict[str, Any]], tokenizer: Any) -> Any:
    """The model (with LoRA, or plus a frozen reference for full fine-tuning) inside a ``MolTrainer``."""
    import torch
    from transformers import TrainingArguments, set_seed

    from molrl.logs.progress import use_trainer_progress
    from molrl.models import load_model
    from molrl.mol.data import MolCollator
    from molrl.mol.trainer import MolTrainer
    from molrl.nonfinite import NonFiniteGuard
    from molrl.records.runfiles import MetricsFileCallback, ResumedSchedule

    set_seed(cfg.train.seed)
    check_reference_room(cfg)
    model = load_model(cfg.model.path, dtype=weights_dtype(cfg), seed=cfg.model.seed)
    model.name_or_path = cfg.model.path  # recorded in adapter_config.json as the adapter's base
    ref_model = None
    if cfg.lora.enabled:
        model = _add_lora(model, cfg)
    elif cfg.loss.needs_base:
        from molrl.models import DTYPES

        ref_model = copy.deepcopy(model).to(DTYPES[cfg.model.dtype])  # frozen: held in the configured dtype
    trainer = MolTrainer(
        model=model,
        args=_training_arguments(cfg, TrainingArguments, torch.cuda.is_available()),
        train_dataset=examples,
        data_collator=MolCollator(tokenizer.pad_token_id),
        processing_class=tokenizer,
        callbacks=[MetricsFileCallback(Path(cfg.output_dir) / "metrics.jsonl"), NonFiniteGuard(loss_scales(cfg)),
                   ResumedSchedule()],
        loss_settings=cfg.loss,
        domain_general_ratio=cfg.data.domain_general_ratio,
        ref_model=ref_model,
    )
    figures = {"loss": "loss", "ce_feedback": "ce_fb", "kl_decision": "kl_dec"}
    use_trainer_progress(trainer, f"mol {Path(cfg.output_dir).name}", figures)
    return trainer


def loss_scales(cfg: MolConfig) -> str:
    """The config values a non-finite loss or gradient is most likely to come from, for its error line."""
    loss, train = cfg.loss, cfg.train
    return (f"loss.temperature={loss.temperature:g}, loss.ce_weight={loss.ce_weight:g}, "
            f"loss.kl_weight={loss.kl_weight:g}, train.learning_rate={train.learning_rate:g}")


def weights_dtype(cfg: MolConfig) -> str:
    """The dtype the trained model is loaded in: ``cfg.model.dtype``, except float32 for full fine-tuning.

    An optimiser step on bf16 weights rounds away every update below about 1/256 of the weight (at
    learning rate 1e-5, two AdamW steps left 85% of the tiny model's bf16 weights exactly unchanged),
    so full fine-tuning keeps float32 master weights and computes in bf16 under ``train.bf16``
    autocast, as DeepSpeed's bf16 mode does; the frozen reference and the saved model are in
    ``cfg.model.dtype``. With LoRA the base is frozen and PEFT keeps the adapter in float32 already.
    """
    if cfg.lora.enabled or cfg.model.dtype in ("float32", "fp32"):
        return cfg.model.dtype
    import torch

    if not cfg.train.mixed_bf16(cfg.model.dtype, torch.cuda.is_available()):
        log.warning("full fine-tuning with dtype=%s: the weights are trained in float32; set train.bf16=true to "
                    "compute in bf16", cfg.model.dtype)
    return "float32"


def check_config(cfg: MolConfig) -> None:
    """Config errors that can be found before anything is loaded."""
    if not cfg.data.traces:
        raise ConfigError("data.traces is empty: give one or more trace files (data.traces=[a.jsonl,b.jsonl])")
    for path in cfg.data.traces:
        if not Path(path).is_file():
            raise ConfigError(f"data.traces: {path}: file not found")
    if cfg.loss.temperature <= 0:
        raise ConfigError(f"loss.temperature={cfg.loss.temperature}: must be > 0")
    check_base_targets(cfg.loss)
    report_backends(cfg.train.report_to, "train.report_to")


def check_base_targets(loss: Any) -> None:
    """Refuse a top-K base at a temperature other than 1 (keys that would do nothing are refused by the config,
    ``molrl.config.idle``)."""
    if loss.base_targets == "topk" and loss.temperature != 1.0:
        raise ConfigError(f"loss.base_targets=topk with loss.temperature={loss.temperature:g}: the base's top K at "
                          "temperature 1 does not give its distribution at another; set loss.temperature=1, or use "
                          "loss.base_targets=hidden")


def check_reference_room(cfg: MolConfig, available_bytes: int | None = None) -> None:
    """Full fine-tuning with KL keeps a frozen copy of the model: refuse early if it cannot fit.

    Needed: fp32 policy weights (``weights_dtype``) + fp32 grads + two fp32 AdamW moments + the
    reference copy's weights in ``cfg.model.dtype``.
    """
    if cfg.lora.enabled or not cfg.loss.needs_base:
        return
    n_params = _count_parameters(cfg.model.path)
    reference_bytes = 2 if cfg.model.dtype in ("bfloat16", "bf16", "float16", "fp16") else 4
    needed = n_params * (4 + 4 + 8 + reference_bytes)
    available = available_bytes if available_bytes is not None else _available_memory()
    if needed > available:
        raise ConfigError(
            f"KL with full fine-tuning needs a frozen reference copy of {cfg.model.path}: about "
            f"{needed / 1e9:.1f} GB for policy, gradients, optimiser state and reference, but only "
            f"{available / 1e9:.1f} GB is free; use lora.enabled=true, loss.mode=ce / ce_feedback with "
            "loss.monitor_kl=false, or a larger device"
        )


def _count_parameters(name: str) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if name.startswith("tiny:"):
        from molrl.models import load_model

        return sum(p.numel() for p in load_model(name).parameters())
    config = AutoConfig.from_pretrained(name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def _available_memory() -> int:
    import torch

    if torch.cuda.is_available():
        free, _total = torch.cuda.mem_get_info()
        return int(free)
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _add_lora(model: Any, cfg: MolConfig) -> Any:
    from peft import LoraConfig, get_peft_model

    targets = cfg.lora.target_modules
    peft_config = LoraConfig(
        r=cfg.lora.rank, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
        target_modules=targets[0] if targets == ["all-linear"] else targets, task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, peft_config)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log.info("LoRA rank %d alpha %d on %s: %d trainable parameters", cfg.lora.rank, cfg.lora.alpha,
             ", ".join(targets), trainable)
    return model


def _training_arguments(cfg: MolConfig, cls: Any, cuda: bool) -> Any:
    """``cls`` (``TrainingArguments``) for MoL: the ``train`` block's shared fields (``molrl.config.training_args``), plus
    its set accumulation and epochs, and every column kept for the collator."""
    t = cfg.train
    return training_arguments(cls, t, cfg.model.dtype, Path(cfg.output_dir) / CHECKPOINTS, cuda,
                              gradient_accumulation_steps=t.grad_accumulation, num_train_epochs=t.epochs,
                              remove_unused_columns=False)
