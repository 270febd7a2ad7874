"""Feedback providers: the exact words each one derives from a recorded observation."""

import re

import pytest

from molrl.episode.config import EpisodeConfig
from molrl.episode.feedback import (
    NO_FEEDBACK,
    BudgetFeedback,
    ExecutionFeedback,
    Observation,
    TestFeedback,
    VerdictFeedback,
    clip,
    render_feedback,
)
from molrl.episode.providers import build_providers
from molrl.errors import MolrlError
from molrl.sandbox.runtime.codec import encode
from molrl.tasks import Task, TestCase

TASK = Task(
    id="t", prompt="p", kind="code", entry_point="f",
    tests=[TestCase("call", args=[3], expected=9), TestCase("call", args=[0], expected=0),
           TestCase("assert", source="assert f(2) == 4"), TestCase("call", args=[[1, 2]], expected=(1, 2))],
)


def _exec(status="ok", stdout="", stderr="", truncated=False, duration_s=0.5, exit_code=0):
    return {"status": status, "exit_code": exit_code, "stdout": stdout, "stderr": stderr,
            "truncated": truncated, "duration_s": duration_s, "error": None}


def _grade(tests, status="ok", stage="partial", stderr_tail=""):
    passed = sum(t["passed"] for t in tests)
    return {"score": 0.0, "correct": stage == "all_pass", "stage": stage, "extracted": "",
            "details": {"status": status, "passed": passed, "total": len(tests), "tests": tests,
                        "stderr_tail": stderr_tail, "error": None}}


LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _chars(text):
    """A stand-in tokenizer: every character is one token."""
    return [(i, i + 1) for i in range(len(text))]


def test_clip_keeps_the_head_within_the_limit_marker_included():
    # 52 bytes into 40: the marker for 52 omitted bytes is 30 bytes ("\n[... 52 more bytes not shown]"),
    # so 10 letters fit; 42 are left out, and "\n[... 42 more bytes not shown]" is 30 bytes too: 40 in all.
    assert clip(LETTERS * 2, 40) == "abcdefghij\n[... 42 more bytes not shown]"


def test_clip_keeps_the_tail_within_the_limit_marker_included():
    # the tail marker "[... 52 earlier bytes not shown]\n" is 33 bytes: 7 letters fit, 45 are left out
    assert clip(LETTERS * 2, 40, keep="tail") == "[... 45 earlier bytes not shown]\ntuvwxyz"


def test_clip_counts_in_the_tokens_it_is_given():
    # one token per character: the marker "\n[... 52 more tokens not shown]" is 31 tokens, leaving 9
    assert clip(LETTERS * 2, 40, spans=_chars) == "abcdefghi\n[... 43 more tokens not shown]"
    assert clip(LETTERS, 26, spans=_chars) == LETTERS


def test_clip_never_keeps_part_of_a_character():
    # "é" is 2 bytes: 30 of them are 60 bytes; the 30-byte marker leaves 10 bytes, 5 whole characters
    assert clip("é" * 30, 40) == "ééééé\n[... 50 more bytes not shown]"
    # 11 bytes would split the sixth character: it is left out whole
    assert clip("é" * 30, 41) == "ééééé\n[... 50 more bytes not shown]"


def test_feedback_clipped_in_tokens_keeps_rare_unicode_within_the_cap(qwen3_tokenizer):
    # 2,000 CJK Extension B characters are 6,082 Qwen3 tokens: cut in characters (the old 2,000-character
    # limit) nothing was cut; in tokens, the quote is at most 512 of them, marker included
    import random

    from molrl.episode.quote import token_spans
    from molrl.content import encode_content

    rng = random.Random(0)
    rare = "".join(chr(rng.randrange(0x20000, 0x2A6DF)) for _ in range(2000))
    assert len(encode_content(qwen3_tokenizer, rare)[0]) == 6082
    provider = ExecutionFeedback(max_tokens=512, spans=token_spans(qwen3_tokenizer))
    text = provider(TASK, Observation("code", exec=_exec(stdout=rare)), [])
    quoted = text.removeprefix("Output:\n")
    assert 500 <= len(encode_content(qwen3_tokenizer, quoted)[0]) <= 512
    assert re.search(r"\n\[\.\.\. \d+ more tokens not shown\]$", quoted)


def test_feedback_shows_control_characters_and_bidi_overrides_escaped():
    printed = "a\x00b\x1b[31mc\u202ed\u2066e\x7f\tf\r\n"
    text, _ = render_feedback(build_providers(["execution"], EpisodeConfig()), TASK,
                              Observation("code", exec=_exec(stdout=printed)), [])
    assert text == "Output:\na\\x00b\\x1b[31mc\\u202ed\\u2066e\\x7f\tf\\x0d"


def test_feedback_escapes_a_lone_surrogate_in_an_error():
    # a program that raises ValueError(chr(0xD800)): no tokenizer can take the raw character
    tests = [{"index": 0, "kind": "call", "passed": False, "got": None, "error": "ValueError: \ud800"}]
    text, _ = render_feedback([TestFeedback()], TASK, Observation("solution", grade=_grade(tests)), [])
    assert text == "1 of 1 tests failed:\n- f(3) failed: ValueError: \\ud800"


def test_execution_feedback_shows_output_and_traceback_tail():
    obs = Observation("code", exec=_exec("runtime_error", stdout="3\n", stderr="Traceback ...\nZeroDivisionError: division by zero\n", exit_code=1))
    assert ExecutionFeedback()(TASK, obs, []) == "Output:\n3\nError:\nTraceback ...\nZeroDivisionError: division by zero"


def test_execution_feedback_truncates_long_output_with_a_marker():
    obs = Observation("code", exec=_exec(stdout="x" * 50 + "\n", truncated=True))
    # 50 bytes into 40: the 30-byte marker leaves 10
    text = ExecutionFeedback(max_tokens=40)(TASK, obs, [])
    assert text == ("Output:\n" + "x" * 10 + "\n[... 40 more bytes not shown]\n"
                    "(The output was longer than the sandbox keeps; the rest was not captured.)")


def test_execution_feedback_for_silent_success_and_timeout():
    assert ExecutionFeedback()(TASK, Observation("code", exec=_exec()), []) == "The code ran without error and printed nothing."
    timeout = Observation("code", exec=_exec("timeout", duration_s=10.04, exit_code=None))
    assert ExecutionFeedback()(TASK, timeout, []) == "Execution timed out after 10.0 s and was stopped."


def test_test_feedback_describes_failures_in_words():
    tests = [
        {"index": 0, "kind": "call", "passed": False, "got": encode(7), "error": "wrong answer"},
        {"index": 1, "kind": "call", "passed": True, "got": encode(0), "error": None},
        {"index": 2, "kind": "assert", "passed": False, "got": None, "error": "AssertionError"},
        {"index": 3, "kind": "call", "passed": False, "got": encode([1, 2]), "error": "wrong answer"},
    ]
    text = TestFeedback(max_failures=2)(TASK, Observation("solution", grade=_grade(tests)), [])
    assert text == (
        "3 of 4 tests failed:\n"
        "- f(3) returned 7, expected 9\n"
        "- assert f(2) == 4 failed: AssertionError\n"
        "(and 1 more)"
    )


def test_test_feedback_shows_returned_types_exactly():
    # A list came back where a tuple was expected: the words must show the difference.
    tests = [{"index": 3, "kind": "call", "passed": False, "got": encode([1, 2]), "error": "wrong answer"}]
    text = TestFeedback()(TASK, Observation("solution", grade=_grade(tests)), [])
    assert text == "1 of 1 tests failed:\n- f([1, 2]) returned [1, 2], expected (1, 2)"


def test_test_feedback_when_all_pass_or_code_does_not_compile():
    tests = [{"index": 1, "kind": "call", "passed": True, "got": encode(0), "error": None}] * 2
    assert TestFeedback()(TASK, Observation("solution", grade=_grade(tests, stage="all_pass")), []) == "All 2 tests passed."
    broken = {"score": 0.0, "correct": False, "stage": "compile_error", "extracted": "def f(:",
              "details": {"error": "SyntaxError: invalid syntax (solution.py, line 1)"}}
    assert TestFeedback()(TASK, Observation("solution", grade=broken), []) == (
        "The code does not compile: SyntaxError: invalid syntax (solution.py, line 1)"
    )


def test_test_feedback_when_grading_failed():
    failed = {"score": 0.0, "correct": False, "stage": "grader_error", "extracted": "def f(x): ...",
              "details": {"error": "OverflowError: int too large to convert to float"}}
    assert TestFeedback()(TASK, Observation("solution", grade=failed), []) == (
        "The tests could not be judged: grading failed (OverflowError: int too large to convert to float)."
    )


def test_verdict_and_budget_wording():
    math = Task(id="m", prompt="1+1?", kind="math", answer="2")
    assert VerdictFeedback()(math, Observation("solution", verdict=True), []) == "Your answer is correct."
    assert VerdictFeedback()(TASK, Observation("solution", verdict=False), []) == "Your solution is wrong."
    assert VerdictFeedback()(TASK, Observation("code"), []) is None
    assert BudgetFeedback()(TASK, Observation("code", turns_left=1, solutions_left=2), []) == (
        "You have 1 turn and 2 solution submissions left."
    )
    assert BudgetFeedback()(TASK, Observation("code", turns_left=0, final=True), []) is None


def test_render_joins_pieces_and_is_never_empty():
    providers = build_providers(["execution", "budget"], EpisodeConfig())
    text, pieces = render_feedback(providers, TASK, Observation("code", exec=_exec(stdout="hi\n"), turns_left=2, solutions_left=1), [])
    assert text == "Output:\nhi\n\nYou have 2 turns and 1 solution submission left."
    assert list(pieces) == ["execution", "budget"]
    assert render_feedback(providers, TASK, Observation("solution", final=True), [])[0] == NO_FEEDBACK


def test_an_old_config_with_feedback_max_chars_still_loads():
    from molrl.config import load_config

    # 2000 characters, the old default, read as 2000 / 4 = 500 tokens
    assert load_config(EpisodeConfig, overrides=["feedback_max_chars=2000"]).feedback_max_tokens == 500


def test_unknown_provider_name_is_a_clear_error():
    with pytest.raises(MolrlError, match="unknown feedback provider 'tests2'"):
        build_providers(["tests2"], EpisodeConfig())


def test_custom_provider_by_import_path():
    providers = build_providers(["test_episode_feedback:shout"], EpisodeConfig())
    assert render_feedback(providers, TASK, Observation("code"), [])[0] == "LOUD"


class _Shout:
    name = "shout"

    def __call__(self, task, obs, messages):
        return "LOUD"


def shout(cfg):
    """A custom provider factory, named in the config as module:factory."""
    return _Shout()
