"""``MolConfig``: everything one MoL continual-training run needs, typed and documented."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar, Literal

from molrl.config.strict import seal
from molrl.config.blocks import ModelWeights, MolLoraConfig, MolTrainConfig, as_model_source
from molrl.config.idle import check_idle
from molrl.config.renames import Retired
from molrl.config.ranges import Count, Range, RunDir, Size, Temperature, Threads, Weight

Mode = Literal["mol", "ce", "ce_feedback"]
Direction = Literal["reverse", "forward"]
BaseTargets = Literal["live", "hidden", "topk"]


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
    base_targets: BaseTargets = "live"
    """Where the KL's base distribution comes from: live, the frozen base run beside every step; hidden, the base's
    final hidden states at the KL's tokens, computed once and cached (the KL stays exact); topk, the base's top
    loss.base_topk log-probs and the tail's mass, cached (the KL over K + 1 classes; temperature 1 only)."""
    base_targets_dir: RunDir | None = None
    """The store of loss.base_targets=hidden/topk caches, one per key (none: OUTPUT_DIR/base_targets; a pipeline's
    MoL runs share PIPELINE/base_targets); runs on the same base, traces, max_length, template and dtype (other arms,
    seeds, a resumed run) reuse one cache. A folder holding one cache is that cache: one made from other inputs is
    refused, naming what differs."""
    base_topk: Annotated[int, Range(1, 1_000_000)] = 64
    """K of loss.base_targets=topk: the base's most likely tokens kept per KL token (the rest is one class)."""
    base_targets_check_steps: Size = 50
    """With a cache, every this many steps one micro-batch also runs the live base and logs base_targets_error (the
    per-token |KL cached - KL live|); 0: never."""

    @property
    def needs_base(self) -> bool:
        """Whether the frozen base model's hidden states are needed."""
        return self.mode == "mol" or self.monitor_kl

    @property
    def cached_base(self) -> bool:
        """Whether the base's targets come from the cache (``molrl.mol.base_cache``) rather than a live forward."""
        return self.needs_base and self.base_targets != "live"


@dataclass
class DataConfig:
    """Which traces to train on and how they become tokens."""

    traces: list[str] = field(default_factory=list)
    """Trace files (JSONL, molrl trace schema) to train on."""
    max_length: Count = 4096
    """Longest tokenised trace kept; longer traces are truncated (the count is logged)."""
    domain_general_ratio: list[Annotated[int, Range(0, 1_000_000)]] = field(default_factory=lambda: [1, 1])
    """Domain:general examples per batch stream when general-tagged traces exist."""
    exclude_benchmarks: dict[str, str] = field(default_factory=dict)
    """Benchmark files (name: path, e.g. mbpp: data/mbpp.jsonl) whose test tasks, the ones eval scores, are left out
    of the traces, recognised by content (``molrl.tasks.index``)."""


@dataclass
class MolConfig:
    """A MoL continual-training run: model, traces, loss, adapter and optimisation."""

    model: ModelWeights = field(default_factory=lambda: ModelWeights("tiny:chatml"))
    """The base model (``model: PATH`` for short) and its dtype; MoL trains a new adapter on it (to start from an
    adapter, merge it into the base first: ``molrl export --adapter``)."""
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
    lora: MolLoraConfig = field(default_factory=MolLoraConfig)
    """The adapter trained (rank 64 on every linear layer, dropout 0.05), or full fine-tuning (lora.enabled=false)."""
    train: MolTrainConfig = field(default_factory=MolTrainConfig)
    """Optimisation and bookkeeping: cosine schedule over 3% warm-up, one epoch (max_steps -1), micro-batches of 1
    accumulated 8 to a step."""
    threads: Threads | None = None
    """Torch CPU threads; none: as many as cores are idle, re-measured while it runs (molrl.cpu)."""

    RENAMED_KEYS: ClassVar[dict[str, tuple[str, Callable[[Any], Any]]]] = {
        "dtype": ("model.dtype", lambda v: v), "data.enable_thinking": ("thinking", lambda v: v)}
    RETIRED_KEYS: ClassVar[dict[str, str | Retired]] = {
        "model.adapter": Retired("MoL trains a new adapter on the base; merge that one into the base first (molrl "
                                 "export --adapter DIR --out MERGED) and train from MERGED", (None,))}

    def __post_init__(self) -> None:
        self.model = as_model_source(self.model, ModelWeights)
        check_idle(self, "mol")  # last: a key set where it cannot act (molrl.config.idle)


seal(MolConfig)  # an attribute it does not have is refused (molrl.config.strict)
