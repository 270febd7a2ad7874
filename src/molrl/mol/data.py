"""Training examples for MoL: tokenised traces, a padding collator, a domain:general sampler.

An example is a dict of token-aligned lists (``input_ids``, ``feedback_mask``, ``decision_mask``)
plus ``is_general``. The sampler walks the domain examples in a seeded order and interleaves
general examples (cycled, also seeded) so that every window of the stream holds the configured
domain:general ratio; the order depends only on (seed, epoch), so a resumed run sees the same data.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch

from molrl.errors import DataError, MolrlError

log = logging.getLogger(__name__)
_SHOWN_CUTS = 5  # cuts at max_length logged one by one; the rest are counted


@dataclass
class DataStats:
    """What happened to the traces on their way to examples (logged once, written to data_stats.json)."""

    traces: int = 0
    """Traces read."""
    general: int = 0
    """Traces tagged general."""
    without_decision: int = 0
    """Domain traces with no decision token (they contribute nothing to the KL term)."""
    without_feedback: int = 0
    """Domain traces with no feedback token (they contribute nothing to the CE term)."""
    truncated: int = 0
    """Traces cut to max_length."""
    tokens: int = 0
    """Tokens kept over all examples."""
    feedback_tokens: int = 0
    """Feedback tokens of domain traces that carry a loss (the CE term's tokens)."""
    decision_tokens: int = 0
    """Decision tokens of domain traces that carry a loss (the KL term's tokens)."""
    files: list[str] = field(default_factory=list)
    """Trace files read."""


def example_from_tokenized(tok: Any, max_length: int) -> dict[str, Any]:
    """One training example from a ``TokenizedTrace`` (input_ids, masks, kind), cut to ``max_length``."""
    return {
        "input_ids": list(tok.input_ids[:max_length]),
        "feedback_mask": [int(m) for m in tok.feedback_mask[:max_length]],
        "decision_mask": [int(m) for m in tok.decision_mask[:max_length]],
        "is_general": tok.kind == "general",
    }


def load_examples(paths: Sequence[str], tokenizer: Any, max_length: int, enable_thinking: bool = True):
    """Read and tokenise every trace in ``paths``; returns (examples, DataStats).

    A malformed record or a trace the tokenizer cannot label is an error naming its file and line.
    Traces without feedback or without decision tokens are kept and counted: each adds nothing to
    the term it lacks and its share to the other. An empty file, or one whose domain traces hold no
    feedback token, gets a warning naming it; cuts at ``max_length`` are logged with file and line.
    """
    from molrl.traces.schema import TraceError, read_traces
    from molrl.traces.stats import file_warnings
    from molrl.traces.tokenize import TokenizeConfig, tokenize_trace

    tcfg = TokenizeConfig(max_length=max_length, truncation="truncate", enable_thinking=enable_thinking,
                          require_feedback=False, require_decision=False)
    examples, stats = [], DataStats(files=[str(p) for p in paths])
    for path in paths:
        start = len(examples)
        for line_no, trace in read_traces(path, strict=True):
            try:
                tok = tokenize_trace(trace, tokenizer, tcfg)
            except TraceError as err:
                raise DataError(str(path), line_no, str(err)) from None
            if tok.truncated and stats.truncated < _SHOWN_CUTS:
                log.warning("%s:%d: %s", path, line_no, "; ".join(tok.notes))
            stats.truncated += tok.truncated
            ex = example_from_tokenized(tok, max_length)
            _count(stats, ex)
            examples.append(ex)
        domain = [ex for ex in examples[start:] if not ex["is_general"]]
        n_feedback = sum(sum(ex["feedback_mask"][1:]) for ex in domain)
        for warning in file_warnings(path, len(examples) - start, len(domain), n_feedback):
            log.warning("%s", warning)
    if stats.truncated > _SHOWN_CUTS:
        log.warning("... %d more traces cut at max_length %d (data_stats.json counts them)",
                    stats.truncated - _SHOWN_CUTS, max_length)
    if not examples:
        raise MolrlError(f"no usable traces in {', '.join(map(str, paths)) or '(no files given)'}; set data.traces")
    if all(ex["is_general"] for ex in examples):
        raise MolrlError(f"{', '.join(map(str, paths))}: every trace is tagged general; MoL needs domain traces")
    return examples, stats


def check_feedback(stats: DataStats, mode: str) -> None:
    """Refuse to train when no domain trace holds a feedback token and the loss mode learns from feedback.

    Then MoL's cross-entropy term is empty and its KL term starts at 0 with zero gradient: the
    run would log loss 0 and change nothing.
    """
    from molrl.traces.stats import NO_FEEDBACK_CAUSE

    if mode == "ce" or stats.feedback_tokens:
        return
    domain = stats.traces - stats.general
    raise MolrlError(
        f"{', '.join(stats.files)}: none of the {domain} domain traces has a feedback token, so loss.mode={mode} "
        f"has nothing to learn (its loss would stay 0); refusing to train. {NO_FEEDBACK_CAUSE}; "
        "or train plain SFT on the decisions with loss.mode=ce"
    )


def _count(stats: DataStats, ex: dict[str, Any]) -> None:
    stats.traces += 1
    stats.tokens += len(ex["input_ids"])
    if ex["is_general"]:
        stats.general += 1
        return
    # Position 0 is never predicted, so a mask set only there carries nothing.
    stats.feedback_tokens += sum(ex["feedback_mask"][1:])
    stats.decision_tokens += sum(ex["decision_mask"][1:])
    stats.without_decision += not any(ex["decision_mask"][1:])
    stats.without_feedback += not any(ex["feedback_mask"][1:])


class MolCollator:
    """Right-pads a list of examples into tensors: input_ids, attention_mask, masks [B, L], is_general [B]."""

    def __init__(self, pad_token_id: int):
        self.pad_token_id = pad_token_id

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        L = max(2, max(len(ex["input_ids"]) for ex in examples))

        def pad(key: str, value: int) -> torch.Tensor:
            return torch.tensor([ex[key] + [value] * (L - len(ex[key])) for ex in examples], dtype=torch.long)

        return {
            "input_ids": pad("input_ids", self.pad_token_id),  # [B, L]
            "attention_mask": torch.tensor(
                [[1] * len(ex["input_ids"]) + [0] * (L - len(ex["input_ids"])) for ex in examples]
            ),  # [B, L]
            "feedback_mask": pad("feedback_mask", 0),  # [B, L]
            "decision_mask": pad("decision_mask", 0),  # [B, L]
            "is_general": torch.tensor([bool(ex["is_general"]) for ex in examples]),  # [B]
        }


class RatioSampler(torch.utils.data.Sampler[int]):
    """Seeded order over domain examples with general examples interleaved at ``domain:general``.

    One epoch is one pass over the domain examples; general examples are drawn in a shuffled
    cycle as often as the ratio asks. Without general examples it is a seeded shuffle.
    """

    def __init__(self, is_general: Sequence[bool], ratio: Sequence[int] = (1, 1), seed: int = 0):
        if len(ratio) != 2 or min(ratio) < 0 or ratio[0] <= 0:
            raise MolrlError(f"data.domain_general_ratio={list(ratio)}: expected two counts like [1, 1], domain > 0")
        self.domain = [i for i, g in enumerate(is_general) if not g]
        self.general = [i for i, g in enumerate(is_general) if g]
        self.ratio = (int(ratio[0]), int(ratio[1]) if self.general else 0)
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order ``__iter__`` yields."""
        self.epoch = epoch

    def __len__(self) -> int:
        d, g = self.ratio
        return len(self.domain) + (len(self.domain) * g) // d

    def __iter__(self) -> Iterator[int]:
        rng = random.Random(self.seed * 1_000_003 + self.epoch)
        domain = rng.sample(self.domain, len(self.domain))
        general: list[int] = []
        d, g = self.ratio
        n_general = len(self) - len(domain)
        while len(general) < n_general:
            general += rng.sample(self.general, len(self.general))
        di = gi = 0
        for k in range(len(self)):
            # Position k is general when the running share of general slots falls behind g/(d+g).
            if gi < n_general and (gi + 1) * (d + g) <= (k + 1) * g:
                yield general[gi]
                gi += 1
            else:
                yield domain[di]
                di += 1
