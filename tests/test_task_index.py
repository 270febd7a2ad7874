"""Tasks are known by their content: one key per problem under any id or wrapper, and an index of the benchmarks
that recognises MINT's, molrl's and unknown wrappers."""

from __future__ import annotations

import json
import sys
import unicodedata
from collections import Counter
from pathlib import Path

import pytest

from molrl.errors import MolrlError
from molrl.task_types import Task
from molrl.tasks.index import (BENCHMARK_TASK, TASK_KEY, BenchmarkIndex, content_key, parse_benchmarks,
                               problem_parts, tag_meta, task_content_key, trace_task_key)
from molrl.tasks.loaders import mbpp_prompt
from molrl.tasks.prompts import user_message

BENCHMARKS = {"mbpp": "mbpp/mbpp.jsonl", "humaneval": "humaneval/HumanEval.jsonl.gz", "math500": "math500/test.jsonl",
              "aime24": "aime24/test.jsonl", "aime25": "aime25/test.jsonl"}
MBPP_TEXT = "Write a function to find sequences of lowercase letters joined with an underscore."
MBPP_TESTS = ["assert text_lowercase_underscore(\"aab_cbbbc\")==('Found a match!')",
              "assert text_lowercase_underscore(\"aab_Abbbc\")==('Not matched!')",
              "assert text_lowercase_underscore(\"Aaab_abbbc\")==('Not matched!')"]
MATH = "What is the smallest positive integer $n$ such that $17n \\equiv 1234 \\pmod{7}?$"


def _mbpp(task_id: str = "16", split: str | None = "test") -> Task:
    return Task(id=task_id, prompt=mbpp_prompt(MBPP_TEXT, MBPP_TESTS), kind="code",
                entry_point="text_lowercase_underscore", split=split, meta={"source": "mbpp"})


def _index() -> BenchmarkIndex:
    return BenchmarkIndex({"mbpp": [_mbpp()], "math500": [Task(id="test/x/1.json", prompt=MATH, kind="math",
                                                                 answer="2", split="test")]})


def test_key_ignores_case_width_and_whitespace():
    assert content_key("Find  the SUM\tof x.") == content_key("find the sum of x") == content_key("ｆｉｎｄ the sum of x")
    assert content_key("find the sum of x") != content_key("find the sum of y")
    assert len(content_key("x")) == 16 and int(content_key("x"), 16) >= 0


def test_mbpp_key_reads_the_entry_point_and_first_shown_assert():
    parts = problem_parts(_mbpp().prompt)
    assert parts.entry_point == "text_lowercase_underscore"
    assert parts.test == "assert text_lowercase_underscore('aab_cbbbc') == 'Found a match!'"
    assert parts.statement == "write a function to find sequences of lowercase letters joined with an underscore"


def test_showing_more_tests_or_another_wrapper_keeps_the_key():
    key = task_content_key(_mbpp())
    all_three = f"{MBPP_TEXT}\nYour code should pass these tests:\n\n" + "\n".join(MBPP_TESTS)
    mint = "Instructions...\n\n---\n\nTask:\nexample\nAssistant: x\n\n---\n\nTask:\n" + MBPP_TEXT + "\n" + MBPP_TESTS[0]
    assert problem_parts(all_three).key == key
    assert problem_parts(mint).key == key
    assert problem_parts(user_message(_mbpp())).key == key  # molrl's own single-turn instruction


def test_another_entry_point_or_test_is_another_task():
    renamed = MBPP_TEXT + "\n" + MBPP_TESTS[0].replace("text_lowercase_underscore", "text_match")
    other_test = MBPP_TEXT + "\n" + MBPP_TESTS[1]
    assert len({task_content_key(_mbpp()), problem_parts(renamed).key, problem_parts(other_test).key}) == 3


def test_the_same_task_under_another_id_matches_the_benchmarks():
    copy = _mbpp(task_id="my-own-7", split=None)
    match = _index().match(copy)
    assert (match.benchmark, match.split, match.id, match.key) == ("mbpp", "test", "16", task_content_key(copy))


def test_an_unknown_wrapper_matches_by_the_whole_statement():
    wrapped = f"You are a helpful tutor. Solve the problem below.\n\nProblem: {MATH}\n\nThink first."
    assert _index().match(wrapped).id == "test/x/1.json"
    assert _index().match("What is the smallest positive integer $n$?") is None  # a part is not the problem


def test_tag_meta_records_key_and_match_and_only_the_key_without_a_match():
    meta: dict = {}
    tag_meta(meta, user_message(_mbpp()), _index())
    assert meta[BENCHMARK_TASK] == {"benchmark": "mbpp", "split": "test", "id": "16", "key": task_content_key(_mbpp())}
    assert meta[TASK_KEY] == meta[BENCHMARK_TASK]["key"]
    other: dict = {}
    assert tag_meta(other, "Sort a list.", _index()) is None
    assert other == {TASK_KEY: content_key("sort a list")}
    assert trace_task_key([{"role": "user", "content": "Sort a list."}], {}) == other[TASK_KEY]


def test_benchmark_option_is_parsed_or_refused_in_one_line():
    assert parse_benchmarks("mbpp=a.jsonl, humaneval=b.jsonl.gz") == {"mbpp": Path("a.jsonl"),
                                                                      "humaneval": Path("b.jsonl.gz")}
    for bad in ("mbpp", "gsm8k=x.jsonl", "mbpp=", ","):
        with pytest.raises(MolrlError, match="--benchmarks"):
            parse_benchmarks(bad)


def _real_index(shared_data) -> BenchmarkIndex:
    return BenchmarkIndex.from_files({name: shared_data / path for name, path in BENCHMARKS.items()})


def test_real_mint_tasks_are_mbpp_test_humaneval_and_math500(shared_data):
    index = _real_index(shared_data)
    found: Counter = Counter()
    for path in sorted((shared_data / "traces/mint").glob("gpt-4-0613_F_None__*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            match = index.match(json.loads(line)["state"]["history"][0]["content"])
            found[(path.stem.rsplit("__", 1)[1], match and match.benchmark, match and match.split)] += 1
    assert found == {("mbpp", "mbpp", "test"): 91, ("humaneval", "humaneval", "test"): 45,
                     ("math", "math500", "test"): 7, ("math", None, None): 93}


def test_every_real_benchmark_task_matches_itself_under_molrl_s_instruction(shared_data):
    index = _real_index(shared_data)
    from molrl.tasks.loaders import load_tasks

    for name, fmt in (("mbpp", "mbpp"), ("humaneval", "humaneval"), ("math500", "math500")):
        for task in load_tasks(shared_data / BENCHMARKS[name], fmt, split="all"):
            match = index.match(user_message(task))
            assert match is not None and match.key == task_content_key(task), (name, task.id)


def test_every_real_mint_trace_keys_like_its_benchmark_task_without_an_index(shared_data):
    """The key alone, computed where no index was given (an import without ``--benchmarks``), is the benchmark
    task's: what eval compares a model's recorded keys against. HumanEval's prompt in MINT opens with "Complete the
    following code:", which once kept the code from parsing and left all 45 unmatched."""
    keys = _real_index(shared_data).by_key
    found: Counter = Counter()
    for path in sorted((shared_data / "traces/mint").glob("*__*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            history = json.loads(line)["state"]["history"]
            found[(path.stem.rsplit("__", 1)[1], trace_task_key(history, {}) in keys)] += 1
    files = len(list((shared_data / "traces/mint").glob("*__mbpp.jsonl")))
    assert found == {("mbpp", True): 91 * files, ("humaneval", True): 45 * files, ("math", True): 7 * files,
                     ("math", False): 93 * files}


FORMAT_CHARACTERS = [c for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf"]


def test_every_format_character_is_folded_out_of_the_normalised_text():
    plain = content_key("Find the sum of x.")
    assert len(FORMAT_CHARACTERS) > 150  # U+00AD, U+200B-U+200F, U+2060-U+2064, U+FEFF, U+E0001, ...
    assert all(content_key(f"Find the{chr(c)} sum of x{chr(c)}.") == plain for c in FORMAT_CHARACTERS)


def test_zero_width_spaces_inside_code_keep_its_key(shared_data):
    from molrl.tasks.loaders import load_tasks

    task = load_tasks(shared_data / BENCHMARKS["humaneval"], "humaneval")[0]
    hidden = task.prompt.replace("def ", "def \u200b").replace("List", "Li\u2060st\ufeff")
    assert problem_parts(hidden).key == task_content_key(task)  # before: the code no longer parsed, another key


def _two() -> BenchmarkIndex:
    """MBPP 16 (test) and a task of the train split, 700, whose statement holds 16's statement whole."""
    train = Task(id="700", prompt=mbpp_prompt(MBPP_TEXT + " Then count them.", MBPP_TESTS), kind="code",
                 entry_point="text_lowercase_underscore", split="train", meta={"source": "mbpp"})
    return BenchmarkIndex({"mbpp": [_mbpp(), train]})


def test_find_takes_the_tag_then_the_key_then_the_text():
    index, key16 = _two(), task_content_key(_mbpp())
    wrapped = f"please. {MBPP_TEXT.lower()} then count them. {MBPP_TESTS[1].lower()}"
    assert [m.id for m in index.find([{"benchmark": "mbpp", "id": "700"}], [key16], [wrapped])] == ["700"]
    assert [m.id for m in index.find([{"benchmark": "gsm8k", "id": "700"}], [key16], [wrapped])] == ["16"]
    assert [m.id for m in index.find(keys=["0" * 16], texts=[wrapped])] == ["700", "16"]  # every one, longest first
    assert index.find(keys=["0" * 16], texts=["please. write a function"]) == []


def test_a_trace_s_tag_decides_over_its_content():
    other = [{"role": "user", "content": "Reverse a string."}]
    tag = {"benchmark": "mbpp", "split": "test", "id": "16", "key": content_key("reverse a string")}
    assert _two().match_trace(other, {BENCHMARK_TASK: tag}).id == "16"
    assert _two().match_trace(other, {"benchmark": "mbpp", "task_id": 16}).id == "16"  # collect's fields
    assert _two().match_trace(other, {}) is None


@pytest.mark.parametrize("meta,tag", [
    ({BENCHMARK_TASK: {"benchmark": "humaneval", "split": "test", "id": "HumanEval/0", "key": None}},
     {"benchmark": "humaneval", "split": "test", "id": "HumanEval/0", "key": None}),
    ({"benchmark": "mbpp", "task_id": 16}, {"benchmark": "mbpp", "split": None, "id": "16", "key": None}),
    ({"benchmark": "mbpp", "task_id": "700", "task_split": "train"},
     {"benchmark": "mbpp", "split": "train", "id": "700", "key": None}),
    ({"source": "mint", "task_id": 3}, None),  # MINT's own ids name no benchmark
    ({"benchmark": None, "task_id": "x"}, None),  # collect on a file of one's own
    ({"benchmark": "toy", "task_id": "f/3"}, None),  # no split: a benchmark of nobody's
    ({"benchmark": "gsm8k", "task_id": 5, "task_split": "test"},
     {"benchmark": "gsm8k", "split": "test", "id": "5", "key": None}),
    ({BENCHMARK_TASK: "mbpp/16"}, None),
], ids=["benchmark_task", "collect", "collect with split", "mint", "own file", "toy", "gsm8k", "not a record"])
def test_trace_tag_reads_the_benchmark_a_trace_names(meta, tag):
    from molrl.tasks.index import trace_tag

    assert trace_tag(meta) == tag


KNOWN = {"as given", "wrapped", "zero-width spaces", "all tests shown", "another assert shown"}
"""The perturbations of benchmarks/matcher_paraphrase.py the rule follows (docs/splits.md's table)."""


@pytest.mark.parametrize("benchmark,task_id", [("mbpp", "16"), ("humaneval", "HumanEval/0")])
def test_the_paraphrase_limit_is_the_one_docs_splits_states(shared_data, benchmark, task_id):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import matcher_paraphrase

    index = BenchmarkIndex.from_files({"mbpp": shared_data / BENCHMARKS["mbpp"],
                                       "humaneval": shared_data / BENCHMARKS["humaneval"]})
    kinds = {}
    for name, found_id, kind, text in matcher_paraphrase.corpus(shared_data):
        if (name, found_id) == (benchmark, task_id):
            dropped, refused = matcher_paraphrase.verdicts(index, text)
            assert (dropped in refused) if dropped else not refused, kind  # exclusion and eval agree
            kinds[kind] = dropped == (benchmark, task_id)
    expected = {kind for kind in kinds if kind in KNOWN}
    assert {kind for kind, known in kinds.items() if known} == expected
    assert set(kinds) - KNOWN == ({"renamed function", "first word changed", "dropped import line"}
                                  if benchmark == "humaneval" else {"renamed function", "first word changed"})
