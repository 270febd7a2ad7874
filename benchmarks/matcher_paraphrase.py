"""How far the one "trained on" rule (``molrl.tasks.index.BenchmarkIndex.find``) follows a benchmark problem that was
changed on its way into training data: the paraphrase limit of exclusion and of eval's refusal.

Every MBPP test task (11-510, Google's full file) and every HumanEval problem is written into a corpus of perturbed
prompts, one per kind that applies to it:

- ``as given``: the loader's prompt, unchanged (a control: the content key finds it);
- ``wrapped``: a sentence before and after it (a wrapper molrl does not know: containment finds it);
- ``zero-width spaces``: U+200B after every fifth space (format characters are folded out of the normalised text);
- ``all tests shown`` (MBPP): the three asserts, not the first alone (the key reads the first assert only);
- ``another assert shown``: MBPP's second assert in place of its first; HumanEval's first ``check`` assert, written
  with the entry point, after the prompt;
- ``renamed function``: the entry point renamed ``solution`` wherever it appears;
- ``dropped import line`` (the 23 HumanEval prompts with one; no MBPP prompt has one): its import lines removed;
- ``first word changed``: the statement's first word replaced (MBPP's ``Write`` -> ``Create``; HumanEval's docstring).

Each perturbed prompt is matched as exclusion matches a converted trace (``match_trace``: the trace's content key, as
an importer sets it, then containment) against the whole benchmark files, and as eval matches a model's record
(``molrl.records.provenance.trained_matches`` on a record holding the prompt's key and text). Reported per kind: how many the
matcher knows as the problem it came from, as another problem, or not at all, and how many of the two verdicts agree.

    python benchmarks/matcher_paraphrase.py [--data ../shared/data] [--out runs/matcher_paraphrase.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import Counter
from pathlib import Path
from typing import Callable, Iterator

REPO = Path(__file__).resolve().parents[1]
IMPORT_LINE = re.compile(r"^[ \t]*(?:import\s|from\s+\S+\s+import\s).*\n?", re.MULTILINE)
DOCSTRING_WORD = re.compile(r"(\"\"\"|''')(\s*)([A-Za-z]+)")


def perturbations(prompt: str, entry: str, other_assert: str, all_asserts: str | None) -> dict[str, str | None]:
    """Each kind's perturbed prompt (None where the kind does not apply to this problem)."""
    renamed = re.sub(rf"\b{re.escape(entry)}\b", "solution", prompt)
    dropped = IMPORT_LINE.sub("", prompt)
    if prompt.lstrip().startswith("Write"):
        first_word = prompt.replace("Write", "Create", 1)
    else:
        first_word = DOCSTRING_WORD.sub(lambda m: m.group(1) + m.group(2) + "Kindly", prompt, count=1)
    spaced = re.sub(r"((?:\S+ ){5})", "\\1\u200b", prompt)
    return {
        "as given": prompt,
        "wrapped": f"Solve this task.\n{prompt}\nExplain your answer.",
        "zero-width spaces": spaced,
        "all tests shown": all_asserts,
        "another assert shown": other_assert,
        "renamed function": renamed if renamed != prompt else None,
        "dropped import line": dropped if dropped != prompt else None,
        "first word changed": first_word if first_word != prompt else None,
    }


def corpus(data: Path) -> Iterator[tuple[str, str, str, str]]:
    """(benchmark, task id, kind, perturbed prompt) for every MBPP test task and HumanEval problem."""
    from molrl.tasks.loaders import load_tasks

    rows = {str(r["task_id"]): r for r in map(json.loads, (data / "mbpp" / "mbpp.jsonl").read_text().splitlines())}
    for task in load_tasks(data / "mbpp" / "mbpp.jsonl", "mbpp", split="test"):
        tests = rows[task.id]["test_list"]
        head = f"{rows[task.id]['text']}\nYour code should pass these tests:\n\n"  # as mbpp_prompt writes it
        other, every = head + tests[1], head + "\n".join(tests)
        for kind, text in perturbations(task.prompt, task.entry_point or "", other, every).items():
            if text is not None:
                yield "mbpp", task.id, kind, text
    with gzip.open(data / "humaneval" / "HumanEval.jsonl.gz", "rt") as handle:
        problems = [json.loads(line) for line in handle]
    for row in problems:
        first = next(line.strip() for line in row["test"].splitlines() if line.strip().startswith("assert"))
        shown = first.replace("candidate", row["entry_point"])
        for kind, text in perturbations(row["prompt"], row["entry_point"], f"{row['prompt']}\n{shown}\n",
                                        None).items():
            if text is not None:
                yield "humaneval", row["task_id"], kind, text


def verdicts(index, text: str) -> tuple[tuple[str, str] | None, set[tuple[str, str]]]:
    """What exclusion makes of a trace posing ``text`` (its first match) and what eval makes of a record that trained
    on it (every problem it refuses)."""
    from molrl.records.provenance import Provenance, trained_matches
    from molrl.tasks.index import TASK_KEY, match_text, problem_parts

    key = problem_parts(text).key
    match = index.match_trace([{"role": "user", "content": text}], {TASK_KEY: key})
    record = Provenance(lineage=[{"stage": "mol", "config": "", "date": ""}], keys=[key],
                        texts={key: [match_text(text)]})
    return (match and (match.benchmark, match.id)), trained_matches(record, index)


def measure(data: Path, progress: Callable[[str], None] = lambda line: None) -> dict[str, dict[str, Counter]]:
    """Per benchmark and kind: counts of ``known`` (as its own problem), ``other`` (as another), ``unknown``,
    ``agree`` (exclusion's verdict is one of eval's, or both find nothing) and ``total``."""
    from molrl.tasks.index import BenchmarkIndex

    index = BenchmarkIndex.from_files({"mbpp": data / "mbpp" / "mbpp.jsonl",
                                       "humaneval": data / "humaneval" / "HumanEval.jsonl.gz"})
    found: dict[str, dict[str, Counter]] = {}
    for benchmark, task_id, kind, text in corpus(data):
        dropped, refused = verdicts(index, text)
        counts = found.setdefault(benchmark, {}).setdefault(kind, Counter())
        counts["total"] += 1
        counts["known" if dropped == (benchmark, task_id) else "other" if dropped else "unknown"] += 1
        counts["agree"] += (dropped in refused) if dropped else not refused
    progress(f"matched {sum(c['total'] for kinds in found.values() for c in kinds.values())} prompts")
    return found


def table(found: dict[str, dict[str, Counter]]) -> str:
    """The markdown table of ``measure``'s counts."""
    lines = ["| perturbation | MBPP test (500) known | HumanEval (164) known | as another problem | exclusion = eval |",
             "|---|---|---|---|---|"]
    kinds = list(dict.fromkeys(kind for kinds in found.values() for kind in kinds))
    for kind in kinds:
        cells = []
        for benchmark in ("mbpp", "humaneval"):
            c = found.get(benchmark, {}).get(kind)
            cells.append(f"{c['known']} of {c['total']}" if c else "n/a")
        counts = [found[b][kind] for b in found if kind in found[b]]
        other = sum(c["other"] for c in counts)
        agree, total = sum(c["agree"] for c in counts), sum(c["total"] for c in counts)
        lines.append(f"| {kind} | {cells[0]} | {cells[1]} | {other} | {agree} of {total} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Build the corpus, match it, print the table (and write the counts as JSON with ``--out``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data",
                        help="folder holding mbpp/mbpp.jsonl and humaneval/HumanEval.jsonl.gz (default ../shared/data)")
    parser.add_argument("--out", type=Path, help="write the counts here as JSON")
    args = parser.parse_args(argv)
    for name in ("mbpp/mbpp.jsonl", "humaneval/HumanEval.jsonl.gz"):
        if not (args.data / name).is_file():
            parser.error(f"{args.data / name}: not found; pass --data DIR holding {name}")
    found = measure(args.data)
    print(table(found))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
