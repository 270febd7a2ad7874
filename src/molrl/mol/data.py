"""Training examples for MoL: tokenised traces, a padding collator, a domain:general sampler.

An example is a dict of token-aligned lists (``input_ids``, ``feedback_mask``, ``decision_mask``)
plus ``is_general`` and ``index`` (its position among the run's examples, by which the trainer finds its cached
base targets: ``molrl.mol.base_cache``). The sampler walks the domain examples in a seeded order and interleaves
general examples (cycled, also seeded) so that every window of the stream holds the configured
domain:general ratio; the order depends only on (seed, epoch), so a resumed run sees the same data.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch

from molrl.errors import MolrlError
from molrl.tasks.index import (BENCHMARK_TASK, EVAL_SPLIT, first_user_text, match_text, overlap_line,
                               trace_tag, trace_task_key)

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
    cut_to_nothing: int = 0
    """Domain traces cut at max_length before their first decision or feedback token: they train nothing."""
    cut_feedback: int = 0
    """Domain traces with tool messages whose every feedback token the cut at max_length removed (the CE term
    gets nothing from them)."""
    max_length: int = 0
    """The token limit traces were cut at (data.max_length)."""
    tokens: int = 0
    """Tokens kept over all examples."""
    feedback_tokens: int = 0
    """Feedback tokens of domain traces that carry a loss (the CE term's tokens)."""
    decision_tokens: int = 0
    """Decision tokens of domain traces that carry a loss (the KL term's tokens)."""
    files: list[str] = field(default_factory=list)
    """Trace files read."""
    benchmark_tasks: list[tuple[str, str | None, str, str]] = field(default_factory=list)
    """(benchmark, split, task id, content key) of the benchmark tasks the domain traces were made on: their
    ``meta["benchmark_task"]`` (``molrl.tasks.index``; an importer given the benchmark files, ``molrl collect``), or
    the benchmark tasks ``data.exclude_benchmarks`` recognised and kept, for the run's provenance."""
    task_keys: list[str] = field(default_factory=list)
    """The content key of every domain trace's task (``molrl.tasks.index.trace_task_key``), sorted, each once."""
    task_texts: dict[str, list[str]] = field(default_factory=dict)
    """Per content key of a domain trace that names no benchmark task: its task's normalised text(s)
    (``molrl.tasks.index.match_text``), for the run's provenance; left out of data_stats.json."""
    excluded: dict[str, int] = field(default_factory=dict)
    """Per ``benchmark/split``: domain traces left out as eval test tasks (``data.exclude_benchmarks``)."""
    cut_fix: str = ""
    """How to keep more of the traces under data.max_length (what fits these traces' source)."""


def example_from_tokenized(tok: Any, max_length: int) -> dict[str, Any]:
    """One training example from a ``TokenizedTrace`` (input_ids, masks, kind), cut to ``max_length``."""
    return {
        "input_ids": list(tok.input_ids[:max_length]),
        "feedback_mask": [int(m) for m in tok.feedback_mask[:max_length]],
        "decision_mask": [int(m) for m in tok.decision_mask[:max_length]],
        "is_general": tok.kind == "general",
    }


def load_examples(paths: Sequence[str], tokenizer: Any, max_length: int, enable_thinking: bool = True,
                  exclude_benchmarks: Mapping[str, str] | None = None):
    """Read and tokenise every trace in ``paths``; returns (examples, DataStats).

    With ``exclude_benchmarks`` (name -> benchmark file), domain traces on those benchmarks' test tasks, known by
    content, are left out in one line; those that remain on one are counted in one warning (``_leave_out_eval_tasks``).

    Every malformed record and every trace the tokenizer cannot label is listed, one line each with
    its file and line, in the one error raised once all files are read. Traces without feedback or
    without decision tokens are kept and counted: each adds nothing to the term it lacks and its
    share to the other. An empty file, or one whose domain traces hold no feedback token, gets a
    warning naming it; cuts at ``max_length`` are logged with file and line, and traces the cut
    leaves with nothing to train on are counted per file with the fix, refused when no trace is left.
    """
    from molrl.traces.schema import Reject, TraceError, read_traces, rejects_error
    from molrl.traces.tokenize import TokenizeConfig, tokenize_trace

    _check_tokenizer(tokenizer)
    tcfg = TokenizeConfig(max_length=max_length, truncation="truncate", enable_thinking=enable_thinking,
                          require_feedback=False, require_decision=False)
    examples, stats = [], DataStats(files=[str(p) for p in paths], max_length=max_length)
    readers = [read_traces(path) for path in paths]
    files = [(reader.path, list(reader)) for reader in readers]  # every file read before any is tokenised
    read = {path: len(traces) for path, traces in files}
    files = _leave_out_eval_tasks(files, exclude_benchmarks, stats)
    rejects: list[Reject] = [r for reader in readers for r in reader.rejects]
    for path, traces in files:
        if read[path] and not traces:  # every trace an eval test task: not an empty file
            log.info("%s: all %d of its traces are tasks eval scores, left out (data.exclude_benchmarks)",
                     path, read[path])
            continue
        start, cut_before = len(examples), (stats.cut_to_nothing, stats.cut_feedback)
        for line_no, trace in traces:
            try:
                tok = tokenize_trace(trace, tokenizer, tcfg)
            except TraceError as err:
                rejects.append(Reject(str(path), line_no, str(err)))
                continue
            if tok.truncated and stats.truncated < _SHOWN_CUTS:
                log.warning("%s:%d: %s", path, line_no, "; ".join(tok.notes))
            stats.truncated += tok.truncated
            ex = example_from_tokenized(tok, max_length)
            ex["index"] = len(examples)
            _count(stats, ex, trace, tok.truncated)
            examples.append(ex)
        if not rejects:
            cuts = (stats.cut_to_nothing - cut_before[0], stats.cut_feedback - cut_before[1])
            for warning in _file_warnings(path, examples[start:], traces, cuts, max_length):
                log.warning("%s", warning)
    if rejects:
        order = {str(path): i for i, path in enumerate(paths)}
        raise rejects_error(sorted(rejects, key=lambda r: (order.get(r.path, 0), r.line)))
    stats.task_keys = sorted(set(stats.task_keys))
    stats.cut_fix = _cut_fix(t for _, ts in files for _, t in ts)
    if stats.truncated > _SHOWN_CUTS:
        log.warning("... %d more traces cut at max_length %d (data_stats.json counts them)",
                    stats.truncated - _SHOWN_CUTS, max_length)
    _refuse_nothing_to_train(paths, examples, stats, max_length)
    return examples, stats


def _leave_out_eval_tasks(files: list[tuple[Any, list]], exclude_benchmarks: Mapping[str, str] | None,
                          stats: Any) -> list[tuple[Any, list]]:
    """``files`` without the traces on ``exclude_benchmarks``' test tasks (counted in ``stats``, in one line); the
    domain traces that remain on a benchmark's test tasks are counted in one warning, before any is tokenised."""
    from molrl.tasks.eval_overlap import traces_overlap_line

    index = _exclusion_index(exclude_benchmarks)
    if index is not None:
        files = [(path, _without_eval_tasks(traces, index, stats)) for path, traces in files]
        total = sum(len(t) for _, t in files) + sum(stats.excluded.values())
        log.info("%s", overlap_line(stats.excluded, total, "data.exclude_benchmarks"))
    if line := traces_overlap_line([t for _, traces in files for _, t in traces], "data.traces"):
        log.warning("%s", line)
    return files


def _check_tokenizer(tokenizer: Any) -> None:
    """Refuse a tokenizer that cannot render or label traces (checked once, not once per trace)."""
    name = getattr(tokenizer, "name_or_path", "?")
    if getattr(tokenizer, "chat_template", None) is None:
        raise MolrlError(f"tokenizer {name!r} has no chat_template, which renders the traces; "
                         "use an instruct/chat model, or set tokenizer.chat_template")
    if not getattr(tokenizer, "is_fast", False):
        raise MolrlError(f"tokenizer {name!r} is not a fast (Rust) tokenizer, which labelling tokens needs; "
                         "load the model's tokenizer.json")


def _refuse_nothing_to_train(paths: Sequence[str], examples: list[dict[str, Any]], stats: Any,
                             max_length: int) -> None:
    """Refuse traces that leave MoL nothing to train on: none usable, all general, or all cut to nothing."""
    if not examples:
        raise MolrlError(f"no usable traces in {', '.join(map(str, paths)) or '(no files given)'}; set data.traces")
    if all(ex["is_general"] for ex in examples):
        raise MolrlError(f"{', '.join(map(str, paths))}: every trace is tagged general; MoL needs domain traces")
    domain = stats.traces - stats.general
    if stats.cut_to_nothing == domain:
        raise MolrlError(
            f"{', '.join(map(str, paths))}: data.max_length={max_length} cuts all {domain} domain traces before their "
            f"first decision or feedback token, inside the prompt, leaving nothing to train on; refusing to train. "
            f"{stats.cut_fix}"
        )


def _file_warnings(path: Any, examples: list[dict[str, Any]], traces: list[tuple[int, Any]],
                   cuts: tuple[int, int], max_length: int) -> list[str]:
    """What makes one file's traces train less than they hold: the cut at max_length, or no feedback at all."""
    from molrl.traces.stats import file_warnings

    cut_to_nothing, cut_feedback = cuts
    domain = [ex for ex in examples if not ex["is_general"]]
    if cut_feedback:
        nothing = f", {cut_to_nothing} of them with nothing to train on (cut inside the prompt)"
        return [f"{path}: data.max_length={max_length} leaves {cut_feedback} of its {len(domain)} domain traces "
                f"without a feedback token{nothing if cut_to_nothing else ''}. {_cut_fix(t for _, t in traces)}"]
    if cut_to_nothing:
        return [f"{path}: data.max_length={max_length} leaves {cut_to_nothing} of its {len(domain)} domain traces "
                f"with nothing to train on (cut inside the prompt). {_cut_fix(t for _, t in traces)}"]
    n_feedback = sum(sum(ex["feedback_mask"][1:]) for ex in domain)
    return file_warnings(path, len(examples), len(domain), n_feedback)


def _cut_fix(traces: Iterator[Any]) -> str:
    """How to keep more of the traces under the cut: a longer limit, or (MINT) prompts without the example."""
    mint = [t for t in traces if t.meta.get("source") == "mint"]
    if any(not t.meta.get("example_stripped") for t in mint):
        return ("Raise data.max_length, or drop MINT's in-context example from the prompts: "
                "molrl traces convert --from mint --strip-example")
    if mint:
        return "Raise data.max_length (MINT's in-context example is already stripped from these prompts)"
    return "Raise data.max_length, or shorten the prompts"


def _exclusion_index(files: Mapping[str, str] | None) -> Any:
    """The index of ``data.exclude_benchmarks``' files, None when it names none."""
    from molrl.tasks.index import BenchmarkIndex

    if not files:
        return None
    for name, path in files.items():
        if not Path(path).is_file():
            raise MolrlError(f"data.exclude_benchmarks.{name}={path}: no such file; give the {name} file eval scores "
                             f"(a pipeline takes it from eval.data.{name}), or drop {name} from "
                             "data.exclude_benchmarks (a pipeline: exclude_eval_tasks=false)")
    return BenchmarkIndex.from_files(files)


def _without_eval_tasks(traces: list[tuple[int, Any]], index: Any, stats: DataStats) -> list[tuple[int, Any]]:
    """The traces of one file less the domain traces whose task eval scores; counts them in ``stats.excluded``.
    A kept trace that ``index`` recognises is tagged with its benchmark task (provenance records it)."""
    kept = []
    for line_no, trace in traces:
        match = None if trace.kind == "general" else index.match_trace(trace.messages, trace.meta)
        if match is not None and match.split == EVAL_SPLIT:
            label = f"{match.benchmark}/{match.split}"
            stats.excluded[label] = stats.excluded.get(label, 0) + 1
            continue
        if match is not None:
            trace.meta.setdefault(BENCHMARK_TASK, match.to_meta())
        kept.append((line_no, trace))
    return kept


def check_feedback(stats: DataStats, mode: str) -> None:
    """Refuse to train when no domain trace holds a feedback token and the loss mode learns from feedback.

    Then MoL's cross-entropy term is empty and its KL term starts at 0 with zero gradient: the
    run would log loss 0 and change nothing.
    """
    from molrl.traces.stats import NO_FEEDBACK_CAUSE

    if mode == "ce" or stats.feedback_tokens:
        return
    domain = stats.traces - stats.general
    cause = NO_FEEDBACK_CAUSE
    if stats.cut_feedback:
        cause = (f"data.max_length={stats.max_length} cuts the feedback of {stats.cut_feedback} of them. "
                 f"{stats.cut_fix or 'Raise data.max_length, or shorten the prompts'}")
    raise MolrlError(
        f"{', '.join(stats.files)}: none of the {domain} domain traces has a feedback token, so loss.mode={mode} "
        f"has nothing to learn (its loss would stay 0); refusing to train. {cause}; "
        "or train plain SFT on the decisions with loss.mode=ce"
    )


def _count(stats: DataStats, ex: dict[str, Any], trace: Any, truncated: bool) -> None:
    stats.traces += 1
    stats.tokens += len(ex["input_ids"])
    if ex["is_general"]:
        stats.general += 1
        return
    key = trace_task_key(trace.messages, trace.meta)
    stats.task_keys.append(key)
    tag = trace_tag(trace.meta)
    entry = (tag["benchmark"], tag["split"], tag["id"], tag["key"] or key) if tag else None
    if entry is not None and entry not in stats.benchmark_tasks:
        stats.benchmark_tasks.append(entry)
    if tag is None:  # no benchmark named: eval searches its text for the problems it scores, as exclusion does
        texts = stats.task_texts.setdefault(key, [])
        if (text := match_text(first_user_text(trace.messages))) not in texts:
            texts.append(text)
    # Position 0 is never predicted, so a mask set only there carries nothing.
    has_feedback, has_decision = any(ex["feedback_mask"][1:]), any(ex["decision_mask"][1:])
    stats.feedback_tokens += sum(ex["feedback_mask"][1:])
    stats.decision_tokens += sum(ex["decision_mask"][1:])
    stats.without_decision += not has_decision
    stats.without_feedback += not has_feedback
    stats.cut_to_nothing += truncated and not (has_feedback or has_decision)
    stats.cut_feedback += truncated and not has_feedback and trace.count("tool") > 0


class MolCollator:
    """Right-pads a list of examples into tensors: input_ids, attention_mask, masks [B, L], is_general [B], and
    index [B] when every example has one."""

    def __init__(self, pad_token_id: int):
        self.pad_token_id = pad_token_id

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        L = max(2, max(len(ex["input_ids"]) for ex in examples))

        def pad(key: str, value: int) -> torch.Tensor:
            return torch.tensor([ex[key] + [value] * (L - len(ex[key])) for ex in examples], dtype=torch.long)

        batch = {
            "input_ids": pad("input_ids", self.pad_token_id),  # [B, L]
            "attention_mask": torch.tensor(
                [[1] * len(ex["input_ids"]) + [0] * (L - len(ex["input_ids"])) for ex in examples]
            ),  # [B, L]
            "feedback_mask": pad("feedback_mask", 0),  # [B, L]
            "decision_mask": pad("decision_mask", 0),  # [B, L]
            "is_general": torch.tensor([bool(ex["is_general"]) for ex in examples]),  # [B]
        }
        if all("index" in ex for ex in examples):
            batch["index"] = torch.tensor([int(ex["index"]) for ex in examples])  # [B]
        return batch


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
