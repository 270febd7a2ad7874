"""One bad row fails alone: huge values, compile bombs and deeply nested answers, through the real paths.

Each test grades a batch in which correct completions sit beside one hostile row, and checks that
the correct rows keep their scores and the hostile row gets a grade of its own (never a crash of
the batch, never a pass).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from molrl.cli import main
from molrl.episode.actions import parse_action
from molrl.episode.environment import observe
from molrl.eval.grading import grade_samples
from molrl.graders.code import CodeRewardConfig
from molrl.rewards import CodeReward, MathReward
from molrl.tasks import Task, load_tasks

from graders_helpers import fenced, pool  # noqa: F401 - pool is a fixture

SRC = Path(__file__).resolve().parents[1] / "src" / "molrl"


@pytest.fixture(scope="module")
def triangle(shared_data) -> Task:
    """HumanEval/45, whose tests expect floats (7.5, 2.0, 40.0)."""
    tasks = load_tasks(shared_data / "humaneval" / "HumanEval.jsonl.gz", "humaneval")
    return next(t for t in tasks if t.id == "HumanEval/45")


RIGHT_TRIANGLE = fenced("def triangle_area(a, h):\n    return a * h / 2.0")
HUGE_INT = fenced("def triangle_area(a, h):\n    return 10**400")


def test_a_huge_int_for_a_float_is_a_wrong_answer_and_the_batch_keeps_its_scores(pool, triangle):
    reward = CodeReward(pool, CodeRewardConfig(mode="binary"))
    scores = reward(["p"] * 4, [RIGHT_TRIANGLE, HUGE_INT, RIGHT_TRIANGLE, "no code"], task_json=[triangle.to_json()] * 4)
    assert scores == [1.0, 0.0, 1.0, 0.0]
    huge = reward.last_grades[1]
    # judged, not crashed: every test ran and compared unequal
    assert huge.stage != "grader_error" and [t["error"] for t in huge.details["tests"]] == ["wrong answer"] * 3


def test_eval_predictions_with_a_huge_int_writes_samples_and_exits_0(shared_data, triangle, tmp_path):
    preds = tmp_path / "preds.jsonl"
    rows = [{"id": "HumanEval/45", "completion": c} for c in (RIGHT_TRIANGLE, HUGE_INT, RIGHT_TRIANGLE)]
    preds.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code = main(["eval", "partial_predictions=true", "--benchmarks", "humaneval", "--data", f"humaneval={shared_data / 'humaneval/HumanEval.jsonl.gz'}",
                 "--predictions", str(preds), "--out", str(tmp_path / "run")])
    assert code == 0
    samples = [json.loads(line) for line in (tmp_path / "run/humaneval/samples.jsonl").read_text().splitlines()]
    assert [(s["id"], s["correct"]) for s in samples] == [("HumanEval/45", True), ("HumanEval/45", False), ("HumanEval/45", True)]
    assert samples[1]["stage"] != "grader_error"  # judged as a wrong answer, not a failure to judge


# --- compile bombs and nested answers: each fails only its own row ------------------------------

CODE_BOMBS = [
    "(" * 3000 + ")" * 3000,               # 6 KB: the compiler recurses, then raises
    "x = " + "-" * 3000 + "1",
    "x = " + "[" * 3000 + "]" * 3000,
    "-" * 100_000 + "1",
]


def test_code_bombs_in_a_reward_batch_leave_the_correct_rows_scored(pool, triangle):
    completions = [RIGHT_TRIANGLE] + [fenced(b) for b in CODE_BOMBS] + [RIGHT_TRIANGLE]
    reward = CodeReward(pool)
    scores = reward(["p"] * len(completions), completions, task_json=[triangle.to_json()] * len(completions))
    assert scores[0] == scores[-1] == 1.0
    assert [g.stage for g in reward.last_grades[1:-1]] == ["compile_error"] * len(CODE_BOMBS)


MATH_BOMBS = [
    "\\boxed{" + "(" * 3000 + "1" + ")" * 3000 + "}",
    "\\boxed{" + "{" * 490 + "1" + "}" * 490 + "}",
    "\\boxed{" + "\\frac{" * 60 + "1" + "}{2}" * 60 + "}",
    "\\boxed{" + "\\sqrt{" * 120 + "4" + "}" * 120 + "}",
    "The answer is " + "(" * 3000 + "4" + ")" * 3000,
    "Final Answer: The value of $n$ is " + "[" * 400 + "4" + "]" * 400 + ".",
]


def test_math_bombs_in_a_reward_batch_leave_the_correct_rows_scored():
    task = Task(id="m", prompt="2+2?", kind="math", answer="4")
    completions = ["\\boxed{4}"] + MATH_BOMBS + ["The answer is 4."]
    reward = MathReward()
    scores = reward(None, completions, task_json=[task.to_json()] * len(completions))
    assert scores == [1.0] + [0.0] * len(MATH_BOMBS) + [1.0]
    reasons = [g.details.get("reason", "") for g in reward.last_grades[1:-1]]
    assert all(r.startswith(("answer longer than", "answer nests brackets deeper than")) for r in reasons), reasons


def test_eval_grading_keeps_correct_rows_beside_bombs(pool, triangle):
    math_task = Task(id="m", prompt="2+2?", kind="math", answer="4")
    records = grade_samples(
        [triangle, math_task],
        [[RIGHT_TRIANGLE, fenced(CODE_BOMBS[0]), HUGE_INT], ["\\boxed{4}", MATH_BOMBS[0], MATH_BOMBS[2]]],
        pool=pool,
    )
    assert [[r.correct for r in rs] for rs in records] == [[True, False, False], [True, False, False]]
    assert [r.stage for r in records[0]] == ["all_pass", "compile_error", "partial"]


def test_collect_observations_keep_correct_rows_beside_bombs(pool, triangle):
    math_task = Task(id="m", prompt="2+2?", kind="math", answer="4")
    items = [
        (triangle, parse_action(f"<solution>\n{RIGHT_TRIANGLE}\n</solution>", "code")),
        (triangle, parse_action(f"<solution>\n{fenced(CODE_BOMBS[0])}\n</solution>", "code")),
        (math_task, parse_action("<solution>" + MATH_BOMBS[1] + "</solution>", "math")),
        (math_task, parse_action("<solution>\\boxed{4}</solution>", "math")),
    ]
    assert [a.kind for _, a in items] == ["solution"] * 4
    assert [obs.verdict for obs in observe(pool, items)] == [True, False, False, True]


# --- no trainer-side path parses model-written text with Python's own compiler -----------------

MODEL_TEXT_PATHS = ["graders", "tasks/grade.py", "tasks/toy.py", "rewards.py", "rl", "eval", "collect", "episode",
                    "engines", "traces", "demo", "sandbox/pool.py",
                    "sandbox/slot.py", "sandbox/compare.py", "sandbox/runtime/codec.py", "sandbox/remote/harness.py"]
"""Where completions, and what their programs print, flow: generated (engines, the engine server), parsed into actions
and feedback (episode, collect), graded (graders, rewards, rl, eval, demo), read back from the sandbox, imported
(traces). Left out: tasks/asserts.py and tasks/index.py parse benchmark tests and a trace's task (its first user
message) at load time, and the rest of sandbox/runtime, like sandbox/remote's harness programs, runs inside the
sandbox."""
BUILTIN_PARSERS = {"compile", "eval", "exec"}
"""Builtins that compile text, called by their bare name or through ``builtins`` (``model.eval()`` compiles nothing)."""
PARSERS = {"ast.parse", "ast.literal_eval", "literal_eval", "sympify", "parse_expr", "parse_latex"}
"""Other parsers of text, by their module-qualified or bare name."""


def _parses(call: ast.Call) -> bool:
    """Whether a call hands text to a parser: a builtin by its name, another parser by its name on any object."""
    func = call.func
    if isinstance(func, ast.Name):
        return func.id in BUILTIN_PARSERS or func.id in PARSERS
    if not isinstance(func, ast.Attribute):
        return False
    owner = func.value.id if isinstance(func.value, ast.Name) else ""
    if func.attr in BUILTIN_PARSERS:
        return owner == "builtins"
    return f"{owner}.{func.attr}" in PARSERS or func.attr in PARSERS


@pytest.mark.parametrize("line, parses", [
    ("eval(s)", True), ("exec(s)", True), ("compile(s, 'x', 'exec')", True), ("builtins.eval(s)", True),
    ("ast.parse(s)", True), ("ast.literal_eval(s)", True), ("literal_eval(s)", True), ("sympy.sympify(s)", True),
    ("sympify(s)", True), ("parse_expr(s)", True), ("latex.parse_latex(s)", True),
    ("model.eval()", False), ("self.model.eval()", False), ("load(p).eval()", False), ("re.compile(s)", False),
    ("torch.compile(m)", False), ("tokenize.generate_tokens(r)", False),
])
def test_the_scan_flags_each_call_that_compiles_text_and_no_other(line, parses):
    assert _parses(ast.parse(line).body[0].value) is parses


def test_no_completion_path_compiles_or_evaluates_text():
    files = [p for rel in MODEL_TEXT_PATHS for p in ([SRC / rel] if rel.endswith(".py") else sorted((SRC / rel).rglob("*.py")))]
    found = [f"{p.relative_to(SRC)}:{node.lineno}: {ast.unparse(node.func)}(...)"
             for p in files for node in ast.walk(ast.parse(p.read_text(), str(p)))
             if isinstance(node, ast.Call) and _parses(node)]
    assert len(files) > 10 and found == []
