"""Benchmark metrics over graded samples: pass@1, avg@n, unbiased pass@k, majority vote, breakdowns.

Every function here is pure: it takes per-problem lists of verdicts (and, for majority vote,
extracted answers with an equivalence test) and returns numbers, so each one is tested in closed
form without a model or a grader.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of pass@k from ``n`` samples of which ``c`` are correct (Chen et al. 2021).

    pass@k = 1 - C(n-c, k) / C(n, k), computed as a running product so large ``n`` cannot
    overflow: C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i).
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:  # every size-k subset holds at least one correct sample
        return 1.0
    failing_all = 1.0
    for i in range(n - c + 1, n + 1):
        failing_all *= 1.0 - k / i
    return 1.0 - failing_all


def majority_vote(
    answers: Sequence[str | None],
    correct: Sequence[bool],
    same: Callable[[str, str], bool],
) -> tuple[str | None, bool]:
    """The most common answer among samples (grouped by ``same``) and whether it is correct.

    Samples without an extracted answer do not vote. Ties go to the answer seen first. An answer
    joins the first earlier group whose representative it is ``same`` as.
    """
    if len(answers) != len(correct):
        raise ValueError(f"majority_vote: {len(answers)} answers but {len(correct)} verdicts")
    groups: list[list[int]] = []  # sample indices per answer class, in order of first appearance
    for i, answer in enumerate(answers):
        if answer is None or answer == "":
            continue
        for group in groups:
            if same(answers[group[0]], answer):  # type: ignore[arg-type]
                group.append(i)
                break
        else:
            groups.append([i])
    if not groups:
        return None, False
    best = max(groups, key=len)  # max keeps the first of equal-sized groups
    return answers[best[0]], bool(correct[best[0]])


def problem_metrics(correct: Sequence[bool], scores: Sequence[float], ks: Sequence[int]) -> dict[str, float]:
    """Per-problem numbers: fraction correct, mean score, pass@k for each k <= n."""
    n = len(correct)
    if n == 0:
        raise ValueError("problem_metrics: a problem has no samples")
    c = sum(bool(x) for x in correct)
    out = {"n": float(n), "correct": float(c), "pass@1": c / n, "score": sum(scores) / n}
    for k in ks:
        if k <= n:
            out[f"pass@{k}"] = pass_at_k(n, c, k)
    return out


def aggregate(per_problem: Sequence[dict[str, float]], ks: Sequence[int]) -> dict[str, Any]:
    """Benchmark metrics: means over problems of each per-problem number.

    ``pass@1`` is the mean over problems of the fraction of correct samples; ``avg@n`` is the
    same number under the name papers give it when n samples are averaged; ``score`` is the
    mean graded score (partial credit, e.g. the staged code reward); ``pass@k`` is reported only
    when every problem has at least k samples; ``maj@n`` when the per-problem records carry a
    ``majority`` verdict.
    """
    if not per_problem:
        return {"problems": 0, "samples": 0}
    min_n = int(min(p["n"] for p in per_problem))
    max_n = int(max(p["n"] for p in per_problem))
    out: dict[str, Any] = {
        "problems": len(per_problem),
        "samples": int(sum(p["n"] for p in per_problem)),
        "pass@1": _mean(p["pass@1"] for p in per_problem),
        f"avg@{max_n}": _mean(p["pass@1"] for p in per_problem),
        "score": _mean(p["score"] for p in per_problem),
    }
    for k in sorted(set(ks)):
        if 1 < k <= min_n:
            out[f"pass@{k}"] = _mean(p[f"pass@{k}"] for p in per_problem)
    if all("majority" in p for p in per_problem):
        out[f"maj@{max_n}"] = _mean(p["majority"] for p in per_problem)
    return out


def breakdown(per_problem: Sequence[dict[str, float]], keys: Sequence[Any]) -> dict[str, dict[str, float]]:
    """pass@1 and problem count per group, for problems labelled by ``keys`` (e.g. subject)."""
    if len(per_problem) != len(keys):
        raise ValueError(f"breakdown: {len(per_problem)} problems but {len(keys)} labels")
    groups: dict[str, list[float]] = defaultdict(list)
    for p, key in zip(per_problem, keys):
        groups[str(key)].append(p["pass@1"])
    return {key: {"problems": len(v), "pass@1": _mean(v)} for key, v in sorted(groups.items())}


def _mean(values: Any) -> float:
    values = list(values)
    return sum(values) / len(values)
