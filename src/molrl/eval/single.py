"""Single-turn, feedback-independent evaluation of an in-memory model: prompt -> sample -> grade.

``evaluate_single`` is the whole loop for callers that already hold a model (the GRPO eval hook,
the demo); ``molrl eval`` runs the same steps per chunk of problems so it can resume, and both
summarise with ``summarise``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

from molrl.eval.grading import grade_samples, task_metrics
from molrl.eval.metrics import aggregate, breakdown
from molrl.tasks.prompts import CODE_INSTRUCTION, MATH_INSTRUCTION
from molrl.traces.spans import render_prompts
from molrl.eval.samples import SampleRecord
from molrl.engines.generation import Generator, SamplingConfig, TransformersGenerator
from molrl.tasks import Task
from molrl.tasks.grade import FAILED
from molrl.tasks.held_out import constant_answer


def evaluate_single(
    model: Any,
    tokenizer: Any,
    tasks: Sequence[Task],
    sampling: SamplingConfig,
    pool: Any = None,
    *,
    enable_thinking: bool = False,
    ks: Sequence[int] = (1,),
    batch_size: int = 16,
    generator: Generator | None = None,
    code_reward: Any = None,
    code_template: str = CODE_INSTRUCTION,
    math_template: str = MATH_INSTRUCTION,
) -> dict[str, Any]:
    """Sample ``sampling.n`` single-turn answers per task, grade them, and return the metrics.

    The result holds ``accuracy`` (= pass@1, the mean fraction of correct samples; None when no sample could be
    judged), the other metrics of ``summarise`` and the per-sample ``records``. ``pool`` (a
    ``molrl.sandbox.SandboxPool``) is needed only when there are code tasks.
    """
    generator = generator or TransformersGenerator(model, tokenizer, batch_size=batch_size)
    prompts = render_prompts(tokenizer, tasks, enable_thinking=enable_thinking, code_template=code_template,
                             math_template=math_template)
    completions = generator.generate(prompts, sampling)
    records = grade_samples(tasks, completions, pool, code_reward)
    metrics = summarise(tasks, records, ks)
    return {"accuracy": metrics.get("pass@1"), **metrics, "records": records}


def generate_chunk(
    generator: Generator,
    tokenizer: Any,
    tasks: Sequence[Task],
    sampling: SamplingConfig,
    *,
    enable_thinking: bool,
    code_template: str = CODE_INSTRUCTION,
    math_template: str = MATH_INSTRUCTION,
) -> list[list[str]]:
    """``sampling.n`` single-turn completions for each task."""
    prompts = render_prompts(
        tokenizer, tasks, enable_thinking=enable_thinking, code_template=code_template, math_template=math_template
    )
    return generator.generate(prompts, sampling)


def summarise(tasks: Sequence[Task], records: Sequence[Sequence[SampleRecord]], ks: Sequence[int]) -> dict[str, Any]:
    """Benchmark metrics of graded samples (``records[i]`` belong to ``tasks[i]``).

    A sample whose grading failed (``sandbox_error``, ``grader_error``: ``molrl.tasks.grade.FAILED``) is no verdict: it
    is left out of every metric of answers (pass@k, score, maj@n, the breakdowns), counted in ``sandbox_errors`` and
    ``grader_errors``, and a problem none of whose samples was judged is left out too (``problems_without_verdict``);
    a benchmark with no judged sample has no pass@1 at all, never 0.

    Adds a breakdown by ``subject`` and by ``level`` when every task's meta carries one (MATH-500),
    counts of grading stages (how many answers were missing, wrong, timed out, ...), ``truncated``: the share
    of samples the token limit cut, and for code: ``shown_pass@1`` and ``held_back_pass@1`` (the shown and the
    held-back tests apart, over the problems that hold tests back), ``no_held_back`` (problems that hold none) and
    ``constant_answer`` (problems whose held-back tests a constant return passes). Problems whose every deciding test
    the policy saw (interactive, holding none back) are left out of the headline and scored apart: ``unsplit`` and
    ``unsplit_pass@1``.
    """
    if len(tasks) != len(records):
        raise ValueError(f"summarise: {len(tasks)} tasks but {len(records)} record lists")
    judged = [[r for r in rs if r.stage not in FAILED] for rs in records]
    headline = [(t, rs) for t, rs in zip(tasks, judged) if rs and not _unsplit(rs)]
    per_problem = [task_metrics(t, rs, ks) for t, rs in headline]
    out = aggregate(per_problem, ks)
    for key in ("subject", "level"):
        if headline and all(key in t.meta for t, _ in headline):
            out[f"by_{key}"] = breakdown(per_problem, [t.meta[key] for t, _ in headline])
    out["stages"] = dict(Counter(r.stage for rs in records for r in rs).most_common())
    samples = [r for rs in records for r in rs]
    out["sandbox_errors"] = sum(r.stage == "sandbox_error" for r in samples)
    out["grader_errors"] = sum(r.stage == "grader_error" for r in samples)
    out["problems_without_verdict"] = sum(bool(rs) and not kept for rs, kept in zip(records, judged))
    out.update(split_metrics(tasks, judged))
    out["truncated"] = sum(r.truncated for r in samples) / len(samples) if samples else 0.0
    return out


def split_metrics(tasks: Sequence[Task], records: Sequence[Sequence[SampleRecord]]) -> dict[str, Any]:
    """Code benchmarks: pass@1 on the shown and on the held-back tests apart, and how many problems hold none back."""
    code = [rs for t, rs in zip(tasks, records) if t.kind == "code" and rs]
    if not code:
        return {}
    out: dict[str, Any] = {"no_held_back": sum(all(r.held_back_pass is None for r in rs) for rs in code),
                           "constant_answer": sum(constant_answer(t) for t, rs in zip(tasks, records)
                                                  if t.kind == "code" and rs)}
    apart = [[bool(r.shown_pass) for r in rs] for rs in code if _unsplit(rs)]
    if apart:
        out["unsplit"] = len(apart)
        out["unsplit_pass@1"] = sum(sum(v) / len(v) for v in apart) / len(apart)
    for name in ("shown_pass", "held_back_pass"):
        per_problem = [[bool(getattr(r, name)) for r in rs] for rs in code
                       if getattr(rs[0], name) is not None and not _unsplit(rs)]
        if per_problem:
            out[f"{name}@1"] = sum(sum(v) / len(v) for v in per_problem) / len(per_problem)
    return out


def _unsplit(records: Sequence[SampleRecord]) -> bool:
    """Whether a problem's samples were judged on tests the policy saw, none held back (interactive episodes)."""
    return bool(records) and all((r.details or {}).get("unsplit") for r in records)
