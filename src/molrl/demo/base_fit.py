"""The demo bases' training loop: cross-entropy on the learned tokens, a uniform guess on the unsure ones.

``molrl.demo.base`` (the digit world) and ``molrl.demo.chain_base`` each turn their traces into
``BaseExample`` rows (which tokens are learned, which the base must stay unsure of, which an answer copies)
and train a fresh model on them with ``fit``: AdamW, linear warm-up then decay, random batches from fixed
seeds, micro-batches padded to their own longest row.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import torch

from molrl import cpu
from molrl.logs.console import stage_bar



class FitSettings(Protocol):
    """What the loop reads of a base's config (``molrl.demo.base.BaseModelConfig`` has them all)."""

    steps: int
    warmup_steps: int
    learning_rate: float
    batch_size: int
    micro_batch_size: int
    seed: int
    short_steps: int
    short_length: int
    copy_weight: float


@dataclass
class BaseExample:
    """One training sequence of the base: its tokens, the ones it learns, and the ones it must stay unsure of."""

    input_ids: list[int]
    learn_mask: list[bool]
    """Tokens trained with cross-entropy (decisions, and feedback with ``learn_feedback``)."""
    unsure_mask: list[bool]
    """Tokens of ``f``'s values: trained towards a uniform guess over the ten digits."""
    copy_mask: list[bool] | None = None
    """Learned tokens an answer copies out of feedback (weighted ``BaseModelConfig.copy_weight``); None: none."""
    guess_excluded: list[int] | None = None
    """At each token of ``unsure_mask``, the token id its uniform guess leaves out (-1: none); None: none anywhere."""


def fit(model: Any, examples: Sequence[BaseExample], cfg: FitSettings, pad_id: int,
        digits: Sequence[int]) -> list[float]:
    """The training loop: CE on the learned tokens, random batches, warm-up then linear decay.

    Each batch is sorted by length and run in micro-batches of ``cfg.micro_batch_size`` padded
    to their own longest row, so short direct answers are not padded to a long trace's length;
    the loss is still the mean over all the batch's learned tokens. At the tokens of
    ``unsure_mask`` the target is uniform over the ``digits`` token ids. The first ``cfg.short_steps``
    batches draw only from the sequences of at most ``cfg.short_length`` tokens.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / cfg.warmup_steps) * max(0.0, 1.0 - s / cfg.steps))
    rng = random.Random(cfg.seed)
    pool = list(examples)
    short = [ex for ex in pool if len(ex.input_ids) <= cfg.short_length]
    if cfg.short_steps and not short:
        raise ValueError(f"short_steps={cfg.short_steps}: no sequence has at most {cfg.short_length} tokens")
    model.train()
    losses = []
    with stage_bar("base model", cfg.steps) as bar:
        for step in range(cfg.steps):
            drawn = short if step < cfg.short_steps else pool
            losses.append(_fit_step(model, rng, drawn, cfg, pad_id, digits, params, optimizer, schedule))
            cpu.tick()
            bar.update(completed=step + 1, figures=f"loss {losses[-1]:.4f}")
    model.eval()
    return losses


def _fit_step(model: Any, rng: random.Random, pool: list, cfg: FitSettings, pad_id: int, digits: Sequence[int],
              params: list, optimizer: Any, schedule: Any) -> float:
    """One optimiser step on a random batch of ``pool``; returns its loss."""
    import torch.nn.functional as F

    batch = sorted(rng.sample(pool, min(cfg.batch_size, len(pool))), key=lambda ex: len(ex.input_ids))
    parts = [collate(batch[i : i + cfg.micro_batch_size], pad_id) for i in range(0, len(batch), cfg.micro_batch_size)]
    extra = cfg.copy_weight - 1.0  # a copied value counts 1 + extra times
    targets = sum(int((labels[:, 1:] != -100).sum() + unsure[:, 1:].sum()) + extra * float(copied[:, 1:].sum())
                  for _, labels, unsure, copied, _ in parts)
    digit_ids = torch.tensor(digits)  # [10]
    total = 0.0
    for input_ids, labels, unsure, copied, excluded in parts:
        logits = model(input_ids=input_ids).logits[:, :-1].float()  # [b, L-1, V]: the next token's logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                               ignore_index=-100, reduction="sum")
        if extra and copied.any():
            at = copied[:, 1:].bool()
            loss = loss + extra * F.cross_entropy(logits[at], labels[:, 1:][at], reduction="sum")
        at = unsure[:, 1:]
        guessed = torch.log_softmax(logits[at], dim=-1)[:, digits]  # [n_unsure, 10]
        if (excluded[:, 1:][at] == -1).all():  # every digit guessed (the sum stays bit-identical to a plain mean)
            guess = -guessed.mean(dim=-1)  # [n_unsure]
        else:
            kept = (digit_ids[None, :] != excluded[:, 1:][at][:, None]).float()  # [n_unsure, 10]: guessed digits
            guess = -(guessed * kept).sum(-1) / kept.sum(-1)  # [n_unsure]
        loss = (loss + guess.sum()) / max(targets, 1)
        loss.backward()
        total += loss.item()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    schedule.step()
    optimizer.zero_grad(set_to_none=True)
    return total


def collate(batch: Sequence[BaseExample], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Right-padded ``input_ids`` [B, L], ``labels`` [B, L] (-100 except on learned tokens), ``unsure`` [B, L],
    ``copied`` [B, L] (1.0 at the tokens of ``copy_mask``) and ``excluded`` [B, L] (``guess_excluded``, else -1)."""
    width = max(len(ex.input_ids) for ex in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)  # [B, L]
    labels = torch.full((len(batch), width), -100, dtype=torch.long)  # [B, L]
    unsure = torch.zeros((len(batch), width), dtype=torch.bool)  # [B, L]
    copied = torch.zeros((len(batch), width))  # [B, L]
    excluded = torch.full((len(batch), width), -1, dtype=torch.long)  # [B, L]
    for row, ex in enumerate(batch):
        ids = torch.tensor(ex.input_ids)
        learn = torch.tensor(ex.learn_mask)
        input_ids[row, : len(ids)] = ids
        labels[row, : len(ids)] = torch.where(learn, ids, torch.full_like(ids, -100))
        unsure[row, : len(ids)] = torch.tensor(ex.unsure_mask)
        if ex.copy_mask is not None:
            copied[row, : len(ids)] = torch.tensor(ex.copy_mask, dtype=torch.float)
        if ex.guess_excluded is not None:
            excluded[row, : len(ids)] = torch.tensor(ex.guess_excluded)
    return input_ids, labels, unsure, copied, excluded
