"""Tasks known by their content: one key per problem, whatever id or wrapper it arrives under.

A problem reaches molrl through many doors: a benchmark loader (``molrl.tasks.loaders``), MINT's
results (its own ids, the problem after an in-context example), ToRA, OpenAI-format files, ``molrl collect``.
Ids differ between them; the problem's text does not. So a task is keyed by its normalised text:

- ``problem_parts(text)``: the problem inside a prompt, as (statement, entry point, test signature):
  1. wrappers removed: MINT's instructions and in-context example (everything up to the last
     ``---`` / ``Task:`` separator), molrl's own single-turn instructions (``molrl.tasks.prompts``), the phrases
     ``Complete the following code:`` and ``Your code should pass these tests:`` that MINT, DeepSeek's MBPP
     and molrl put around a code problem, and code fences (```` ```python ````, ```` ``` ````);
  2. code whose top level defines functions (HumanEval): the statement is the whole text, the entry point the
     last function defined, the test signature its header (``name(args)``);
  3. otherwise assert lines (MBPP) are taken out of the statement: the entry point is the first function the
     first assert calls that is not a builtin, the test signature that assert as ``ast`` prints it. Only the
     first assert counts, so a prompt that shows one test and one that shows all three get one key;
  4. math and prose: the statement alone.
- ``normalise(text)``: Unicode NFKC, format characters (category Cf: zero-width spaces, joiners, byte-order marks)
  left out, lower case, every run of whitespace one space, and the characters `` .,:;*#>"'` `` stripped from both
  ends.
- ``content_key(text)``: the first 16 hex digits of the SHA-256 of a normalised text.
- ``task_content_key(task)``: the key of ``task.prompt``'s parts (statement, entry point and test signature
  joined), so a trace of the same prompt, which carries no ``Task``, gets the same key.

``BenchmarkIndex`` holds every task of some benchmarks (the files a user names: MBPP, all splits; HumanEval;
MATH-500; AIME24/25; no download; or the benchmarks eval scores, whole) and decides, in one rule
(``BenchmarkIndex.find``), which of them a task trained on is. The first of three tests that finds any decides:

1. its explicit tag: the benchmark and id a trace or task was tagged with (``trace_tag``), whatever its content;
2. its content key;
3. containment (a wrapper molrl does not know): the benchmark statements of 40 characters or more found whole in
   its normalised text (``match_text``), with the entry point named in it for code.

``traces filter --exclude-benchmarks`` and MoL's ``data.exclude_benchmarks`` leave out a trace whose first match is
an eval test task; ``molrl eval`` refuses every problem the rule finds for anything a model's record says it trained
on (``molrl.records.provenance``). The rule survives wrappers and a different assert shown; a renamed function or a dropped
import line defeats it (docs/splits.md measures it: ``benchmarks/matcher_paraphrase.py``).

Traces carry what was found in their meta, under two fields:

- ``meta["task_key"]``: the content key of the trace's task (its first user message, or the matched benchmark
  task's key), on every trace an importer or ``molrl collect`` writes, matched or not;
- ``meta["benchmark_task"]``: ``{"benchmark", "split", "id", "key"}`` of the benchmark task it matches, only when
  an index was given and the trace matched one (collect: the benchmark task it was collected on). A trace made before
  it (``molrl collect``'s ``meta["benchmark"]``, ``task_split``, ``task_id``) is tagged by those.
"""

from __future__ import annotations

import ast
import builtins
import collections
import functools
import hashlib
import re
import sys
import unicodedata
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from molrl.errors import MolrlError
from molrl.task_types import Task

TASK_KEY = "task_key"
"""Trace meta field: the content key of the trace's task (every imported or collected trace)."""
BENCHMARK_TASK = "benchmark_task"
"""Trace meta field: ``{"benchmark", "split", "id", "key"}`` of the benchmark task the trace matches."""
FORMATS = {"mbpp": "mbpp", "humaneval": "humaneval", "math500": "math500", "aime": "aime", "aime24": "aime",
           "aime25": "aime"}
"""Benchmark names a user may give, and the loader format of each."""
EVAL_SPLIT = "test"
"""The split eval scores: traces of its tasks are what ``--exclude-benchmarks`` and ``data.exclude_benchmarks``
leave out."""
MIN_CONTAINED = 40
"""Shortest normalised benchmark statement matched inside a longer text (shorter ones occur by chance)."""

_MINT_TASK = re.compile(r"\n-{3,}[ \t]*\n\s*Task:[ \t]*\n")
_FENCE = re.compile(r"```[\w+-]*")
_PHRASES = re.compile(r"complete the following code:?|your code should pass these tests:?|"
                      r"you are an expert python programmer, and here is your task:?")
_PHRASE_LINES = re.compile(r"^[ \t]*(?:complete the following code|your code should pass these tests):?[ \t]*$",
                           re.IGNORECASE | re.MULTILINE)
_ENDS = " .,:;*#>\"'`"
_BUILTINS = frozenset(dir(builtins))


def normalise(text: str) -> str:
    """``text`` in NFKC without format characters, lower case, whitespace runs as one space, `` .,:;*#>"'` ``
    stripped from both ends."""
    return " ".join(_without_format(unicodedata.normalize("NFKC", text)).lower().split()).strip(_ENDS)


def _without_format(text: str) -> str:
    """``text`` without Unicode format characters."""
    return text if text.isascii() else text.translate(_format_characters())  # no ASCII character is one


@functools.cache
def _format_characters() -> dict[int, None]:
    """Every Unicode format character (category Cf: U+200B zero-width space, U+200D joiner, U+FEFF, ...), mapped to
    nothing: invisible, they would make one text two keys."""
    return dict.fromkeys(c for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf")


def content_key(text: str) -> str:
    """A stable 16-hex-digit key of ``text``'s normalised form."""
    return hashlib.sha256(normalise(text).encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class ProblemParts:
    """The problem inside a prompt (see the module docstring)."""

    statement: str
    """The normalised problem text, without wrappers and (assert style) without its test lines."""
    entry_point: str | None
    """code: the function under test, as the text shows it."""
    test: str | None
    """code: the test signature: the first shown assert, or the entry point's header."""

    @property
    def key(self) -> str:
        """The content key of the three parts."""
        return content_key("\n".join([self.statement, self.entry_point or "", self.test or ""]))


def _unwrapped(text: str) -> str:
    """``text`` without MINT's preamble, molrl's single-turn instructions and fences, in its original case."""
    from molrl.tasks.prompts import CODE_INSTRUCTION, MATH_INSTRUCTION

    text = _without_format(text)  # a zero-width space would keep the code from parsing
    last = collections.deque(_MINT_TASK.finditer(text), maxlen=1)  # the last separator; one match held at a time
    if last:
        text = text[last[0].end():]
    for template in (CODE_INSTRUCTION, MATH_INSTRUCTION):
        head, _, tail = template.partition("{prompt}")
        head = re.escape(head.replace("{{", "{").replace("}}", "}")).replace(r"\{entry_point\}", r"\w+")
        tail = re.escape(tail.replace("{{", "{").replace("}}", "}"))
        text = re.sub(rf"^\s*{head}", "", text) if head else text
        text = re.sub(rf"{tail}\s*$", "", text) if tail else text
    return _PHRASE_LINES.sub("", _FENCE.sub("", text))  # a phrase line left in would keep the code from parsing


def problem_parts(text: str) -> ProblemParts:
    """The statement, entry point and test signature of the problem in ``text`` (a prompt or user message)."""
    body = _unwrapped(text)
    code = _parse(body)
    defs = [n for n in (code.body if code else []) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if defs:
        header = f"{defs[-1].name}({ast.unparse(defs[-1].args)})"
        return ProblemParts(_clean(body), defs[-1].name, header)
    lines = body.splitlines()
    asserts = [i for i, line in enumerate(lines) if line.lstrip().startswith("assert ")]
    if not asserts:
        return ProblemParts(_clean(body), None, None)
    shown = _parse(lines[asserts[0]].strip())
    test = ast.unparse(shown) if shown else " ".join(lines[asserts[0]].split())
    tests = set(asserts)  # once: a set built per line made a prompt of n asserts cost n^2
    prose = "\n".join(line for i, line in enumerate(lines) if i not in tests)
    return ProblemParts(_clean(prose), _called(shown), test)


def _clean(text: str) -> str:
    return normalise(_PHRASES.sub(" ", normalise(text)))


def _parse(text: str) -> ast.Module | None:
    import warnings

    try:
        with warnings.catch_warnings():  # old benchmark code has invalid escapes such as '\w'
            warnings.simplefilter("ignore")
            return ast.parse(text)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None


def _called(tree: ast.Module | None) -> str | None:
    """The first function an assert calls that is not a builtin (``set(f(x)) == ...`` names ``f``)."""
    calls = [n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)] if tree else []
    return next((name for name in calls if name not in _BUILTINS), calls[0] if calls else None)


def task_content_key(task: Task) -> str:
    """The content key of ``task``: its prompt's statement, entry point and test signature (``problem_parts``)."""
    return problem_parts(task.prompt).key


@dataclass(frozen=True)
class BenchmarkMatch:
    """A benchmark task a text or task was recognised as."""

    benchmark: str
    """The benchmark's name as the user gave it (mbpp, humaneval, math500, aime24, ...)."""
    split: str | None
    """Its split (``molrl.tasks.splits``): test, train, validation or prompt."""
    id: str
    """Its id in the benchmark's file."""
    key: str
    """Its content key."""

    def to_meta(self) -> dict[str, Any]:
        """The ``meta["benchmark_task"]`` record of a trace."""
        return asdict(self)


class BenchmarkIndex:
    """Every task of some benchmarks, by tag, content key and statement: ``find`` is the one rule that decides which
    of them a trained task is (see the module docstring)."""

    def __init__(self, tasks: Mapping[str, Iterable[Task]]):
        """Index the tasks of each named benchmark (name -> its tasks, every split)."""
        self.by_key: dict[str, list[BenchmarkMatch]] = {}
        self._by_id: dict[tuple[str, str], list[BenchmarkMatch]] = {}  # (benchmark family, id) -> its tasks
        self._contained: list[tuple[str, str | None, BenchmarkMatch]] = []  # (statement, entry point, match)
        self.names = list(tasks)
        for name, items in tasks.items():
            for task in items:
                parts = problem_parts(task.prompt)
                match = BenchmarkMatch(name, task.split, str(task.id), parts.key)
                self.by_key.setdefault(parts.key, []).append(match)
                self._by_id.setdefault((_family(name), match.id), []).append(match)
                if len(parts.statement) >= MIN_CONTAINED:
                    self._contained.append((parts.statement, parts.entry_point, match))
        self._contained.sort(key=lambda item: -len(item[0]))  # the longest statement found comes first
        self._by_prefix: dict[str, list[int]] = {}  # a statement's first MIN_CONTAINED characters -> its places
        for place, (statement, _, _) in enumerate(self._contained):
            self._by_prefix.setdefault(statement[:MIN_CONTAINED], []).append(place)

    @classmethod
    def from_files(cls, files: Mapping[str, str | Path]) -> BenchmarkIndex:
        """The index of benchmark files given by name (``FORMATS``), each read whole by ``load_tasks``."""
        from molrl.tasks.loaders import load_tasks

        tasks = {}
        for name, path in files.items():
            if name not in FORMATS:
                raise MolrlError(f"benchmark {name!r} ({path}): unknown name; expected one of {', '.join(FORMATS)}")
            tasks[name] = load_tasks(path, FORMATS[name], split="all")
        return cls(tasks)

    def __len__(self) -> int:
        return sum(len(found) for found in self.by_key.values())

    def find(self, tags: Iterable[Mapping[str, Any]] = (), keys: Iterable[str] = (),
             texts: Iterable[str] = ()) -> list[BenchmarkMatch]:
        """Every benchmark task a trained item is, by the first test that finds any: its explicit ``tags``
        (benchmark and id), its content ``keys``, then the statements found whole in its ``texts`` (each a
        ``match_text``), the longest first."""
        found = [m for tag in tags for m in self._by_id.get((_family(str(tag["benchmark"])), str(tag["id"])), [])]
        found = found or [m for key in keys for m in self.by_key.get(key, [])]
        found = found or [self._contained[place][2] for text in texts for place in self._contained_in(text)]
        return list(dict.fromkeys(found))

    def _contained_in(self, text: str) -> list[int]:
        """The places in ``_contained`` of the statements found whole in ``text`` (with their entry point named in
        it): each start of ``text`` is looked up by its first MIN_CONTAINED characters, so a record of many texts
        costs one dictionary lookup per character, not one search per benchmark statement."""
        found = set()
        for start in range(len(text) - MIN_CONTAINED + 1):
            for place in self._by_prefix.get(text[start:start + MIN_CONTAINED], ()):
                statement, entry, _ = self._contained[place]
                if text.startswith(statement, start) and (entry is None or entry.lower() in text):
                    found.add(place)
        return sorted(found)

    def match_trace(self, messages: Iterable[Mapping[str, Any]], meta: Mapping[str, Any]) -> BenchmarkMatch | None:
        """The benchmark task a trace was made on (``find``): by its tag, its ``meta["task_key"]`` or its first user
        message's key, else by its first user message's text."""
        text = first_user_text(messages)
        tag = trace_tag(meta)
        keys = [str(meta[TASK_KEY])] if meta.get(TASK_KEY) else []
        found = self.find([tag] if tag else [], [*keys, problem_parts(text).key], [match_text(text)])
        return found[0] if found else None

    def match(self, item: str | Task) -> BenchmarkMatch | None:
        """The benchmark task ``item`` (a prompt text or a task) is (``find`` by its key, else its text), or None."""
        text = item.prompt if isinstance(item, Task) else item
        found = self.find(keys=[problem_parts(text).key], texts=[match_text(text)])
        return found[0] if found else None


def match_text(text: str) -> str:
    """The normalised text of a prompt that containment searches: without the wrappers molrl knows (``problem_parts``,
    step 1), normalised, its asserts kept."""
    return _clean(_unwrapped(text))


def _family(benchmark: str) -> str:
    """The loader format of a benchmark name (aime24 and aime25 are both aime); a name of one's own is itself."""
    return FORMATS.get(benchmark, benchmark)


def trace_tag(meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """The benchmark task a trace's meta names explicitly: ``meta["benchmark_task"]``, else the ``benchmark``,
    ``task_split`` and ``task_id`` fields ``molrl collect`` writes (the split may be left out, null, for a benchmark
    of ``FORMATS``: its id names the task); None when it names none."""
    found = meta.get(BENCHMARK_TASK)
    if isinstance(found, Mapping) and isinstance(found.get("benchmark"), str) and found.get("id") is not None:
        return {"benchmark": found["benchmark"], "split": found.get("split"), "id": str(found["id"]),
                "key": found.get("key")}
    benchmark, task_id = meta.get("benchmark"), meta.get("task_id")
    if not isinstance(benchmark, str) or task_id is None:
        return None
    split = meta.get("task_split")
    known = split is not None or benchmark in FORMATS
    return {"benchmark": benchmark, "split": split, "id": str(task_id), "key": None} if known else None


def parse_benchmarks(spec: str, option: str = "--benchmarks") -> dict[str, Path]:
    """``NAME=PATH,NAME=PATH`` (names from ``FORMATS``) as a mapping; ``option`` names the flag in errors."""
    files: dict[str, Path] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, path = item.partition("=")
        if not sep or not path or name.strip() not in FORMATS:
            raise MolrlError(f"{option} {item!r}: expected NAME=PATH with NAME one of {', '.join(FORMATS)}, "
                             "e.g. mbpp=data/mbpp/mbpp.jsonl,humaneval=data/humaneval/HumanEval.jsonl.gz")
        files[name.strip()] = Path(path.strip())
    if not files:
        raise MolrlError(f"{option} {spec!r}: names no benchmark file; give NAME=PATH,...")
    return files


def overlap_line(counts: Mapping[str, int], total: int, key: str) -> str:
    """One line: how many of ``total`` traces ``key`` left out as eval test tasks, per ``benchmark/split``."""
    left_out = sum(counts.values())
    parts = ", ".join(f"{label} {n}" for label, n in sorted(counts.items()))
    return (f"{key}: left out {left_out} of {total} traces whose task is one eval scores ({parts or 'none'}); "
            f"{total - left_out} remain")


def first_user_text(messages: Iterable[Mapping[str, Any]]) -> str:
    """The content of the first user message (the task, in every trace format molrl reads); '' when none."""
    return next((str(m.get("content") or "") for m in messages if m.get("role") == "user"), "")


def tag_meta(meta: dict[str, Any], text: str, index: BenchmarkIndex | None) -> BenchmarkMatch | None:
    """Set ``meta["task_key"]`` for a trace whose task is ``text``, and ``meta["benchmark_task"]`` when ``index``
    matches it; returns the match."""
    match = index.match(text) if index is not None else None
    meta[TASK_KEY] = match.key if match else problem_parts(text).key
    if match:
        meta[BENCHMARK_TASK] = match.to_meta()
    return match


def task_tags(task: Task) -> dict[str, Any]:
    """The meta fields of a trace collected on ``task``: its key, and itself as the benchmark task when a
    benchmark loader read it (``meta["source"]``)."""
    key = task_content_key(task)
    source = task.meta.get("source")
    if source not in FORMATS:
        return {TASK_KEY: key}
    return {TASK_KEY: key, BENCHMARK_TASK: BenchmarkMatch(source, task.split, str(task.id), key).to_meta()}


def trace_task_key(messages: Iterable[Mapping[str, Any]], meta: Mapping[str, Any]) -> str:
    """A trace's task key: ``meta["task_key"]`` when set, else the key of its first user message."""
    return str(meta.get(TASK_KEY) or problem_parts(first_user_text(messages)).key)
