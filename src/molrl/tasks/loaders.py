"""``load_tasks``: benchmark files and users' JSONL files to ``Task`` records.

Assert-style tests become call tests where they parse cleanly (see ``molrl.tasks.asserts``);
the rest stay assert tests for the judge process. MBPP quirks handled here: the solution runs
before ``test_setup_code`` (tasks 367 and 927 build trees from the solution's own ``Node`` class),
and task 123 gets a longer time limit.
"""

from __future__ import annotations

import ast
import warnings
from pathlib import Path
from typing import Any, Iterator

from molrl.errors import DataError, MolrlError
from molrl.records.jsonl import read_lines
from molrl.tasks.asserts import assert_to_call, check_function_to_calls, without_function
from molrl.tasks.held_out import shown_count
from molrl.tasks.splits import benchmark_split, select_split
from molrl.task_types import JsonlSpec, Task, TestCase

MBPP_TIME_LIMITS = {123: 30.0}
"""MBPP tasks whose reference solution needs more than the usual 10 s (seconds)."""


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for each non-blank line of a task file, read by ``molrl.records.jsonl`` (gzip, BOM, bad text)."""
    for line in read_lines(path):
        record = line.json()  # malformed JSON, bytes that are not UTF-8, a lone surrogate: file:line: reason
        if not isinstance(record, dict):
            raise DataError(str(path), line.number, "expected a JSON object")
        yield line.number, record


def _need(record: dict, key: str, path: Path, lineno: int) -> Any:
    if key not in record:
        raise DataError(str(path), lineno, f"missing field {key!r}; found {sorted(record)}")
    return record[key]


def load_humaneval(path: Path) -> list[Task]:
    """HumanEval: each ``check(candidate)`` becomes call tests, or one judged assert test."""
    tasks = []
    for lineno, rec in read_jsonl(path):
        entry = _need(rec, "entry_point", path, lineno)
        test = _need(rec, "test", path, lineno)
        prompt = _need(rec, "prompt", path, lineno)
        context = without_function(prompt, entry)
        tests = check_function_to_calls(test)
        if tests is None:
            tests = [TestCase("assert", source=f"{context}\n\n{test}\n\ncheck(candidate)\n")]
        tasks.append(Task(
            id=rec["task_id"], prompt=prompt, kind="code", entry_point=entry, tests=tests, preamble=context,
            reference=prompt + rec.get("canonical_solution", ""), meta={"source": "humaneval"},
            split=benchmark_split("humaneval", rec["task_id"]),
        ))
    return tasks


def mbpp_prompt(text: str, tests: list[str]) -> str:
    """The MBPP prompt: the problem, then its shown tests (the first, as the example; ``molrl.tasks.held_out``)."""
    shown = tests[:shown_count(len(tests))]
    return f"{text}\nYour code should pass these tests:\n\n" + "\n".join(shown)


def _mbpp_entry_point(code: str, tests: list[str]) -> str | None:
    """The function the tests call: the first called name the reference code defines."""
    try:
        with warnings.catch_warnings():  # old MBPP code has invalid escapes such as '\w'
            warnings.simplefilter("ignore")
            tree = ast.parse(code)
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        calls = [n.func.id for n in ast.walk(ast.parse(tests[0])) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    except (SyntaxError, IndexError):
        return None
    return next((name for name in calls if name in defined), calls[0] if calls else None)


def load_mbpp(path: Path) -> list[Task]:
    """MBPP, either Google's full file (text/test_list) or DeepSeek's test split (prompt/test).

    DeepSeek's file has no test_setup_code, so its task 367 cannot pass; the full file can
    (``split == "test"`` selects the same 500 tasks).
    """
    tasks = []
    for lineno, rec in read_jsonl(path):
        text = rec["text"] if "text" in rec else _need(rec, "prompt", path, lineno)
        asserts = rec["test_list"] if "test_list" in rec else _need(rec, "test", path, lineno)
        code = _need(rec, "code", path, lineno)
        task_id = int(_need(rec, "task_id", path, lineno))
        entry = _mbpp_entry_point(code, asserts)
        if entry is None:
            raise DataError(str(path), lineno, "cannot tell which function the tests call")
        setup = rec.get("test_setup_code", "") or ""
        tests = []
        for source in asserts:
            test = assert_to_call(source, {entry}, allow_source_args=True)
            tests.append(test or TestCase("assert", source=source))
        meta = {"source": "mbpp", "challenge_test_list": rec.get("challenge_test_list", [])}
        if task_id in MBPP_TIME_LIMITS:
            meta["timeout_s"] = MBPP_TIME_LIMITS[task_id]
        tasks.append(Task(
            id=str(task_id), prompt=mbpp_prompt(text, asserts), kind="code", entry_point=entry,
            tests=tests, setup_code=setup, reference=code, meta=meta, split=benchmark_split("mbpp", str(task_id)),
        ))
    return tasks


def load_math500(path: Path) -> list[Task]:
    """MATH-500: problem, gold answer, subject and level."""
    tasks = []
    for lineno, rec in read_jsonl(path):
        tasks.append(Task(
            id=str(_need(rec, "unique_id", path, lineno)), prompt=_need(rec, "problem", path, lineno),
            kind="math", answer=str(_need(rec, "answer", path, lineno)), reference=rec.get("solution"),
            meta={"source": "math500", "subject": rec.get("subject"), "level": rec.get("level")},
            split=benchmark_split("math500", str(rec["unique_id"])),
        ))
    return tasks


def load_aime(path: Path) -> list[Task]:
    """AIME 2024/2025: integer answers, zero padding removed ("025" -> "25")."""
    tasks = []
    for lineno, rec in read_jsonl(path):
        answer = str(_need(rec, "answer", path, lineno)).strip()
        if answer.isdigit():
            answer = str(int(answer))
        tasks.append(Task(
            id=str(_need(rec, "id", path, lineno)), prompt=_need(rec, "problem", path, lineno), kind="math",
            answer=answer, reference=rec.get("solution"), meta={"source": "aime", "url": rec.get("url")},
            split=benchmark_split("aime", str(rec["id"])),
        ))
    return tasks


def _jsonl_test(raw: Any, entry: str | None, path: Path, lineno: int) -> TestCase:
    if isinstance(raw, str):
        return assert_to_call(raw, {entry} if entry else set()) or TestCase("assert", source=raw)
    if isinstance(raw, dict) and raw.get("kind") in ("call", "stdio", "assert"):
        fields = {k: raw[k] for k in ("kind", "args", "expected", "stdin", "stdout", "source", "args_source") if k in raw}
        return TestCase(**fields)
    raise DataError(str(path), lineno, "each test must be an assert string or an object with kind call/stdio/assert")


def load_jsonl(path: Path, spec: JsonlSpec) -> list[Task]:
    """Tasks from a user JSONL file whose field names ``spec`` gives."""
    tasks = []
    for lineno, rec in read_jsonl(path):
        task_id = str(rec.get(spec.id_field, lineno))
        prompt = _need(rec, spec.prompt_field, path, lineno)
        if spec.kind == "math":
            answer = _need(rec, spec.answer_field, path, lineno)
            tasks.append(Task(id=task_id, prompt=prompt, kind="math", answer=str(answer),
                              preamble=rec.get(spec.preamble_field, "") or "", probe=rec.get(spec.probe_field, "") or ""))
            continue
        entry = rec.get(spec.entry_point_field)
        raw_tests = _need(rec, spec.tests_field, path, lineno)
        if not isinstance(raw_tests, list) or not raw_tests:
            raise DataError(str(path), lineno, f"field {spec.tests_field!r} must be a non-empty list of tests")
        tests = [_jsonl_test(raw, entry, path, lineno) for raw in raw_tests]
        if entry is None and any(t.kind != "stdio" for t in tests):
            raise DataError(str(path), lineno, f"call/assert tests need the function name in {spec.entry_point_field!r}")
        tasks.append(Task(id=task_id, prompt=prompt, kind="code", entry_point=entry, tests=tests,
                          setup_code=rec.get(spec.setup_field, "") or "",
                          preamble=rec.get(spec.preamble_field, "") or "", probe=rec.get(spec.probe_field, "") or ""))
    return tasks


def load_tasks(path: str | Path, fmt: str, limit: int | None = None, spec: JsonlSpec | None = None,
               split: str | None = "all", split_key: str = "split") -> list[Task]:
    """Tasks from a benchmark file: fmt is humaneval, mbpp, math500, aime or jsonl (with ``spec``); those of
    ``split`` (``molrl.tasks.splits.select_split``; ``split_key`` names it in errors), the first ``limit`` of them."""
    loaders = {"humaneval": load_humaneval, "mbpp": load_mbpp, "math500": load_math500, "aime": load_aime}
    path = Path(path)
    if not path.is_file():
        raise MolrlError(f"{path}: task file not found; pass the path of the {fmt} file")
    if fmt == "jsonl":
        tasks = load_jsonl(path, spec or JsonlSpec())
    elif fmt in loaders:
        tasks = loaders[fmt](path)
    else:
        raise MolrlError(f"unknown task format {fmt!r}; expected one of humaneval, mbpp, math500, aime, jsonl")
    tasks = select_split(tasks, split, str(path), split_key)
    return tasks[:limit] if limit is not None else tasks
