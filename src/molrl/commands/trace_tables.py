"""The tables ``molrl traces stats`` and ``molrl traces lint`` print: per-file counts with a total row."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def stats_table(stats: list, tokenizer_name: str):
    """The rich table of per-file counts with a total row."""
    from rich.table import Table

    from molrl.traces.stats import total

    columns = ["file", "traces", "rejects", "turns", "feedback turns", "no feedback", "success",
               "tokens", "decision", "feedback", "prompt", "template", "max len"]
    table = Table(*columns, title=f"trace stats under {Path(tokenizer_name).name}")
    for s in stats + [total(stats)]:
        table.add_row(Path(s.path).name, *(str(v) for v in (
            s.traces, s.rejects, s.turns, s.feedback_turns, s.no_feedback, s.successes, s.tokens,
            s.decision_tokens, s.feedback_tokens, s.prompt_tokens, s.template_tokens, s.max_tokens)))
    return table


def overlap_table(overlaps: list, benchmarks: list[str]):
    """The rich table of traces (distinct tasks) per file and benchmark split, with a total row."""
    from rich.table import Table

    from molrl.traces.stats import overlap_total

    labels = sorted({label for o in overlaps for label in o.traces})
    table = Table("file", "traces", *labels, "no benchmark task",
                  title=f"traces (distinct tasks) per benchmark split of {', '.join(benchmarks)}")
    for o in overlaps + [overlap_total(overlaps)]:
        table.add_row(Path(o.path).name, str(o.total),
                      *(f"{o.traces.get(label, 0)} ({len(o.tasks.get(label, ()))})" for label in labels),
                      str(o.total - sum(o.traces.values())))
    return table


def lint_table(counts: list) -> tuple[Any, Any]:
    """The rich table of ``molrl traces lint``'s per-file counts (``molrl.traces.lint.LintCounts``) with a total row,
    and that total."""
    from rich.table import Table

    from molrl.traces.lint import LintCounts

    table = Table("file", "traces", "decision turns", "model-written feedback turns", "traces with one",
                  title="traces lint: decision turns that write the environment's reply after their action")
    total = LintCounts("total")
    for c in counts:
        for name in ("traces", "decision_turns", "model_feedback_turns", "model_feedback_traces"):
            setattr(total, name, getattr(total, name) + getattr(c, name))
    for c in counts + [total]:
        table.add_row(Path(c.path).name, *(str(v) for v in (c.traces, c.decision_turns, c.model_feedback_turns,
                                                                 c.model_feedback_traces)))
    return table, total
