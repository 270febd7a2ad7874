"""TRL's ``GRPOTrainer`` with our stage around it: timing, a completions record, the reference choice.

``GrpoTrainer`` adds three things to TRL's trainer and changes nothing in its algorithm:
per-step wall-clock time of generation and reward scoring (``time/generation_s``,
``time/reward_s``), one ``completions.jsonl`` line per sampled completion (prompt, completion,
each reward, advantage, task id, scoring error), written by the main process from the batch TRL
has already gathered across ranks, and ``install_reference`` (below).

The KL reference (used when beta > 0) is always the one ``policy.reference`` names. TRL picks it
by case, so ``install_reference`` fixes the cases where TRL's choice differs from ours:

=====================  ======================================  =====================================
policy                 reference = base                        reference = mol
=====================  ======================================  =====================================
plain base + new LoRA  adapter disabled (TRL)                  (not allowed: there is no MoL model)
continue MoL adapter   adapter disabled: TRL's frozen "ref"     TRL's frozen "ref" copy of the MoL
                       adapter copy is deleted                 adapter
merge_new              a separately loaded frozen base (TRL     adapter disabled = merged MoL (TRL)
                       would use the merged MoL)
=====================  ======================================  =====================================
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import torch
from trl import GRPOTrainer
from trl.trainer.utils import add_fused_lm_head

log = logging.getLogger(__name__)


class GrpoTrainer(GRPOTrainer):
    """TRL's GRPO trainer plus step timing and a per-completion JSONL record."""

    def __init__(self, *args: Any, completions_path: Path | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.completions_path = completions_path

    def _generate(self, prompts: list):
        start = time.perf_counter()
        out = super()._generate(prompts)
        self._metrics[self._mode()]["time/generation_s"].append(time.perf_counter() - start)
        return out

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        start = time.perf_counter()
        out = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._metrics[self._mode()]["time/reward_s"].append(time.perf_counter() - start)
        return out

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if self._mode() == "train" and self.completions_path is not None and self.accelerator.is_main_process:
            self._write_completions(step=self.state.global_step + 1)
        return out

    def _mode(self) -> str:
        return "train" if self.model.training else "eval"

    def _write_completions(self, step: int) -> None:
        """Append the batch TRL just gathered (all ranks) to completions.jsonl, one line per completion."""
        logs = self._logs
        n = len(logs["prompt"])
        rewards = {name: list(values)[-n:] for name, values in logs["rewards"].items()}
        extra = {name: list(values)[-n:] for name, values in logs["extra"].items()}
        advantages = list(logs["advantages"])[-n:]
        with open(self.completions_path, "a") as fh:
            for i, (prompt, completion) in enumerate(zip(logs["prompt"], logs["completion"])):
                record = {
                    "step": step,
                    "prompt": prompt,
                    "completion": completion,
                    "rewards": {name: _finite(values[i]) for name, values in rewards.items()},
                    "advantage": _finite(advantages[i]),
                }
                record.update({name: values[i] for name, values in extra.items()})
                fh.write(json.dumps(record, default=str) + "\n")


def _finite(x: float) -> float | None:
    return None if x != x else float(x)  # NaN (unscorable) -> null


def install_reference(trainer: GRPOTrainer, reference: str, adapter_mode: str | None, base_loader: Any) -> str:
    """Make the trainer's KL reference the one ``reference`` names; returns a one-line description.

    ``adapter_mode`` is None for a plain base, else ``continue`` or ``merge_new``; ``base_loader()``
    returns a fresh copy of the original base model (only called for merge_new + base).
    """
    if trainer.beta == 0.0:
        return "none (beta = 0)"
    peft_model = trainer.accelerator.unwrap_model(trainer.model)
    if adapter_mode is None:
        return "base (policy with its LoRA adapter disabled)"
    if adapter_mode == "continue":
        if reference == "base":
            if "ref" in peft_model.peft_config:
                peft_model.delete_adapter("ref")
            peft_model.set_adapter("default")
            return "base (policy with its adapter disabled)"
        if "ref" not in peft_model.peft_config:
            raise RuntimeError("TRL did not create the frozen 'ref' copy of the MoL adapter; check the trl version")
        return "mol (frozen copy of the MoL adapter, named 'ref')"
    if reference == "mol":
        return "mol (merged MoL weights with the new adapter disabled)"
    from trl.models import prepare_deepspeed, prepare_fsdp

    ref_model = base_loader()
    ref_model.requires_grad_(False)
    ref_model.eval()
    add_fused_lm_head(ref_model, temperature=trainer.temperature, cast_lm_head_to_fp32=trainer.args.cast_lm_head_to_fp32)
    if trainer.is_deepspeed_enabled:  # placed exactly as TRL places its own reference model
        trainer.ref_model = prepare_deepspeed(ref_model, trainer.accelerator)
    elif trainer.is_fsdp_enabled:
        trainer.ref_model = prepare_fsdp(ref_model, trainer.accelerator)
    else:
        trainer.ref_model = trainer.accelerator.prepare_model(ref_model.to(trainer.accelerator.device),
                                                              evaluation_mode=True)
    return "base (separately loaded frozen copy of the original base)"


def trainable_parameter_count(model: torch.nn.Module) -> int:
    """Number of parameters that receive gradients."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
