"""The library world's base: the demonstrator reads every behaviour of every function from what its probes print,
under any chat template's ending; its episodes pass in the sandbox; the decoy libraries draw every behaviour and
never a held-out task's text; ``molrl demo --world library --quick`` runs every stage."""

from __future__ import annotations

import dataclasses
import itertools
import re

import pytest

from molrl.demo.library import FAMILIES, QUIRKS, LibraryConfig, Quirks, build_library_world, library_source
from molrl.demo.library_base import (LibraryDemonstrator, decoy_tasks, direct_code_traces, parse_ask, probe_code,
                                     read_quirks, solution_code)
from molrl.sandbox import SandboxConfig, SandboxPool

SMALL = LibraryConfig(train_twists=3, heldout_twists=3, general_train=6, general_eval=6)
EVERY = [Quirks(*combo) for combo in itertools.product(*(QUIRKS[f] for f in FAMILIES))]
"""Every library a world may have: each function's every behaviour, combined."""


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(workers=2, cache_size=0)) as p:
        yield p


def test_every_library_is_read_back_from_its_probes_output(pool):
    world = build_library_world(SMALL)
    whole = {i: p // world.quirks.scale for i, p in world.prices.items()}  # 1-9 units, in each library's own unit
    tables = (world.stock, world.weights, world.ship_rates, world.items)
    programs = [library_source(q, {i: w * q.scale + 1 for i, w in whole.items()}, *tables) + "\n" + probe_code(f)
                for q in EVERY for f in FAMILIES]
    results = pool.run_many(programs)
    assert len(EVERY) == 54
    for i, q in enumerate(EVERY):
        shown = "".join(r.stdout + r.stderr for r in results[4 * i: 4 * i + 4])
        for ending in ("\n", "<|im_end|>\n<|im_start|>assistant\n", ""):  # templates end a message differently
            feedback = "Output:\n" + "\n".join(probe_code(f) for f in FAMILIES) + "\n" + shown.rstrip("\n") + ending
            assert read_quirks(feedback) == {f: q.of(f) for f in FAMILIES}, (q, ending)


def test_the_demonstrator_solves_every_decoy_task_through_the_episode_loop(pool):
    from molrl.demo.collection import CollectionFormat, run_format
    from molrl.tiny import build_tiny_tokenizer

    fmt = CollectionFormat(max_turns=3, max_solutions=1, max_total_tokens=2048, feedback=["execution", "verdict"],
                           system_prompt="Run code in <execute></execute>. Submit the function in "
                                         "<solution></solution>.", thinking=True)
    tasks = decoy_tasks(40, 0, SMALL)
    episodes = run_format(LibraryDemonstrator(), build_tiny_tokenizer("chatml"), tasks, pool, fmt)
    assert [ep.task.id for ep in episodes if not ep.success] == []
    for ep in episodes:  # one probe per function the task uses, then the solution
        turns = [m["content"] for m in ep.to_trace({}).messages if m["role"] == "assistant"]
        families = ep.task.meta["family"].split("+")
        assert [re.search(r"# probe (\w+)", t).group(1) for t in turns[:-1]] == families
        assert turns[-1].startswith("<solution>") and "lib." in turns[-1]


def test_decoy_libraries_draw_every_behaviour_and_never_a_held_out_text():
    tasks = decoy_tasks(64, 0, SMALL)
    libraries = {t.preamble for t in tasks}
    assert len(libraries) > 50  # a library a task, nearly
    seen = {f: {t.meta["library"].split()[FAMILIES.index(f)] for t in tasks if f in t.meta["family"]}
            for f in FAMILIES}
    assert {f: len(v) for f, v in seen.items()} == {f: len(QUIRKS[f]) for f in FAMILIES}
    held = {t.prompt for s in range(5) for t in build_library_world(dataclasses.replace(SMALL, seed=s)).heldout}
    assert not held & {t.prompt for t in decoy_tasks(200, 1, SMALL)}
    assert decoy_tasks(8, 3, SMALL)[0].to_json() == decoy_tasks(8, 3, SMALL)[0].to_json()


def test_a_direct_answer_is_the_reference_in_one_python_block(pool):
    from molrl.graders.code import grade_code

    world = build_library_world(SMALL)
    traces = direct_code_traces(world.train[:6] + world.general_train[:3])
    answers = [t.messages[-1]["content"] for t in traces]
    assert all(a.startswith("```python\n") and a.endswith("```") and a.count("```") == 2 for a in answers)
    grades = grade_code(answers, world.train[:6] + world.general_train[:3], pool)
    assert all(g.stage == "all_pass" for g in grades)
    assert "Write a Python function `solve`" in traces[0].messages[0]["content"]


def test_solution_code_is_the_worlds_reference():
    world = build_library_world(SMALL)
    for task in world.train + world.heldout:
        families, twist = parse_ask(task.prompt)  # what the demonstrator reads off the prompt
        assert solution_code(families, twist, world.quirks) == task.reference


def test_quick_library_demo_runs_every_stage(tmp_path):
    from molrl.cli import main

    assert main(["demo", "--world", "library", "--quick", "--out", str(tmp_path)]) == 0
    run = tmp_path / "pipeline"
    report = (run / "report.md").read_text()
    rows = [line for line in report.splitlines()
            if line.startswith("| ") and "±" in line and not line.startswith("| model")]
    assert [row.split("|")[1].strip() for row in rows] == ["base", "mol", "mol+grpo", "base+grpo"]
    assert all((run / stage / "DONE").is_file() for stage in ("collect", "mol/mol", "rl/mol+grpo", "eval/base"))
    import json

    world = json.loads((tmp_path / "world" / "world.json").read_text())
    assert world["key"] == build_library_world(LibraryConfig(**world["config"])).quirks.key()
    heldout = [json.loads(line) for line in (tmp_path / "world" / "heldout.jsonl").read_text().splitlines()]
    assert heldout and all("lib = " in r["preamble"] and r["tests"] for r in heldout)


@pytest.mark.slow
def test_quick_library_demo_on_a_pretrained_model_warms_it_up_in_decoys_and_writes_the_headline(tmp_path):
    from molrl.cli import main
    from molrl.demo.run import prepare_seed

    # a small model that already writes text: the library demo's quick tiny base
    prepare_seed(tmp_path / "made", "quick", [], 0, None, "library")
    out = tmp_path / "out"
    args = ["demo", "--world", "library", "--model", str(tmp_path / "made" / "base"), "--quick", "--out", str(out)]
    assert main(args) == 0
    report = (out / "headline.md").read_text()
    assert "library world" in report and "decoy libraries" in report
    rows = [line for line in report.splitlines() if line.startswith("| `")]
    assert [r.split("|")[1].strip() for r in rows][:4] == ["`base`", "`base+grpo`", "`mol`", "`mol+grpo`"]
    warm = (out / "base" / "warm_up" / "traces.jsonl").read_text()
    assert "# probe " in warm and "<solution>" in warm and "```python" in warm


def test_every_rl_prompt_of_the_default_world_fits_the_configs_prompt_length():
    """GRPO leaves out a prompt longer than rl.max_prompt_length: none of the library world's may be (the tiny
    tokenizer is byte-level, the longest tokenisation)."""
    from pathlib import Path

    from molrl.chat import render
    from molrl.demo.presets import LIBRARY_PRESETS
    from molrl.pipeline.config import load_pipeline_config
    from molrl.tasks.prompts import user_message
    from molrl.tiny import build_tiny_tokenizer

    cfg = load_pipeline_config(Path(__file__).resolve().parents[1] / "configs" / "pipeline_library.yaml", ["model=x"])
    tokenizer = build_tiny_tokenizer("chatml")
    world = build_library_world(LIBRARY_PRESETS["default"].world)
    lengths = [len(tokenizer(render(tokenizer, [{"role": "user", "content": user_message(t)}],
                                    add_generation_prompt=True), add_special_tokens=False)["input_ids"])
               for t in world.train + world.general_train]
    assert max(lengths) <= cfg.rl["max_prompt_length"], max(lengths)
