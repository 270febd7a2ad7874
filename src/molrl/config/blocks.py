"""The config blocks every stage shares, under one name and one type wherever a stage has them.

- ``model`` (``ModelSource``): the checkpoint a stage loads, an adapter on it, the weights' dtype, and a tiny model's
  weight seed. ``model: PATH`` is short for ``model: {path: PATH}``, so a one-line model still reads as it always did.
  MoL's (``ModelWeights``) has no adapter: it trains a new one on the base; RL's (``RlModelSource``) adds how the
  policy starts from the adapter and which model its KL pulls towards.
- ``train`` (``TrainConfig``): optimisation and bookkeeping of the training stages (mol, rl), each with its own
  defaults; MoL's (``MolTrainConfig``) adds the epochs and the accumulation RL derives, and its ``max_steps`` may
  be -1 (run by epochs).
- ``lora`` (``LoraAdapterConfig``): the LoRA adapter a training stage creates; MoL's (``MolLoraConfig``) may be
  switched off for full fine-tuning, which RL never does.
- ``data`` (``TaskSource``): the task file a stage runs on (collect, rl; eval's ``data.NAME``, one a benchmark), read
  by ``molrl.tasks.source``; ``data: FILE`` is short for ``data: {path: FILE}``.

The others live beside what they configure: ``sampling`` (``molrl.engines.sampling.SamplingConfig``), ``sandbox``
(``molrl.sandbox.SandboxConfig``).

``tests/test_config_blocks.py`` checks, by enumeration over the stages, that each exposes these blocks under the
same names and types.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from molrl.config.ranges import (MAX_COUNT, Count, Dropout, Dtype, LearningRate, Optimizer, Probability, Range,
                                 Scheduler, Seed, Size, TargetModules, Weight)
from molrl.task_types import JsonlSpec


@dataclass
class ModelWeights:
    """The checkpoint a stage loads and its weights' dtype: MoL's ``model`` (it trains a new adapter on the base)."""

    SHORTHAND: ClassVar[str] = "path"
    """``model: PATH`` (a YAML string or ``model=PATH`` on the command line) sets ``model.path``."""

    path: str = ""
    """Model directory or hub name (tiny:chatml / tiny:llama3: a random tiny model built in-process)."""
    dtype: Dtype = "float32"
    """Weights dtype of the transformers path: float32, bfloat16 or float16 (vLLM uses the checkpoint's)."""
    seed: Seed = 0
    """Seed of a tiny: model's random weights; a checkpoint holds its own, so 0 there."""

    def __post_init__(self) -> None:
        if self.seed != 0 and not str(self.path).startswith("tiny:"):
            raise ValueError(f"model.seed={self.seed} seeds a tiny: model's random weights, and model.path="
                             f"{self.path!r} is a checkpoint with its own; remove model.seed")


@dataclass
class ModelSource(ModelWeights):
    """The model a stage loads: a checkpoint, the weights' dtype, and an optional PEFT adapter on top of it."""

    adapter: Path | None = None
    """A PEFT adapter directory put on top of the model (none: the model as it is)."""


@dataclass
class RlModelSource(ModelSource):
    """RL's ``model``: the base and the MoL stage's adapter, how the policy starts from that adapter, and which of
    the two models the KL term pulls towards."""

    adapter_mode: Literal["continue", "merge_new"] = "continue"
    """continue: keep training the MoL adapter; merge_new: merge it into the base and train a fresh LoRA."""
    reference: Literal["base", "mol"] = "base"
    """KL reference when beta > 0: the original base model, or the MoL model (needs model.adapter)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.reference == "mol" and self.adapter is None:
            raise ValueError("model.reference=mol needs model.adapter (the MoL stage's adapter directory)")


def as_model_source(value: ModelWeights | str | Path, cls: type[ModelWeights] = ModelSource) -> ModelWeights:
    """A stage's ``model`` as its block ``cls``: a config built in Python may give a plain path
    (``EvalConfig(model=P)``) or the shared block a stage's own extends (``RlConfig(model=ModelSource(P))``)."""
    if isinstance(value, cls):
        return value
    if isinstance(value, ModelWeights) and issubclass(cls, type(value)):
        return cls(**{f.name: getattr(value, f.name) for f in fields(value)})
    return cls(str(value))


def as_task_source(value: TaskSource | str | Path) -> TaskSource:
    """A task source as its block: a config built in Python may give a plain path (``EvalConfig(data={"x": P})``)."""
    return value if isinstance(value, TaskSource) else TaskSource(path=Path(value))


@dataclass
class TrainConfig:
    """Optimisation and bookkeeping of a training stage (forwarded to ``transformers.TrainingArguments``: MoL's, and
    RL's through TRL's ``GRPOConfig``)."""

    optim: Optimizer = "adamw_torch"
    """Optimiser name understood by transformers (adamw_torch, adamw_torch_fused, sgd, ...)."""
    learning_rate: LearningRate = 1e-4
    """Peak learning rate (1e-4 is the MoL-RL authors' value for LoRA)."""
    lr_scheduler: Scheduler = "cosine"
    """Learning-rate schedule name understood by transformers (constant, linear, cosine, ...)."""
    warmup_ratio: Probability = 0.03
    """Fraction of the steps spent warming the learning rate up (when warmup_steps is 0)."""
    warmup_steps: Size = 0
    """Optimiser steps spent warming the learning rate up; above 0 it replaces warmup_ratio (set one of them)."""
    weight_decay: Weight = 0.0
    """AdamW weight decay."""
    max_grad_norm: Annotated[float, Range(0, 1e6)] = 1.0
    """Gradient clipping norm; 0 disables clipping."""
    max_steps: Count = 100
    """Optimiser steps to run."""
    micro_batch_size: Count = 1
    """Sequences per forward/backward pass on each process (MoL: traces; RL: completions; RL accumulates
    prompts_per_step * sampling.n / micro_batch_size of them a step)."""
    seed: Seed = 0
    """Seed of data order, adapter initialisation and dropout (and RL's sampling)."""
    bf16: bool | None = False
    """Train in bfloat16 mixed precision; none: when model.dtype is bfloat16 and a GPU is there."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory."""
    logging_steps: Count = 1
    """Log every this many optimiser steps (metrics.jsonl and report_to)."""
    save_steps: Count = 50
    """Write a resumable checkpoint every this many optimiser steps (a re-run resumes from the newest)."""
    save_total_limit: Count = 2
    """Checkpoints kept on disk (oldest deleted first)."""
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Logging backends (tensorboard, wandb, ...) beside metrics.jsonl; ``none`` for metrics.jsonl only."""
    resume: Literal["auto", "never"] = "auto"
    """``auto`` continues from the newest checkpoint in output_dir/checkpoints when there is one (the re-run rule,
    ``molrl.records.rerun``); ``never`` starts over in the same directory."""

    def __post_init__(self) -> None:
        if self.warmup_steps > 0 and self.warmup_ratio > 0:
            raise ValueError(f"train.warmup_steps={self.warmup_steps} and train.warmup_ratio={self.warmup_ratio}: set "
                             "one of them (the other to 0)")

    def warmup(self) -> float:
        """``TrainingArguments.warmup_steps``: the steps when set, else the ratio (transformers reads a value below
        1 as a fraction of the steps)."""
        return self.warmup_steps if self.warmup_steps > 0 else self.warmup_ratio

    def mixed_bf16(self, dtype: str, cuda: bool) -> bool:
        """Whether to train in bfloat16 mixed precision: ``bf16``, or when unset, a bfloat16 model on a GPU."""
        return self.bf16 if self.bf16 is not None else cuda and dtype in ("bfloat16", "bf16")


@dataclass
class MolTrainConfig(TrainConfig):
    """MoL's ``train`` block: the shared keys, with a run by epochs (``max_steps`` -1) and a set accumulation."""

    max_steps: Annotated[int, Range(1, MAX_COUNT, also=(-1,))] = -1
    """Optimiser steps to run; -1 runs ``epochs`` instead."""
    epochs: Annotated[float, Range(0, 1e6, low_open=True)] = 1.0
    """Passes over the training data, with max_steps -1."""
    grad_accumulation: Count = 8
    """Micro-batches per optimiser step on each process."""


@dataclass
class LoraAdapterConfig:
    """The LoRA adapter a training stage creates (the MoL-RL paper's rank 64, alpha 128)."""

    rank: Annotated[int, Range(1, 4096)] = 64
    """Adapter rank r."""
    alpha: Annotated[int, Range(1, 1_000_000)] = 128
    """Scaling numerator: updates are scaled by alpha / rank."""
    dropout: Dropout = 0.05
    """Dropout on the adapter's input."""
    target_modules: TargetModules = field(default_factory=lambda: ["all-linear"])
    """Module names to adapt; ``all-linear`` means every linear layer except the output head.

    MoL: ``lm_head`` may be listed with ``dropout`` 0 (the loss applies the head's adapter as a merged weight, one
    extra [vocab, hidden] tensor and its gradient, which cannot drop inputs out). RL: never ``lm_head`` (TRL scores
    tokens from lm_head.weight directly).
    """


@dataclass
class MolLoraConfig(LoraAdapterConfig):
    """MoL's ``lora`` block: the shared adapter keys, and full fine-tuning in its place (``enabled`` false)."""

    enabled: bool = True
    """Train a LoRA adapter; false means full fine-tuning (its KL then needs a frozen copy of the model)."""


BENCHMARK_FORMATS: dict[str, str] = {"math500": "math500", "aime24": "aime", "aime25": "aime", "humaneval": "humaneval",
                                     "mbpp": "mbpp"}
"""The benchmarks molrl knows by name, and the format of each one's file: an eval ``data`` entry under one of these
names reads its file in that format unless it says otherwise."""


@dataclass
class TaskSource:
    """A task file and how to read it: collect's and rl's ``data``, rl's ``eval.data``, and each of eval's
    ``data.NAME``. ``data: FILE`` is short for ``data: {path: FILE}``."""

    SHORTHAND: ClassVar[str] = "path"
    """``data: FILE`` (a YAML string, or ``data=FILE`` / ``data.NAME=FILE`` on the command line) sets ``path``."""

    path: Path | None = None
    """Task file (JSONL/JSON/parquet as the format expects; in eval also ``hub:DATASET[:SPLIT]``, fetched with
    ``datasets``); unused for format toy."""
    format: Literal["humaneval", "mbpp", "math500", "aime", "jsonl", "toy"] | None = None
    """Format of the task file: humaneval (.jsonl/.jsonl.gz), mbpp, math500, aime or jsonl (molrl task JSONL, fields
    under ``spec``); toy: RL's built-in toy task (no file). Unset: an eval benchmark named math500, aime24, aime25,
    humaneval or mbpp (with no ``spec``) takes its own format, anything else jsonl."""
    limit: Count | None = None
    """Use only the first N tasks."""
    spec: JsonlSpec = field(default_factory=JsonlSpec)
    """Field names and task kind of a jsonl task file (format jsonl only)."""
    split: Literal["train", "validation", "test", "prompt", "all"] | None = None
    """Benchmark split to take (train, validation, test, prompt or all); unset: train (rl's eval.data: test; eval:
    its ``split``); a file without splits is taken whole."""

    def resolved(self, name: str | None = None) -> TaskSource:
        """This source with its format decided (``format`` unset): the benchmark ``name``'s own format when molrl
        knows it by that name and no ``spec`` is given, else jsonl. Each stage's config resolves its sources, so a
        saved config names the format its run read."""
        if self.format is not None:
            return self
        known = BENCHMARK_FORMATS.get(name or "")
        return replace(self, format=known if known and self.spec == JsonlSpec() else "jsonl")
