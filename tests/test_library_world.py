"""The library world: every reference solution passes its held-back tests in the sandbox, the reading of the prompt
alone fails every function's quirk, the prompts state no quirk, and held-out tasks combine functions and call items
no training task does."""

from __future__ import annotations

import dataclasses

import pytest

from molrl.demo.library import FAMILIES, ITEMS, LibraryConfig, build_library_world
from molrl.graders.code import grade_code
from molrl.sandbox import SandboxConfig, SandboxPool

SMALL = LibraryConfig(train_twists=3, heldout_twists=3, general_train=10, general_eval=10)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(workers=2, cache_size=0)) as p:
        yield p


@pytest.fixture(scope="module")
def world():
    return build_library_world(SMALL)


def fenced(code: str) -> str:
    return f"```python\n{code}```"


def test_every_reference_passes_its_held_back_tests(world, pool):
    tasks = world.train + world.heldout + world.general_train + world.general_eval
    grades = grade_code([fenced(t.reference) for t in tasks], tasks, pool)
    assert [(t.id, g.stage) for t, g in zip(tasks, grades) if g.stage != "all_pass"] == []


def test_which_code_passes_is_decided_by_each_functions_behaviour(pool):
    """For every function and every pair of its behaviours: the use written for one behaviour passes in a world with
    it and fails in a world with the other, so no answer is right without knowing the world (enumerated over
    QUIRKS)."""
    from molrl.demo.library import QUIRKS, Quirks, library_source, library_task, reference_helpers, reference_use

    base = build_library_world(SMALL)
    tables = (base.prices, base.stock, base.weights, base.ship_rates, base.items)
    first = {f: QUIRKS[f][0] for f in FAMILIES}
    programs, expect = [], []
    for family in FAMILIES:
        for written in QUIRKS[family]:
            for actual in QUIRKS[family]:
                def quirks(member):
                    q = {**first, family: member}
                    return Quirks(scale=q["price"], stock_shape=q["stock"], missing=q["weight"], ship_order=q["ship"])
                world = dataclasses.replace(base, quirks=quirks(actual), prices={
                    i: p // base.quirks.scale * quirks(actual).scale + 1 for i, p in base.prices.items()})
                world.preamble = library_source(world.quirks, world.prices, *tables[1:])
                task = library_task(world, (family,), 0, base.items, 4, __import__("random").Random(0), "train")
                args = "item, n" if family == "ship" else "item"
                code = (f"{reference_helpers(quirks(written), (family,))}def solve({args}):\n"
                        f"    return {reference_use(quirks(written), family)}\n")
                programs.append((task, fenced(code)))
                expect.append(((family, written, actual), written == actual))
    grades = grade_code([c for _, c in programs], [t for t, _ in programs], pool)
    assert [(key, g.stage == "all_pass") for (key, _), g in zip(expect, grades)] == expect
    # the weight quirk bites only on an item without a weight: every task using weight tests one
    world = build_library_world(SMALL)
    assert all(any(c.args[0] not in world.weights for c in t.tests)
               for t in world.train + world.heldout if "weight" in t.meta["family"])


def test_the_prompts_state_no_quirk_and_show_no_test_input(world):
    q = world.quirks
    for task in world.train + world.heldout:
        text = task.prompt
        assert "_PRICE" not in text and "in stock" not in text and "count" not in text and f"// {q.scale}" not in text
        assert "ship(item" not in text and "ship(n" not in text
        assert "KeyError" not in text and "None" not in text and "-1" not in text
        assert not any(f"'{c.args[0]}'" in text or f"`{c.args[0]}`" in text for c in task.tests)


def test_held_out_tasks_combine_other_functions_on_other_items(world):
    train_items = {c.args[0] for t in world.train for c in t.tests}
    heldout_items = {c.args[0] for t in world.heldout for c in t.tests}
    assert train_items and heldout_items and not train_items & heldout_items
    train_families = {t.meta["family"] for t in world.train}
    assert {t.meta["family"] for t in world.heldout}.isdisjoint(train_families)
    assert all("+" in t.meta["family"] for t in world.heldout)
    assert not {t.prompt for t in world.general_eval} & {t.prompt for t in world.general_train}
    assert all(i in ITEMS for i in train_items | heldout_items)


def test_a_world_is_its_seed():
    a, b = build_library_world(SMALL), build_library_world(SMALL)
    assert (a.quirks, a.preamble, [t.to_json() for t in a.train]) == (b.quirks, b.preamble, [t.to_json() for t in b.train])
    quirks = {build_library_world(dataclasses.replace(SMALL, seed=s)).quirks for s in range(8)}
    assert len(quirks) > 2


def test_running_code_shows_each_quirk_in_a_form_unlike_the_answer(world, pool):
    """What an agent sees when it probes: printed values and a traceback, not the code it must write."""
    q = world.quirks
    priced = next(iter(world.prices))
    unweighted = next(i for i in world.prices if i not in world.weights)
    snippets = [world.probe("price", priced), world.probe("stock", priced), world.probe("weight", unweighted),
                world.probe("ship", priced)]
    results = pool.run_many([world.preamble + "\n" + s for s in snippets])
    price, stock, weight, ship = results
    assert price.stdout == f"{world.prices[priced]}\n"  # in the library's unit: its digits tell the unit
    assert len(price.stdout.strip()) == len(str(q.scale))
    shown = {"int": f"{world.stock[priced]}", "sentence": f"'{world.stock[priced]} in stock'",
             "dict": f"{{'count': {world.stock[priced]}}}"}[q.stock_shape]
    assert stock.stdout == shown + "\n"
    if q.missing == "KeyError":
        assert weight.status == "runtime_error" and "KeyError" in weight.stderr
    else:
        assert weight.stdout == f"{q.missing}\n"
    if q.ship_order == "item, n":
        assert ship.stdout == f"{2 * world.ship_rates[priced]}\n"
    else:
        assert ship.status == "runtime_error" and "KeyError: 2" in ship.stderr  # the count where the item goes


def test_a_task_file_keeps_the_library_for_the_sandbox(world, tmp_path, pool):
    """A task file line carries the preamble (lib), so eval, collect and rl on the file run what the world runs."""
    import json

    from molrl.demo.run import task_record
    from molrl.task_types import JsonlSpec
    from molrl.tasks import load_tasks

    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(task_record(t)) + "\n" for t in world.heldout))
    loaded = load_tasks(path, "jsonl", spec=JsonlSpec(kind="code"))
    assert [(t.id, t.preamble, t.tests) for t in loaded] == [(t.id, t.preamble, t.tests) for t in world.heldout]
    grades = grade_code([fenced(t.reference) for t in world.heldout], loaded, pool)
    assert all(g.stage == "all_pass" for g in grades)


def test_the_pilots_control_states_each_quirk_and_keeps_the_task(world):
    from molrl.demo.library import told

    for task in world.train[:3] + world.heldout[:3]:
        control = told(world, task)
        assert control.tests == task.tests and control.preamble == task.preamble and control.id != task.id
        assert "Note: " in control.prompt and "Note: " not in task.prompt
        head, ask = task.prompt.split(" Write a Python")
        assert control.prompt.startswith(head) and control.prompt.endswith(" Write a Python" + ask)
    price = next(t for t in world.train if t.meta["family"] == "price")
    unit = {10: "tenths", 100: "hundredths", 1000: "thousandths"}[world.quirks.scale]
    assert f"counts in {unit} of a unit" in told(world, price).prompt


def test_held_out_twists_are_never_a_training_tasks_in_any_world():
    """A held-out task's text is one no training task of any world has (so no base taught in decoy libraries saw
    it): its twist is a held-out one."""
    from molrl.demo.library import HELDOUT_TWISTS, TWISTS

    assert not {say for say, _, _ in TWISTS} & {say for say, _, _ in HELDOUT_TWISTS}
    worlds = [build_library_world(dataclasses.replace(SMALL, seed=s)) for s in range(6)]
    train_prompts = {t.prompt for w in worlds for t in w.train}
    assert all(t.prompt not in train_prompts for w in worlds for t in w.heldout)
