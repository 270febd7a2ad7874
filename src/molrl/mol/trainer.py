"""``MolTrainer``: a ``transformers.Trainer`` whose loss is the MoL mixture.

What changes from the stock Trainer:
- before each optimiser step, the (feedback, decision, general) token counts of all its
  micro-batches are summed and all-reduced over data-parallel ranks (``_get_num_items_in_batch``),
  so every micro-batch's loss is its exact share of the step loss;
- ``compute_loss`` runs the policy to its final hidden states (logits for one position only), the
  frozen base under ``no_grad`` (adapter disabled, or a frozen copy for full fine-tuning) or reads its
  cached targets (``base_targets``, ``molrl.mol.base_cache``), and the chunked loss of ``molrl.mol.losses``;
  with a cache, every ``loss.base_targets_check_steps`` steps one micro-batch also runs the live base and
  logs the per-token |KL cached - KL live| (``base_targets_error``);
- ``log`` adds ce_feedback, kl_decision, token counts and tokens/s to every training log line.
Everything else (accelerate, DeepSpeed, bf16, gradient checkpointing, checkpoints, resume) is the
Trainer's own.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import defaultdict
from typing import Any

import torch
from transformers import Trainer

from molrl.errors import MolrlError
from molrl.mol.data import RatioSampler
from molrl.mol.losses import LossSettings, mean_or_nan, mol_loss, step_counts, token_masks
from molrl.mol.topk import covered_mass

log = logging.getLogger(__name__)


def _masks(inputs: dict[str, torch.Tensor]):
    return token_masks(inputs["input_ids"], inputs["feedback_mask"], inputs["decision_mask"],
                       inputs["attention_mask"], inputs["is_general"])


def _causal_lm(model: Any) -> Any:
    """The transformers causal LM inside any peft / DDP / DeepSpeed wrapping."""
    model = getattr(model, "module", model)
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model


class MolTrainer(Trainer):
    """Trainer with the MoL loss; ``ref_model`` is the frozen copy used for full fine-tuning."""

    # compute_loss already returns this micro-batch's share of the step loss.
    loss_is_scaled_for_ga = True

    def __init__(self, *args, loss_settings: LossSettings, domain_general_ratio=(1, 1),
                 ref_model: torch.nn.Module | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_settings = loss_settings
        self.domain_general_ratio = tuple(domain_general_ratio)
        self.ref_model = ref_model
        if ref_model is not None:
            ref_model.to(self.args.device).eval().requires_grad_(False)
        _head_tensors(_causal_lm(self.model))  # an output head the loss cannot read is refused before training
        self._sums: dict[str, float] = defaultdict(float)
        self._last_log_time = time.perf_counter()
        self.base_targets: Any = None
        """The base's cached targets (``molrl.mol.base_cache.BaseTargetsCache``); None: the live base."""
        self._checked_step = -1
        self._warned_mass = False

    def train(self, *args, **kwargs):
        self._last_log_time = time.perf_counter()
        return super().train(*args, **kwargs)

    # ---- data ----
    def _get_train_sampler(self, train_dataset=None):
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        return RatioSampler([ex["is_general"] for ex in dataset], self.domain_general_ratio, seed=self.args.seed)

    def _get_num_items_in_batch(self, batch_samples: list, device: torch.device) -> torch.Tensor:
        """[3] (feedback, decision, general) tokens of the whole optimiser step, over all ranks."""
        counts = torch.zeros(3, dtype=torch.float64)
        for batch in batch_samples:
            counts += step_counts(_masks(batch)).cpu()
        counts = counts.to(device)
        if self.args.world_size > 1:
            counts = self.accelerator.reduce(counts, reduction="sum")
        for name, value in zip(("tokens_feedback", "tokens_decision", "tokens_general"), counts.tolist()):
            self._sums[name] += value
        return counts

    # ---- loss ----
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        masks = _masks(inputs)
        counts = num_items_in_batch if isinstance(num_items_in_batch, torch.Tensor) and num_items_in_batch.numel() == 3 \
            else step_counts(masks)
        hidden = self._policy_hidden(model, inputs)  # [B, L, H]
        base_hidden, base_topk = None, None
        if self.loss_settings.needs_base and self.base_targets is not None:
            base_hidden, base_topk = self.base_targets.batch_targets(inputs, masks, hidden.dtype)
        elif self.loss_settings.needs_base:
            base_hidden = self._base_hidden(model, inputs)  # [B, L, H]
        lm = _causal_lm(model)
        head = _head_tensors(lm)
        base_lm = self.ref_model if self.ref_model is not None else lm
        base_head = tuple(t.detach() if t is not None else None for t in _head_tensors(base_lm, adapter=False))
        out = mol_loss(hidden, base_hidden, head, base_head, masks, counts, self.loss_settings, base_topk)
        if model.training:
            self._accumulate(out.metrics, inputs)
            if base_topk is not None:
                self._sums["base_covered_sum"] += float(covered_mass(base_topk).sum())
                self._sums["base_covered_tokens"] += base_topk.tail.numel()
            if self._check_due():
                self._check_cached(model, inputs, hidden, head, base_head, masks, counts, out.kl)
        # Data-parallel backends average gradients over ranks; the loss is a share of a global sum.
        loss = out.loss * self.accelerator.num_processes
        return (loss, {"hidden": hidden}) if return_outputs else loss

    def _policy_hidden(self, model, inputs) -> torch.Tensor:
        """Final hidden states [B, L, H] through the (wrapped) model's own forward, logits for 1 position."""
        captured = {}
        decoder = _causal_lm(model).get_decoder()
        hook = decoder.register_forward_hook(lambda _m, _a, out: captured.__setitem__("h", out.last_hidden_state))
        try:
            model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], logits_to_keep=1,
                  use_cache=False)
        finally:
            hook.remove()
        return captured["h"]

    def _check_due(self) -> bool:
        """Whether this micro-batch is the first of a step the cache is checked at."""
        every = self.loss_settings.base_targets_check_steps
        step = self.state.global_step
        if self.base_targets is None or every <= 0 or step % every or step == self._checked_step:
            return False
        self._checked_step = step
        return True

    @torch.no_grad()
    def _check_cached(self, model, inputs, hidden, head, base_head, masks, counts, kl_cached) -> None:
        """The live base on this micro-batch: the summed |KL cached - KL live| over its KL tokens, for the log."""
        live = mol_loss(hidden.detach(), self._base_hidden(model, inputs), tuple(
            t.detach() if t is not None else None for t in head), base_head, masks, counts, self.loss_settings)
        self._sums["base_targets_error_sum"] += float((kl_cached - live.kl).abs().sum())
        self._sums["base_targets_error_tokens"] += kl_cached.numel()

    @torch.no_grad()
    def _base_hidden(self, model, inputs) -> torch.Tensor:
        """The frozen base model's final hidden states [B, L, H]."""
        if self.ref_model is not None:
            decoder, ctx = self.ref_model.get_decoder(), contextlib.nullcontext()
        else:
            peft_model = getattr(model, "module", model)
            if not hasattr(peft_model, "disable_adapter"):
                raise RuntimeError("KL needs the base model: train a LoRA adapter or pass ref_model")
            decoder, ctx = _causal_lm(model).get_decoder(), peft_model.disable_adapter()
        with ctx:
            return decoder(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                           use_cache=False).last_hidden_state

    # ---- logging ----
    def _accumulate(self, metrics, inputs) -> None:
        for name, value in vars(metrics).items():
            self._sums[name] += value
        domain = ~inputs["is_general"].bool()
        self._sums["traces_without_decision"] += float((domain & (inputs["decision_mask"][:, 1:].sum(1) == 0)).sum())
        self._sums["traces_without_feedback"] += float((domain & (inputs["feedback_mask"][:, 1:].sum(1) == 0)).sum())
        self._sums["tokens"] += float(inputs["attention_mask"].sum())

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._sums:
            logs.update(self._step_metrics())
        super().log(logs, start_time)

    def _step_metrics(self) -> dict[str, float]:
        """Means over the steps since the last log line, summed over ranks."""
        counted = ("tokens_feedback", "tokens_decision", "tokens_general")  # already global
        local = [k for k in sorted(self._sums) if k not in counted]
        values = torch.tensor([self._sums[k] for k in local], dtype=torch.float64, device=self.args.device)
        if self.args.world_size > 1:
            values = self.accelerator.reduce(values, reduction="sum")
        sums = dict(zip(local, values.tolist()))
        sums.update({k: self._sums[k] for k in counted})
        now = time.perf_counter()
        out = {
            "ce_feedback": mean_or_nan(sums["ce_feedback_sum"], sums["tokens_feedback"]),
            "ce_decision": mean_or_nan(sums["ce_decision_sum"], sums["tokens_decision"]),
            "kl_decision": mean_or_nan(sums["kl_decision_sum"], sums["tokens_decision"]),
            "kl_general": mean_or_nan(sums["kl_general_sum"], sums["tokens_general"]),
            "tokens_feedback": sums["tokens_feedback"],
            "tokens_decision": sums["tokens_decision"],
            "tokens_general": sums["tokens_general"],
            "traces_without_decision": sums["traces_without_decision"],
            "traces_without_feedback": sums["traces_without_feedback"],
            "tokens_per_s": sums["tokens"] / max(now - self._last_log_time, 1e-9),
        }
        if not self.loss_settings.needs_base:
            del out["kl_decision"], out["kl_general"]
        if sums.get("base_targets_error_tokens"):
            out["base_targets_error"] = sums["base_targets_error_sum"] / sums["base_targets_error_tokens"]
        if sums.get("base_covered_tokens"):
            out["base_targets_covered_mass"] = sums["base_covered_sum"] / sums["base_covered_tokens"]
            if out["base_targets_covered_mass"] < 0.99 and not self._warned_mass:
                self._warned_mass = True
                log.warning("the base's top %d tokens hold %.4f of its mass at the KL tokens (under 0.99): the "
                            "top-K KL is a loose lower bound there; raise loss.base_topk, or use "
                            "loss.base_targets=hidden", self.loss_settings.base_topk,
                            out["base_targets_covered_mass"])
        self._sums.clear()
        self._last_log_time = now
        return out


def _head_tensors(causal_lm: Any, adapter: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The output head's weight [V, H] and bias, with its LoRA delta when it has one and ``adapter``.

    A LoRA adapter on the head enters as ``W + scaling * B @ A``, so the chunked loss sees the
    head the model's forward uses and the adapter gets its gradient through the sum (at the cost
    of one [V, H] temporary and its fp32 gradient). Refuses a head sharded by ZeRO-3 or FSDP,
    and a head adapter the merge cannot express (dropout, DoRA and other variants).
    """
    head = causal_lm.get_output_embeddings()
    layer = getattr(head, "base_layer", head)  # peft wraps a targeted head around the original
    weight = layer.weight
    if hasattr(weight, "ds_id") or type(weight).__name__ == "DTensor" or weight.dim() != 2:
        raise MolrlError(
            "the output head is sharded (DeepSpeed ZeRO-3 or FSDP); the chunked MoL loss reads the whole head: "
            "use DeepSpeed ZeRO-2 or plain data parallelism (configs/accelerate/zero2_8gpu.yaml)"
        )
    if adapter:
        for delta in _head_lora_deltas(head):
            weight = weight + delta.to(weight.dtype)  # [V, H]
    return weight, getattr(layer, "bias", None)


def _head_lora_deltas(head: Any) -> list[torch.Tensor]:
    """``scaling * B @ A`` [V, H] of each active LoRA adapter on the head (none for a plain or merged head)."""
    if not hasattr(head, "lora_A") or head.disable_adapters or head.merged:
        return []
    deltas = []
    for name in head.active_adapters:
        if name not in head.lora_A:
            continue
        if name in getattr(head, "lora_variant", {}) or head.use_dora.get(name):
            raise MolrlError(f"adapter {name!r} on the output head is a LoRA variant (DoRA or another); the MoL loss "
                             "supports plain LoRA on the head: leave the head out of lora.target_modules")
        if not isinstance(head.lora_dropout[name], torch.nn.Identity):
            raise MolrlError(f"lora.dropout={head.lora_dropout[name].p} with the output head among "
                             "lora.target_modules: the MoL loss applies the head's adapter as a merged weight, "
                             "which has no dropout; set lora.dropout=0, or leave the head out")
        deltas.append(head.get_delta_weight(name))
    return deltas
