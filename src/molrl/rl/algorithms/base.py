"""What every RL algorithm is: its aggregation, what it needs, its advantages and its extra loss terms.

An algorithm module subclasses ``Algorithm`` and is entered by name in ``molrl.rl.algorithms.ALGORITHMS``;
the trainer calls ``advantages`` once per generation batch and ``loss_terms`` once per micro-batch, and
never asks which algorithm it holds. Shared here: macro-action segmentation and the optional pooling
of any algorithm's advantages over macro actions (MA-RLHF, ``molrl.rl.macro``), and the frozen models
(teacher, reference) an algorithm may read.
"""

from __future__ import annotations

import copy
import random
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, Iterator, Sequence

import torch
from trl.trainer.utils import use_adapter

from molrl.errors import MolrlError
from molrl.models import load_model
from molrl.rl.batch import AdvantageInputs, Advantages, LossInputs, RolloutBatch, StepCounts
from molrl.rl.config import RlConfig
from molrl.rl.loss import Aggregation
from molrl.rl.macro import pool_advantages, segment
from molrl.task_types import Task

CURRENT = "<the current policy>"
"""A frozen-model spec meaning the policy being trained itself (no adapter switch; no grad in log-probs)."""


def copy_adapter(model: Any, source: str, name: str) -> None:
    """Add adapter ``name`` to the PEFT ``model`` as a frozen copy of adapter ``source`` (weights and config)."""
    cuda = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=cuda):  # its initial weights are overwritten: they draw no sample
        model.add_adapter(name, copy.deepcopy(model.peft_config[source]))
    params = dict(model.named_parameters())
    with torch.no_grad():
        for key, param in params.items():
            if f".{name}." in key:
                param.copy_(params[key.replace(f".{name}.", f".{source}.")])
                param.requires_grad_(False)


class Algorithm:
    """One RL algorithm: per-token advantages of a batch, and the loss terms it adds to the policy loss."""

    aggregation: ClassVar[Aggregation]
    """How ``policy_loss`` aggregates token losses."""
    kl_in_loss: ClassVar[bool] = True
    """beta weighs a KL term in the loss (False: the algorithm puts the KL elsewhere, PPO in its rewards)."""
    uses_macro_actions: ClassVar[bool] = False
    """Its advantages are formed over macro actions (``macro.rule``) whether or not they are pooled."""

    def __init__(self, trainer: Any, cfg: RlConfig):
        self.trainer, self.cfg = trainer, cfg
        self.frozen: dict[str, Any] = {}  # "teacher" / "reference" -> None (adapter off), adapter name, or model
        self._macro_rng = random.Random(cfg.train.seed)

    # what subclasses define
    @classmethod
    def runs_code(cls, cfg: RlConfig, tasks: Sequence[Task]) -> bool:
        """Whether the algorithm itself runs code in the sandbox for ``tasks`` (beside the rewards' grading)."""
        return False

    def token_advantages(self, inputs: AdvantageInputs,
                         ma_ids: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """([B, T] advantages of the local rows, per-row tensors the loss terms need)."""
        raise NotImplementedError

    def completion_advantages(self, inputs: AdvantageInputs, tokens: torch.Tensor) -> torch.Tensor:
        """[N] each completion's advantage as logged: its mean over its loss tokens, over all processes."""
        mask = inputs.batch.completion_mask.float()
        return self.trainer.accelerator.gather((tokens * mask).sum(-1) / mask.sum(-1).clamp(min=1.0))

    def before_loss_forward(self) -> None:
        """Called by the trainer right before a micro-batch's policy forward (the one ``loss_terms`` follows)."""

    def loss_terms(self, inputs: LossInputs, counts: StepCounts) -> dict[str, tuple[float, torch.Tensor]]:
        """Extra loss terms of a micro-batch: metric name -> (weight, term), each its sum over the micro-batch
        divided by the step's count of its own tokens (``counts``)."""
        return {}

    def frozen_adapters(self) -> tuple[str, ...]:
        """Adapter names this algorithm added beside the policy's (dropped before the policy is saved)."""
        return tuple(spec for spec in self.frozen.values() if isinstance(spec, str) and spec is not CURRENT)

    def save(self, model: Any, out: Path, main_process: bool) -> None:
        """Write what the algorithm trained beside the policy into ``out`` and take it off ``model``."""

    def save_state(self, folder: Path) -> None:
        """Write what the algorithm trains beside the policy into checkpoint ``folder``."""

    def load_state(self, checkpoint: Path) -> None:
        """Read it back from a checkpoint a run resumes from."""

    # the shared part
    def advantages(self, inputs: AdvantageInputs) -> Advantages:
        """The batch's ``Advantages``: the algorithm's own, pooled over macro actions when ``macro.pool_advantages``."""
        macro = self.cfg.macro
        ma_ids = self.macro_ids(inputs.batch) if self.uses_macro_actions or macro.pool_advantages else None
        tokens, extra = self.token_advantages(inputs, ma_ids)
        if ma_ids is not None and macro.pool_advantages:
            tokens = pool_advantages(tokens.cpu(), ma_ids.cpu(), macro.pooling).to(tokens.device)
        return Advantages(tokens, self.completion_advantages(inputs, tokens), extra)

    def macro_ids(self, batch: RolloutBatch) -> torch.Tensor:
        """[B, T] macro-action index of each loss token (-1 off the mask) under ``macro.rule``."""
        rule, trainer = self.cfg.macro.rule, self.trainer
        reference = batch.reference_logps
        if rule == "ppl" and reference is None:
            with self.frozen_model("reference") as model:
                reference = trainer.logprobs.completion(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                                     batch.attention())
        rows = []
        for row in range(batch.completion_ids.size(0)):
            texts = [trainer.processing_class.decode([t]) for t in batch.completion_ids[row].tolist()] \
                if rule == "parsing" else None
            rows.append(segment(rule, batch.completion_mask[row].cpu(), rng=self._macro_rng,
                                reference_logps=None if reference is None else reference[row].cpu(), token_texts=texts))
        return torch.stack(rows).to(batch.completion_ids.device)

    def load_frozen(self, path: Any, name: str) -> Any:
        """Frozen weights: None -> the policy with its adapter disabled; an adapter directory -> that adapter
        switched in on the policy's base (no second copy); a model directory -> a separate frozen model."""
        if path is None:
            return None
        trainer = self.trainer
        if (Path(path) / "adapter_config.json").is_file():
            model = trainer.accelerator.unwrap_model(trainer.model)
            if not hasattr(model, "load_adapter"):
                raise MolrlError(f"{path} is an adapter, but the policy has none to switch it in beside")
            model.load_adapter(str(path), adapter_name=name, is_trainable=False)
            return name
        frozen = load_model(str(path), dtype=self.cfg.model.dtype).requires_grad_(False).train(False)  # inference
        # TRL's log-prob path reads the fused head's log_probs, as on its own reference model
        trainer.logprobs.fuse_head(frozen)
        return trainer.accelerator.prepare_model(frozen.to(trainer.accelerator.device), evaluation_mode=True)

    def freeze_initial(self, name: str) -> str:
        """A frozen copy, named ``name``, of the policy's adapter as the run starts (the student's initial model)."""
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        if not hasattr(model, "add_adapter") or not hasattr(model, "peft_config"):
            raise MolrlError("the student's initial model as a frozen copy needs a LoRA policy")
        copy_adapter(model, model.active_adapter, name)
        return name

    @contextmanager
    def frozen_model(self, which: str) -> Iterator[Any]:
        """The model that computes ``which`` (teacher / reference) log-probs, while the context lasts: a separate
        model, an adapter switched in, the policy with its adapter off (None) or the policy itself (CURRENT)."""
        spec, trainer = self.frozen.get(which), self.trainer
        if spec is CURRENT:
            yield trainer.model
            return
        if spec is not None and not isinstance(spec, str):
            yield spec
            return
        with use_adapter(trainer.accelerator.unwrap_model(trainer.model), adapter_name=spec):
            yield trainer.model
