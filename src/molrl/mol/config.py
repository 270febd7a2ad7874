"""``MolConfig``: everything one MoL continual-training run needs, typed and documented."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar, Literal

from molrl.config_blocks import ModelSource, as_model_source
from molrl.config_ranges import (MAX_COUNT, Count, Dropout, LearningRate, Optimizer, Probability, Range,
                                 RunDir, Scheduler, Seed, Size, TargetModules, Temperature, Threads, Weight)

Mode = Literal["mol", "ce", "ce_feedback"]
Direction = Literal["reverse", "forward"]


@dataclass(frozen=True)
class LossSettings:
    """How the MoL loss (``molrl.mol.losses``) is formed: the loss part of ``MolConfig``."""

    mode: Mode = "mol"
    """mol: CE on feedback + KL on decisions; ce: CE on both; ce_feedback: CE on feedback only."""
    ce_weight: Weight = 1.0
    """Weight of the cross-entropy term."""
    kl_weight: Weight = 1.0
    """Weight of the KL term (mode mol only)."""
    kl_direction: Direction = "reverse"
    """reverse: KL(p_theta || p_base); forward: KL(p_base || p_theta)."""
    temperature: Temperature = 1.0
    """Both distributions of the KL are taken at this temperature (CE is always at 1)."""
    chunk_size: Size = 0
    """Positions per logits chunk; 0 picks one from the vocabulary size."""
    monitor_kl: bool = True
    """In the ce modes, still measure the decision-token KL (needs the base forward) for logging."""

    @property
    def needs_base(self) -> bool:
        """Whether the frozen base model's hidden states are needed."""
        return self.mode == "mol" or self.monitor_kl


@dataclass
class LoraConfig:
    """LoRA adapter settings (the MoL-RL paper's defaults: rank 64 on all linear layers)."""

    enabled: bool = True
    """Train a LoRA adapter; false means full fine-tuning (KL then needs a frozen copy of the model)."""
    rank: Annotated[int, Range(1, 4096)] = 64
    """Adapter rank r."""
    alpha: Annotated[int, Range(1, 1_000_000)] = 128
    """Scaling numerator: updates are scaled by alpha / rank."""
    dropout: Dropout = 0.05
    """Dropout on the adapter's input."""
    target_modules: TargetModules = field(default_factory=lambda: ["all-linear"])
    """Module names to adapt; ``all-linear`` means every linear layer except the output head.

    ``lm_head`` may be listed with ``dropout`` 0: the loss applies the head's adapter as a merged
    weight (one extra [vocab, hidden] tensor and its gradient), which cannot drop inputs out.
    """


@dataclass
class DataConfig:
    """Which traces to train on and how they become tokens."""

    traces: list[str] = field(default_factory=list)
    """Trace files (JSONL, molrl trace schema) to train on."""
    max_length: Count = 4096
    """Longest tokenised trace kept; longer traces are truncated (the count is logged)."""
    domain_general_ratio: list[Annotated[int, Range(0, 1_000_000)]] = field(default_factory=lambda: [1, 1])
    """Domain:general examples per batch stream when general-tagged traces exist."""


@dataclass
class TrainConfig:
    """Optimisation and bookkeeping (forwarded to ``transformers.TrainingArguments``)."""

    optim: Optimizer = "adamw_torch"
    """Optimiser name understood by transformers (adamw_torch, sgd, adamw_torch_fused, ...)."""
    learning_rate: LearningRate = 1e-4
    """Peak learning rate."""
    lr_scheduler: Scheduler = "cosine"
    """Learning-rate schedule name understood by transformers."""
    warmup_ratio: Probability = 0.03
    """Fraction of steps spent warming the learning rate up."""
    weight_decay: Weight = 0.0
    """AdamW weight decay."""
    max_grad_norm: Annotated[float, Range(0, 1e6)] = 1.0
    """Gradient clipping norm; 0 disables clipping."""
    epochs: Annotated[float, Range(0, 1e6, low_open=True)] = 1.0
    """Passes over the domain traces (ignored when max_steps > 0)."""
    max_steps: Annotated[int, Range(1, MAX_COUNT, also=(-1,))] = -1
    """Optimiser steps to run; -1 means run ``epochs``."""
    micro_batch_size: Count = 1
    """Traces per forward pass on each process."""
    grad_accumulation: Count = 8
    """Micro-batches per optimiser step on each process."""
    seed: Seed = 0
    """Seed for data order, adapter initialisation and dropout."""
    bf16: bool = False
    """Train in bfloat16 mixed precision."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory."""
    logging_steps: Count = 1
    """Log every this many optimiser steps."""
    save_steps: Count = 50
    """Write a resumable checkpoint every this many optimiser steps."""
    save_total_limit: Count = 2
    """Checkpoints kept on disk (oldest deleted first)."""
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Logging backends (tensorboard, wandb, ...); ``none`` for console and metrics.jsonl only."""
    resume: Literal["auto", "never"] = "auto"
    """``auto`` continues from the newest checkpoint in output_dir/checkpoints when there is one."""


@dataclass
class MolConfig:
    """A MoL continual-training run: model, traces, loss, adapter and optimisation."""

    model: ModelSource = field(default_factory=lambda: ModelSource("tiny:chatml"))
    """The base model (``model: PATH`` for short) and its dtype; MoL trains a new adapter, so ``model.adapter`` is
    refused (merge one first: ``molrl export --adapter``)."""
    output_dir: RunDir = Path("runs/mol")
    """Where the adapter (or full model), checkpoints/, config.yaml and metrics.jsonl go."""
    data: DataConfig = field(default_factory=DataConfig)
    """Training traces."""
    thinking: bool = False
    """Render the traces with the chat template's thinking on (Qwen3-style: the model may open a <think> block) as
    they were collected; off, the default in every stage, puts the template's empty think block before each
    answer."""
    loss: LossSettings = field(default_factory=LossSettings)
    """Loss mode, weights, KL direction and temperature."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Adapter settings."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Optimisation settings."""
    threads: Threads | None = None
    """Torch CPU threads; none: as many as cores are idle, re-measured while it runs (molrl.cpu)."""

    RENAMED_KEYS: ClassVar[dict[str, tuple[str, Callable[[Any], Any]]]] = {
        "dtype": ("model.dtype", lambda v: v), "data.enable_thinking": ("thinking", lambda v: v)}

    def __post_init__(self) -> None:
        self.model = as_model_source(self.model)
        if self.model.adapter is not None:
            raise ValueError(f"model.adapter={self.model.adapter}: MoL trains a new adapter on the base; merge that "
                             "one into the base first (molrl export --adapter DIR --out MERGED) and train from MERGED")
