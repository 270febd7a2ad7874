"""Grading under attack: extraction time on adversarial completions, a batch of astronomical math
answers, a float near an integer, and the benchmarks' canonical solutions.

    python benchmarks/grading_attacks.py [--sizes-kb 4,16,64,1024] [--math-rows 8,64] [--data DIR]

Each extraction shape is timed against an honest completion of the same size in the same run
(the ratio is the figure that survives a loaded machine). A shape whose time passes ``--max-s``
at one size is not tried at the larger ones. ``--data`` (default ``$MOLRL_SHARED_DATA``) holds
``humaneval/HumanEval.jsonl.gz`` and ``mbpp/mbpp.jsonl``; without it the code sections are skipped.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from molrl.graders.code import extract_code
from molrl.graders.math import extract_answer

HONEST = "Let me think.\n```python\ndef f(x):\n    return x + 1\n```\n"
SHAPES = {
    "fence + spaces": lambda n: "```" + " " * n,
    "fence + tabs": lambda n: "```" + "\t" * n,
    "fence + lang + spaces": lambda n: "```python" + " " * n,
    "many ``` openers": lambda n: "```x" * (n // 4),
    "unclosed <execute>": lambda n: "<execute>" * (n // 9),
    "unclosed <solution>": lambda n: "<solution>" * (n // 10),
    "unclosed \\boxed{": lambda n: "\\boxed{" * (n // 7),
    "answer is + spaces": lambda n: "The answer is" + " " * n,
    "empty answer anchors": lambda n: "The answer is. " * (n // 15),
    "nested \\boxed{": lambda n: "\\boxed{" * (n // 14) + "}" * (n // 14),
    "boxes one list": lambda n: "\\boxed{1}, " * (n // 11),
}
ASTRONOMICAL = ["2^{2^{2^{2^{2^{2}}}}}", "9^{9^{9^{9}}}", "100000000!", "\\binom{10^{12}}{10^{6}}",
                "10^{10^{10}}", "(10^{9})!", "2^{3^{4^{5}}}", "99999999!!"]
"""Short answers that ask for astronomically large numbers (the refusal's shapes)."""
SLOW = ["(9999!)^{9999}", "9999!!!", "\\binom{9999}{4999}^{9999}"]
"""Slow answers of small literals that the refusal lets through: only the time limits bound them."""


def _time(fn, text: str) -> float:
    start = time.perf_counter()
    fn(text)
    return time.perf_counter() - start


def extraction(sizes_kb: list[int], max_s: float) -> None:
    """Seconds to extract code and a math answer from each adversarial shape, and the ratio to honest text."""
    print("| shape | KB | extract_code s | extract_answer s | honest s | worst / honest |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, make in SHAPES.items():
        for kb in sizes_kb:
            n = kb * 1024
            attack = make(n)
            honest = (HONEST * (n // len(HONEST) + 1))[:n]
            code_s, math_s = _time(extract_code, attack), _time(extract_answer, attack)
            honest_s = max(_time(extract_code, honest), _time(extract_answer, honest))
            worst = max(code_s, math_s)
            print(f"| {name} | {kb} | {code_s:.4f} | {math_s:.4f} | {honest_s:.4f} | {worst / honest_s:.1f}x |", flush=True)
            if worst > max_s:
                print(f"| {name} | > {kb} | skipped: {worst:.1f} s at {kb} KB | | | |")
                break


def math_batch(rows: list[int], kinds: list[str]) -> None:
    """Seconds to grade a batch of slow answers through the one grading dispatch."""
    from molrl.tasks import Task
    from molrl.tasks.grade import grade

    grade([Task(id="warm", prompt="", kind="math", answer="1")], ["\\boxed{1}"])
    for kind in kinds:
        shapes = {"astronomical": ASTRONOMICAL, "slow": SLOW}[kind]
        for n in rows:
            answers = [shapes[i % len(shapes)] for i in range(n)]
            tasks = [Task(id=f"t{i}", prompt="", kind="math", answer="3") for i in range(n)]
            start = time.perf_counter()
            grades = grade(tasks, [f"So \\boxed{{{a}}}." for a in answers])
            took = time.perf_counter() - start
            stages = {s: sum(g.stage == s for g in grades) for s in sorted({g.stage for g in grades})}
            print(f"math batch of {n} {kind} answers: {took:.2f} s ({took / n:.3f} s per row), "
                  f"correct {sum(g.correct for g in grades)}, stages {stages}", flush=True)


BINET = "```python\ndef fib(n: int):\n    s = 5 ** 0.5\n    return (((1 + s) / 2) ** n - ((1 - s) / 2) ** n) / s\n```"


def code_checks(data: Path, workers: int) -> None:
    """A float near an integer on HumanEval/55, then the canonical pass rates of HumanEval and MBPP."""
    from molrl.graders.code import grade_code
    from molrl.sandbox import SandboxConfig, SandboxPool
    from molrl.tasks import load_tasks

    humaneval = load_tasks(data / "humaneval" / "HumanEval.jsonl.gz", "humaneval")
    mbpp = load_tasks(data / "mbpp" / "mbpp.jsonl", "mbpp")
    with SandboxPool(SandboxConfig(workers=workers, timeout_s=10.0)) as pool:
        fib = next(t for t in humaneval if t.id == "HumanEval/55")
        g = grade_code([BINET], [fib], pool)[0]
        print(f"HumanEval/55 with Binet's float formula: {g.stage} ({g.details['passed']}/{g.details['total']} tests)")
        for name, tasks in (("HumanEval", humaneval), ("MBPP", mbpp)):
            start = time.perf_counter()
            grades = grade_code([f"```python\n{t.reference}\n```" for t in tasks], tasks, pool)
            passed = sum(g.correct for g in grades)
            print(f"{name} canonical solutions: {passed}/{len(tasks)} pass ({100 * passed / len(tasks):.1f}%), "
                  f"{time.perf_counter() - start:.1f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-kb", default="4,16,64,1024", help="completion sizes for the extraction shapes")
    parser.add_argument("--max-s", type=float, default=10.0, help="stop growing a shape once it takes this long")
    parser.add_argument("--math-rows", default="8,64", help="batch sizes of slow math answers")
    parser.add_argument("--math-kinds", default="astronomical,slow", help="astronomical (refused shapes), slow (others)")
    parser.add_argument("--data", default=os.environ.get("MOLRL_SHARED_DATA"), help="shared data directory")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    extraction([int(s) for s in args.sizes_kb.split(",") if s], args.max_s)
    math_batch([int(s) for s in args.math_rows.split(",") if s], [k for k in args.math_kinds.split(",") if k])
    if args.data and Path(args.data).is_dir():
        code_checks(Path(args.data), args.workers)
    else:
        print("code checks skipped: no --data directory (or MOLRL_SHARED_DATA)")


if __name__ == "__main__":
    main()
