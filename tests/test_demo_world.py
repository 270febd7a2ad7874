"""The demo world: a seeded hidden rule, disjoint splits, tasks the shared machinery can run."""

from __future__ import annotations

import pytest

from molrl.demo.base import ToolDemonstrator, answer_text, expression
from molrl.demo.world import WorldConfig, apply_rule, build_world, rule_setup_code, secret_key

SMALL = WorldConfig(train_problems=50, heldout_problems=20, general_train=30, general_eval=10)


def test_apply_rule_maps_the_last_digit_through_the_key():
    # key '1032547698' swaps neighbours: the last digit 9 -> 8, 2 -> 3
    assert apply_rule("1032547698", 429) == "8"
    assert apply_rule("1032547698", 112) == "3"


def test_secret_key_is_a_permutation_without_fixed_points():
    import random

    key = secret_key(random.Random(3))
    assert sorted(key) == list("0123456789")
    assert all(key[d] != str(d) for d in range(10))


def test_same_seed_same_world_other_seed_other_key():
    a, b, c = build_world(SMALL), build_world(SMALL), build_world(WorldConfig(**{**SMALL.__dict__, "seed": 1}))
    assert a.key == b.key and [t.id for t in a.rule_train] == [t.id for t in b.rule_train]
    assert a.key != c.key


def test_heldout_numbers_never_appear_in_training():
    world = build_world(SMALL)
    train = {t.meta["input"] for t in world.rule_train}
    heldout = {t.meta["input"] for t in world.rule_heldout}
    assert len(train) == 50 and len(heldout) == 20 and not train & heldout


def test_rule_answers_match_the_preamble_and_stay_hidden():
    world = build_world(SMALL)
    for task in world.rule_train + world.rule_heldout:
        assert len(task.answer) == 1
        assert world.key not in task.prompt  # the rule never reaches the model's view
    scope: dict = {}
    exec(rule_setup_code(world.key), scope)  # the sandbox runs this as the task preamble
    task = world.rule_heldout[0]
    assert str(scope["f"](task.meta["input"])) == task.answer


def test_general_answers():
    world = build_world(SMALL)
    by_id = {t.id: t.answer for t in world.general_train + world.general_eval}
    for task_id, answer in by_id.items():
        op, text = task_id.split("/")
        expected = {"reverse": text[::-1], "rotate": text[1:] + text[0], "g": text, "h": text[1] + text[0] + text[2]}[op]
        assert answer == expected


def test_general_setup_code_agrees_with_the_answers():
    from molrl.demo.world import GENERAL_SETUP

    world = build_world(SMALL)
    scope: dict = {}
    exec(GENERAL_SETUP, scope)  # the sandbox runs this as the general tasks' preamble
    for task in world.general_train + world.general_eval:
        assert task.preamble == GENERAL_SETUP
        assert str(scope[task.meta["family"]](task.meta["input"])) == task.answer


def test_demonstrator_writes_code_then_copies_the_output():
    first = ToolDemonstrator.turn("<|im_start|>user\nWhat is f(478)?<|im_end|>\n<|im_start|>assistant\n")
    assert first == "<execute>print('f(478) =', f(478))</execute>"
    later = ToolDemonstrator.turn("What is f(478)?...<tool_response>\nOutput:\nf(478) = 309\n</tool_response>")
    assert later == answer_text("f(478)", "309") == "f(478) = 309\n\\boxed{309}"


def test_expression_of_a_task():
    world = build_world(SMALL)
    assert expression(world.rule_train[0]) == f"f({world.rule_train[0].meta['input']})"


CODE = WorldConfig(train_problems=50, heldout_problems=20, general_train=30, general_eval=10,
                   code_problems=8, code_heldout=5)


def test_code_family_is_built_only_when_asked_and_leaves_the_rest_of_the_world_alone():
    plain, with_code = build_world(SMALL), build_world(CODE)
    assert not (plain.code_train or plain.code_general or plain.code_heldout)
    assert (len(with_code.code_train), len(with_code.code_general), len(with_code.code_heldout)) == (8, 8, 5)
    for split in ("rule_train", "rule_heldout", "general_train", "general_eval"):  # the same draws as without it
        assert [t.id for t in getattr(plain, split)] == [t.id for t in getattr(with_code, split)]
    assert plain.key == with_code.key


def test_code_problems_reuse_the_splits_so_no_heldout_number_is_trained_on():
    world = build_world(CODE)
    heldout = {t.meta["input"] for t in world.rule_heldout}
    assert {t.meta["input"] for t in world.code_heldout} <= heldout
    assert not {t.meta["input"] for t in world.code_train} & heldout


def test_code_answers_are_the_calls_values_and_the_reference_passes_its_test():
    from molrl.demo.world import GENERAL_SETUP

    world = build_world(CODE)
    scope: dict = {}
    exec(GENERAL_SETUP + rule_setup_code(world.key), scope)  # the functions' true values, for checking only
    for task in world.code_train + world.code_general + world.code_heldout:
        (test,) = task.tests
        assert task.prompt == f"Write solve() returning {task.meta['call']}."
        assert test.expected == eval(task.meta["call"], scope)
        solution: dict = {}
        exec(task.reference, solution)
        assert solution["solve"]() == test.expected


def test_code_problems_define_nothing_a_solution_could_call():
    world = build_world(CODE)
    for task in world.code_train + world.code_general + world.code_heldout:
        assert task.preamble == "" and task.setup_code == ""
        assert world.key not in task.to_json()


@pytest.fixture(scope="module")
def pool():
    from molrl.sandbox import SandboxConfig, SandboxPool

    with SandboxPool(SandboxConfig(workers=1)) as sandbox:
        yield sandbox


def _graded(task, answers, mode, pool):
    from molrl.graders.code import CodeRewardConfig, grade_code

    return [(g.stage, g.score) for g in grade_code(answers, [task] * len(answers), pool, CodeRewardConfig(mode=mode))]


def test_calling_the_rule_is_a_runtime_error_not_a_pass(pool):
    # the reward hack `return f(472)` would pass if the sandbox defined f for code-answer problems
    task = build_world(CODE).code_heldout[0]
    hack = f"```\ndef solve(): return {task.meta['call']}\n```"
    assert _graded(task, [hack], "staged", pool) == [("runtime_error", 0.2)]


def test_staged_and_binary_rewards_differ_on_broken_and_wrong_code_only(pool):
    from molrl.demo.base import direct_answer

    task = build_world(CODE).code_heldout[0]
    wrong = (int(task.meta["value"]) + 1) % 10
    answers = [direct_answer(task), f"```\ndef solve(): return {wrong}\n```", "```\ndef solve() return 1\n```",
               f"```\ndef solve(): return {task.meta['call']}\n```", "no code at all"]
    stages = ["all_pass", "partial", "compile_error", "runtime_error", "no_code"]
    # staged: pass 1, runs but wrong 0.3 (no test passed), compile error 0.1, runtime error 0.2, no code 0
    assert _graded(task, answers, "staged", pool) == list(zip(stages, [1.0, 0.3, 0.1, 0.2, 0.0]))
    assert _graded(task, answers, "binary", pool) == list(zip(stages, [1.0, 0.0, 0.0, 0.0, 0.0]))


def test_code_task_files_load_back_as_the_same_problems_without_preamble(tmp_path):
    from molrl.demo.run import write_world
    from molrl.tasks import JsonlSpec, load_tasks

    world = build_world(CODE)
    write_world(world, CODE, tmp_path)
    loaded = load_tasks(tmp_path / "code_heldout.jsonl", "jsonl", spec=JsonlSpec(kind="code"))
    assert [(t.id, t.prompt, t.entry_point, t.tests, t.preamble) for t in loaded] == \
        [(t.id, t.prompt, t.entry_point, t.tests, "") for t in world.code_heldout]
    rl = load_tasks(tmp_path / "code_rl_train.jsonl", "jsonl", spec=JsonlSpec(kind="code"))
    assert [t.id for t in rl] == [t.id for t in world.code_train + world.code_general[:4]]  # half as many general


def test_a_world_without_code_problems_writes_no_code_files(tmp_path):
    from molrl.demo.run import write_world

    write_world(build_world(SMALL), SMALL, tmp_path)
    assert not list(tmp_path.glob("code_*"))
