"""Task loaders and the conversion of assert-style tests into call tests."""

from __future__ import annotations

import json

import pytest

from molrl.errors import DataError, MolrlError
from molrl.tasks.asserts import assert_to_call, check_function_to_calls
from molrl.tasks import JsonlSpec, Task, TestCase, load_tasks


def test_literal_assert_becomes_a_call_test():
    test = assert_to_call("assert f([1, 2], 'a') == (3, {'k': None})", {"f"})
    assert test == TestCase("call", args=[[1, 2], "a"], expected=(3, {"k": None}))
    assert assert_to_call("assert 4 == f(2)", {"f"}).expected == 4


@pytest.mark.parametrize("source", [
    "assert math.isclose(f(2), 4.0)", "assert f(2) != 3", "assert f(x) == 1", "assert f(2) is None",
    "assert f(2) == g(2)", "assert f(2) == 1 and f(3) == 2",
])
def test_other_asserts_stay_for_the_judge(source):
    assert assert_to_call(source, {"f"}) is None


def test_non_literal_inputs_become_a_source_expression_only_when_allowed():
    assert assert_to_call("assert f(root) == 3", {"f"}) is None
    assert assert_to_call("assert f(root, 2) == 3", {"f"}, allow_source_args=True).args_source == "(root, 2, )"


def test_check_function_converts_only_when_every_assert_does():
    body = "def check(candidate):\n    assert candidate(1) == 2\n    assert True, 'note'\n    assert candidate(2) == 3\n"
    assert [t.args for t in check_function_to_calls(body)] == [[1], [2]]
    assert check_function_to_calls(body + "    for i in range(3):\n        assert candidate(i) == i + 1\n") is None


def test_humaneval_loads_with_preamble_and_judged_fallback(shared_data):
    tasks = load_tasks(shared_data / "humaneval" / "HumanEval.jsonl.gz", "humaneval")
    assert len(tasks) == 164 and tasks[0].id == "HumanEval/0"
    kinds = {t.tests[0].kind for t in tasks}
    assert kinds == {"call", "assert"}
    decode = next(t for t in tasks if t.id == "HumanEval/38")
    assert "def encode_cyclic" in decode.preamble and "def decode_cyclic" not in decode.preamble


def test_mbpp_both_files_and_quirks(shared_data):
    full = load_tasks(shared_data / "mbpp" / "mbpp.jsonl", "mbpp")
    deepseek = load_tasks(shared_data / "mbpp" / "mbpp_test_deepseek.jsonl", "mbpp")
    assert len(full) == 974 and len(deepseek) == 500
    by_id = {t.id: t for t in full}
    assert sum(t.split == "test" for t in full) == 500 and {t.split for t in deepseek} == {"test"}
    assert by_id["123"].meta["timeout_s"] == 30.0
    assert by_id["367"].setup_code.startswith("root = Node(1)") and by_id["367"].tests[0].args_source == "(root, )"
    assert "Your code should pass these tests" in by_id["11"].prompt and by_id["11"].entry_point == "remove_Occ"


def test_math_loaders(shared_data):
    math500 = load_tasks(shared_data / "math500" / "test.jsonl", "math500")
    aime24 = load_tasks(shared_data / "aime24" / "test.jsonl", "aime", limit=5)
    assert len(math500) == 500 and math500[0].meta["level"] in range(1, 6)
    assert len(aime24) == 5 and aime24[0].answer == "204"  # stored zero-padded as "204"; "025" -> "25"


def test_to_json_round_trip_keeps_exact_types():
    task = Task(id="t", prompt="p", kind="code", entry_point="f",
                tests=[TestCase("call", args=[(1, 2), {3}], expected=frozenset({b"x"}))], meta={"a": 1})
    back = Task.from_json(task.to_json())
    assert back == task and type(back.tests[0].args[0]) is tuple and json.loads(task.to_json())["id"] == "t"


def test_user_jsonl_with_spec(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [
        {"qid": "a", "q": "add", "fn": "add", "checks": ["assert add(1, 2) == 3", {"kind": "stdio", "stdin": "", "stdout": "x"}]},
        {"qid": "b", "q": "add", "fn": "add", "checks": ["assert add(1, 2) in (3, 4)"]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    spec = JsonlSpec(kind="code", id_field="qid", prompt_field="q", tests_field="checks", entry_point_field="fn")
    tasks = load_tasks(path, "jsonl", spec=spec)
    assert [t.kind for t in tasks[0].tests] == ["call", "stdio"] and tasks[1].tests[0].kind == "assert"


def test_bad_input_names_file_line_and_fix(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": 1, "prompt": "x", "answer": "1"}\n{"id": 2, "prompt": "y"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: missing field 'answer'"):
        load_tasks(path, "jsonl")
    with pytest.raises(MolrlError, match="unknown task format"):
        load_tasks(path, "gsm8k")


def test_jsonl_tasks_keep_their_sandbox_preamble(tmp_path):
    import json

    from molrl.tasks import JsonlSpec, load_tasks

    path = tmp_path / "rule.jsonl"
    path.write_text(json.dumps({"id": "r1", "prompt": "What is f(3)?", "answer": "7",
                                "preamble": "def f(n):\n    return n + 4\n"}) + "\n")
    (task,) = load_tasks(path, "jsonl", spec=JsonlSpec(kind="math"))
    assert task.preamble == "def f(n):\n    return n + 4\n" and task.answer == "7"


def test_test_sources_nested_past_the_compilers_limit_stay_unconverted():
    deep = "[" * 3000 + "]" * 3000
    assert assert_to_call(f"assert f({deep}) == 1", {"f"}) is None
    assert check_function_to_calls(f"def check(candidate):\n    assert candidate({deep}) == 1\n") is None
