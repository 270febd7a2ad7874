"""``training_arguments``: the one builder of the training arguments of MoL and RL.

Both training stages run on ``transformers.Trainer`` (MoL directly, RL under TRL's ``GRPOTrainer``), so the ``train``
block (``molrl.config.blocks.TrainConfig``) maps onto the same ``TrainingArguments`` fields in both, here once. A
stage adds only what is its own: how many micro-batches a step accumulates, MoL's epochs, TRL's GRPO settings. A stage
that names a shared field again is refused, so the two cannot drift apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from molrl.config.blocks import TrainConfig
from molrl.logs.trackers import report_backends


def shared_fields(train: TrainConfig, dtype: str, output_dir: Path, cuda: bool) -> dict[str, Any]:
    """The ``TrainingArguments`` fields the ``train`` block decides, the same in every training stage (``dtype``:
    the model's, for bf16's default; ``output_dir``: where checkpoints go; ``cuda``: a GPU is there)."""
    bf16 = train.mixed_bf16(dtype, cuda)
    return {
        "output_dir": str(output_dir),
        "per_device_train_batch_size": train.micro_batch_size,
        "optim": train.optim,
        "learning_rate": train.learning_rate,
        "lr_scheduler_type": train.lr_scheduler,
        "warmup_steps": train.warmup(),
        "weight_decay": train.weight_decay,
        "max_grad_norm": train.max_grad_norm,
        "max_steps": train.max_steps,
        "seed": train.seed,
        "data_seed": train.seed,
        "bf16": bf16,
        "fp16": False,
        # both names: TRL's configs default the older one to True, transformers reads the newer
        "activation_checkpointing": train.gradient_checkpointing,
        "gradient_checkpointing": train.gradient_checkpointing,
        "logging_steps": train.logging_steps,
        "report_to": report_backends(train.report_to, "train.report_to"),
        "save_strategy": "steps",
        "save_steps": train.save_steps,
        "save_total_limit": train.save_total_limit,
        "use_cpu": not cuda,
        "dataloader_num_workers": 0,
    }


def training_arguments(cls: Any, train: TrainConfig, dtype: str, output_dir: Path, cuda: bool,
                       **stage: Any) -> Any:
    """``cls`` (``TrainingArguments`` or TRL's ``GRPOConfig``) from the ``train`` block's shared fields and the
    stage's own ``stage`` fields; a stage field that is a shared one is a programming error, refused."""
    shared = shared_fields(train, dtype, output_dir, cuda)
    both = sorted(set(shared) & set(stage))
    if both:
        raise TypeError(f"training_arguments: {', '.join(both)} come from the train block; a stage may not set them")
    return cls(**shared, **stage)
