"""The demo world: a seeded hidden rule, disjoint splits, tasks the shared machinery can run."""

from __future__ import annotations

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
