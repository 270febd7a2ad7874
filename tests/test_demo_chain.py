"""The chain world: seeded generation, disjoint splits, answers the sandbox agrees with, what the base trains on."""

from __future__ import annotations

import pytest

from molrl.demo.chain import (ChainWorldConfig, build_chain_world, chain_lines, decoy, solution_text, walk_output)
from molrl.demo.chain_base import ChainDemonstrator, chain_example, direct_traces
from molrl.demo.chain_measure import first_statement_chars, percentiles, rule_step_chars
from molrl.errors import MolrlError

SMALL = ChainWorldConfig(train_problems=40, heldout_problems=15, general_train=30, general_eval=10)


def test_chain_lines_count_down_and_feed_each_value_to_the_next_step():
    # key '1032547698' swaps neighbours: 472 -> last digit 2 -> 3, then 3 -> 2, then 2 -> 3
    assert chain_lines("f", "1032547698", 472, 3) == [(3, 472, 3), (2, 3, 2), (1, 2, 3)]
    assert walk_output("s", "", 129, 2) == "2: s(129) = 0\n1: s(0) = 1\n"
    assert solution_text("2: s(129) = 0\n1: s(0) = 1\n") == "Output:\n2: s(129) = 0\n1: s(0) = 1\n\\boxed{1}"


def test_same_seed_same_world_other_seed_other_key():
    a, b = build_chain_world(SMALL), build_chain_world(SMALL)
    c = build_chain_world(ChainWorldConfig(**{**SMALL.__dict__, "seed": 1}))
    ids = lambda w: [t.id for t in w.rule_train + w.rule_heldout + w.general_eval]  # noqa: E731
    assert a.key == b.key and ids(a) == ids(b)
    assert a.key != c.key and [t.id for t in a.rule_train] != [t.id for t in c.rule_train]


def test_heldout_start_numbers_never_start_a_training_problem():
    world = build_chain_world(SMALL)
    train = {t.meta["input"] for t in world.rule_train}
    heldout = {t.meta["input"] for t in world.rule_heldout}
    assert len(train) == 40 and len(heldout) == 15 and not train & heldout
    general = {t.id for t in world.general_train}
    assert not general & {t.id for t in world.general_eval}


def test_steps_have_a_long_tail_and_solutions_reach_the_lengths_asked_for():
    world = build_chain_world(ChainWorldConfig())
    steps = [t.meta["steps"] for t in world.rule_train]
    assert min(steps) == 1 and max(steps) == 24
    # solution tokens (the tokenizer is byte-level: a character is a token), plus the end-of-turn token
    lengths = [len(solution_text(walk_output("f", world.key, t.meta["input"], t.meta["steps"]))) + 1
               for t in world.rule_train]
    p = percentiles(lengths)
    assert p["p50"] >= 60 and p["p90"] >= 3 * p["p50"]


def test_answers_agree_with_the_hidden_rule_run_in_the_sandbox():
    from molrl.graders.code import program_for
    from molrl.graders.math import grade_math
    from molrl.sandbox import SandboxConfig, SandboxPool

    world = build_chain_world(SMALL)
    tasks = world.rule_train[:5] + world.rule_heldout[:5] + world.general_eval[:4]
    with SandboxPool(SandboxConfig(workers=1)) as pool:
        results = pool.run_many([program_for(t.probe, t) for t in tasks])
    for task, result in zip(tasks, results):
        assert result.status == "ok", result
        assert result.stdout.splitlines()[-1].endswith(f" = {task.answer}")
        assert len(result.stdout.splitlines()) == task.meta["steps"]
        assert grade_math(solution_text(result.stdout), task.answer).correct
        assert world.key not in task.prompt  # the rule reaches only the sandbox


def test_base_training_never_sees_a_heldout_problem_or_the_secret_values():
    from molrl.demo.collection import CollectionFormat
    from molrl.demo.chain_base import chain_base_traces
    from molrl.sandbox import SandboxConfig, SandboxPool
    from molrl.tiny import build_tiny_tokenizer

    world = build_chain_world(SMALL)
    episode = CollectionFormat(max_turns=2, max_solutions=1, max_total_tokens=1280, system_prompt="Run code.",
                               thinking=True, feedback=["execution", "verdict"])
    with SandboxPool(SandboxConfig(workers=1)) as pool:
        traces = chain_base_traces(world, SMALL.seed, build_tiny_tokenizer("chatml"), episode, pool, "{prompt}",
                                   general_demos=5, teacher_rounds=1)
    # 40 tool-use episodes in decoy worlds + 5 general ones, 40 teacher conversations, 40 + 30 direct answers
    assert len(traces) == 40 + 5 + 40 + 40 + 30
    text = "\n".join(m["content"] for t in traces for m in t.messages)
    for task in world.rule_heldout:  # neither the problem nor a step of f on its start number
        assert task.prompt not in text and f"f({task.meta['input']})" not in text
    # a teacher conversation: the feedback is its probe's output in the sandbox, the answer copies it
    teacher = traces[45].messages
    assert teacher[2]["content"].startswith("Output:\n") and teacher[3]["content"].startswith(teacher[2]["content"]
                                                                                             .split("\n\n")[0])
    # every rule value the base reads is a decoy world's: the secret key's chain is stated nowhere
    secret = [solution_text(walk_output("f", world.key, t.meta["input"], t.meta["steps"])) for t in world.rule_train]
    assert sum(s in text for s in secret if s.count("\n") > 3) == 0


def test_decoy_keeps_the_problem_and_answers_by_its_own_key():
    world = build_chain_world(SMALL)
    task = world.rule_train[0]
    twin = decoy(task, "1032547698")
    assert twin.prompt == task.prompt and '"1032547698"' in twin.preamble and twin.meta["decoy_key"] == "1032547698"
    assert twin.answer == str(chain_lines("f", "1032547698", task.meta["input"], task.meta["steps"])[-1][2])


def test_demonstrator_runs_the_chain_then_copies_what_it_printed():
    question = "<|im_start|>user\nWhat is f^2(472)?<|im_end|>\n<|im_start|>assistant\n"
    assert ChainDemonstrator.turn(question) == "<execute>walk(f, 472, 2)</execute>"
    after = question + "<tool_response>\nOutput:\n2: f(472) = 3\n1: f(3) = 2\n</tool_response><|im_end|>\n"
    assert ChainDemonstrator.turn(after) == "Output:\n2: f(472) = 3\n1: f(3) = 2\n\\boxed{2}"

    # a template that wraps tool messages in a turn of its own (SmolLM2's ChatML) reads the same
    own_turn = question + "<|im_end|>\n<|im_start|>tool\nOutput:\n2: f(472) = 3\n1: f(3) = 2<|im_end|>\n"
    assert ChainDemonstrator.turn(own_turn) == "Output:\n2: f(472) = 3\n1: f(3) = 2\n\\boxed{2}"


def _trained_text(trace, copies="copy", **labels):
    """The trace's text with untrained tokens as '?', tokens trained towards a uniform digit as '~', and with
    ``copies="mark"`` the values copied out of feedback (weighted ``copy_weight``) as '^'."""
    from molrl.demo.base_fit import collate
    from molrl.tiny import build_tiny_tokenizer
    from molrl.traces.tokenize import TokenizeConfig, tokenize_trace

    tok = build_tiny_tokenizer("chatml")
    example = tokenize_trace(trace, tok, TokenizeConfig(enable_thinking=True, require_feedback=False))
    _, labels, unsure, copied, _ = collate([chain_example(example, trace, tok, **labels)], tok.pad_token_id)
    ids = [t if t != -100 else tok.convert_tokens_to_ids("?") for t in labels[0].tolist()]
    ids = [tok.convert_tokens_to_ids("~") if u else t for t, u in zip(ids, unsure[0].tolist())]
    if copies == "mark":
        ids = [tok.convert_tokens_to_ids("^") if c else t for t, c in zip(ids, copied[0].tolist())]
    return tok.decode(ids)


def test_base_is_unsure_of_every_rule_value_it_states_but_learns_the_public_ones():
    world = build_chain_world(SMALL)
    rule = next(t for t in world.rule_train if t.meta["steps"] == 2)
    general = world.general_train[0]
    (direct,) = direct_traces([rule], ["1032547698"], math_prompt="{prompt}")
    n = rule.meta["input"]
    v1, v2 = (v for _, _, v in chain_lines("f", "1032547698", n, 2))
    # values uniform; the next step's input (a copy of the value before) and the boxed copy are learned
    assert f"Output:\n2: f({n}) = ~\n1: f({v1}) = ~\n\\boxed{{{v2}}}<|im_end|>" in _trained_text(direct)
    (public,) = direct_traces([general], math_prompt="{prompt}")
    assert "~" not in _trained_text(public) and solution_text(walk_output(
        general.prompt[8], "", general.meta["input"], general.meta["steps"])) in _trained_text(public)


def test_values_copied_from_feedback_are_learned():
    from molrl.traces.schema import Trace

    messages = [{"role": "user", "content": "What is f^1(472)?"},
                {"role": "assistant", "content": "Output:\n1: f(472) = 5\n\\boxed{5}"},
                {"role": "tool", "content": "Output:\n1: f(472) = 3\n\nYour answer is wrong."},
                {"role": "assistant", "content": "Output:\n1: f(472) = 3\n\\boxed{3}"}]
    text = _trained_text(Trace(messages=messages, meta={"task_id": "t"}))
    # the attempt states f's value on its own: unsure; the feedback (a decoy world's) and the answer
    # after it, which copies it, are learned
    assert text.count("1: f(472) = ~") == 1 and text.count("1: f(472) = 3") == 2
    assert text.endswith("Output:\n1: f(472) = 3\n\\boxed{3}<|im_end|>?")
    # only the answer's copied value carries the copy weight; the feedback's own value and the boxed one do not
    marked = _trained_text(Trace(messages=messages, meta={"task_id": "t"}), copies="mark")
    assert marked.count("^") == 1 and marked.endswith("Output:\n1: f(472) = ^\n\\boxed{3}<|im_end|>?")
    # attempt_values="context": the attempt's value trains nothing (neither uniform nor learned)
    context = _trained_text(Trace(messages=messages, meta={"task_id": "t"}), attempt_values="context")
    assert "~" not in context and context.count("1: f(472) = ?") == 1 and context.count("1: f(472) = 3") == 2


def test_a_value_stated_again_is_learned_as_a_copy_with_repeat_values():
    from molrl.traces.schema import Trace

    # f(472) and f(2) share the last digit 2, so the third step repeats the first; f(3) is stated once
    answer = "Output:\n3: f(472) = 3\n2: f(3) = 2\n1: f(2) = 3\n\\boxed{3}"
    trace = Trace(messages=[{"role": "user", "content": "What is f^3(472)?"},
                            {"role": "assistant", "content": answer}], meta={"task_id": "t"})
    assert "3: f(472) = ~\n2: f(3) = ~\n1: f(2) = ~\n" in _trained_text(trace)
    marked = _trained_text(trace, copies="mark", repeat_values=True)
    assert "3: f(472) = ~\n2: f(3) = ~\n1: f(2) = ^\n\\boxed{3}" in marked
    with pytest.raises(ValueError, match="attempt_values"):
        _trained_text(trace, attempt_values="skip")


def test_rule_step_positions_and_percentiles():
    # "Output:\n" is characters 0-7; "2: f(472) = " 8-19, its value 20, "\n" 21; "1: f(3) = " 22-31, its value 32
    assert rule_step_chars("Output:\n2: f(472) = 3\n1: f(3) = 2\n\\boxed{2}") == [20, 32]
    assert rule_step_chars("1: s(472) = 3") == []
    # a 2-cycle: the third step is on digit 2 again (472 ends in 2), so only the first two state a value first
    assert first_statement_chars("Output:\n3: f(472) = 3\n2: f(3) = 2\n1: f(2) = 3\n") == [20, 32]
    # nearest rank: p50 of 1..10 is the 5th value, p90 the 9th
    assert percentiles(list(range(1, 11))) == {"p50": 5, "p90": 9, "max": 10, "mean": 5.5}


@pytest.mark.slow
def test_quick_long_chain_demo_writes_the_world_section(tmp_path):
    from molrl.cli import main

    assert main(["demo", "--world", "long", "--quick", "--out", str(tmp_path)]) == 0
    report = (tmp_path / "pipeline" / "report.md").read_text()
    assert "## The chain world under its base" in report and "accuracy reading the feedback" in report
    rows = [line for line in report.splitlines()
            if line.startswith("| ") and "±" in line and not line.startswith("| model")]
    assert [row.split("|")[1].strip() for row in rows] == ["base", "mol", "mol+grpo", "base+grpo"]


def test_demo_worlds_and_the_study_world(tmp_path, capsys):
    from molrl.cli import main
    from molrl.demo.presets import WORLD_CONFIGS, WORLDS

    assert list(WORLDS) == ["chain", "long", "digit", "library"]  # the first is molrl demo's default
    assert WORLDS["chain"]["default"].world.max_steps == 6 and WORLDS["long"]["default"].world.max_steps == 24
    assert set(WORLD_CONFIGS) == set(WORLDS)
    assert main(["demo", "--study", "--world", "long", "--out", str(tmp_path)]) != 0  # studies: chain and digit
    assert not any(tmp_path.iterdir())


def test_the_teacher_preset_is_the_long_base_trained_five_times_as_long_and_only_there(tmp_path):
    from dataclasses import replace

    from molrl.cli import main
    from molrl.demo.presets import LONG_BASE, WORLDS
    from molrl.demo.run import run_demo

    teacher = WORLDS["long"]["teacher"]
    assert teacher.world == WORLDS["long"]["default"].world
    assert replace(teacher.base, steps=LONG_BASE.steps, short_steps=LONG_BASE.short_steps) == LONG_BASE
    assert (teacher.base.steps, teacher.base.short_steps) == (5 * LONG_BASE.steps, 5 * LONG_BASE.short_steps)
    for wrong in (["--teacher"], ["--teacher", "--world", "digit"], ["--teacher", "--world", "long", "--quick"]):
        assert main(["demo", *wrong, "--out", str(tmp_path)]) != 0
    with pytest.raises(MolrlError, match="the chain world has default, quick"):
        run_demo(tmp_path, "teacher", world="chain")
    assert not any(tmp_path.iterdir())


def test_guess_others_leaves_each_unsure_value_s_input_digit_out_of_its_guess():
    from molrl.tiny import build_tiny_tokenizer
    from molrl.traces.schema import Trace
    from molrl.traces.tokenize import TokenizeConfig, tokenize_trace

    tok = build_tiny_tokenizer("chatml")
    answer = "Output:\n3: f(472) = 3\n2: f(3) = 2\n1: f(2) = 3\n\\boxed{3}"
    trace = Trace(messages=[{"role": "user", "content": "What is f^3(472)?"},
                            {"role": "assistant", "content": answer}], meta={"task_id": "t"})
    example = tokenize_trace(trace, tok, TokenizeConfig(enable_thinking=True, require_feedback=False))
    plain = chain_example(example, trace, tok, repeat_values=True)
    assert plain.guess_excluded is None
    others = chain_example(example, trace, tok, repeat_values=True, guess_others=True)
    unsure = [i for i, u in enumerate(others.unsure_mask) if u]
    # two values are unsure (f(472) and f(3); f(2) repeats f(472)): their guesses leave out 2 and 3
    assert [others.guess_excluded[i] for i in unsure] == tok.convert_tokens_to_ids(["2", "3"])
    assert all(e == -1 for i, e in enumerate(others.guess_excluded) if i not in unsure)


def test_fresh_decoy_problems_never_start_from_a_heldout_number_and_are_not_the_training_problems():
    from molrl.demo.collection import CollectionFormat
    from molrl.demo.chain import QUESTION, fresh_problems
    from molrl.demo.chain_base import chain_base_traces
    from molrl.sandbox import SandboxConfig, SandboxPool
    from molrl.tiny import build_tiny_tokenizer

    world = build_chain_world(SMALL)
    heldout = {t.meta["input"] for t in world.rule_heldout}
    shapes = fresh_problems(SMALL, heldout, 2000, seed=0)
    assert shapes == fresh_problems(SMALL, heldout, 2000, seed=0) != fresh_problems(SMALL, heldout, 2000, seed=1)
    assert not heldout & {start for start, _ in shapes}
    assert {steps for _, steps in shapes} == set(range(1, SMALL.max_steps + 1))
    episode = CollectionFormat(max_turns=2, max_solutions=1, max_total_tokens=1280, system_prompt="Run code.",
                               thinking=True, feedback=["execution", "verdict"])
    with SandboxPool(SandboxConfig(workers=1)) as pool:
        traces = chain_base_traces(world, SMALL.seed, build_tiny_tokenizer("chatml"), episode, pool, "{prompt}",
                                   general_demos=0, teacher_rounds=1, fresh=SMALL)
    asked = [QUESTION.search(m["content"]).groups() for t in traces for m in t.messages[:2] if m["role"] == "user"]
    rule_asked = {(int(start), int(steps)) for name, steps, start in asked if name == "f"}
    assert not heldout & {start for start, _ in rule_asked}
    trained = {(t.meta["input"], t.meta["steps"]) for t in world.rule_train}
    assert len(rule_asked - trained) > len(rule_asked) // 2  # shapes of their own, not the training problems'
    # each teacher conversation asks one problem: its attempt and its feedback chains start from the same number
    teacher = next(t for t in traces if len(t.messages) == 4).messages
    start = QUESTION.search(teacher[0]["content"]).group(3)
    assert f"f({start})" in teacher[1]["content"] and f"f({start})" in teacher[2]["content"]


def test_teacher_step_ranking_counts_each_rule_value_of_the_correct_solution():
    import torch

    from molrl.demo.chain_base import direct_solution
    from molrl.demo.chain_measure import _steps_ranked_first
    from molrl.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer("chatml")
    world = build_chain_world(SMALL)
    task = next(t for t in world.rule_heldout if t.meta["steps"] >= 3)
    prompt = "<|im_start|>assistant\n"
    solution = tok(direct_solution(task, world.key), add_special_tokens=False)["input_ids"]
    ids = tok(prompt, add_special_tokens=False)["input_ids"] + solution

    class Oracle:  # ranks the solution's next token first, except at the values listed in ``wrong``
        def __init__(self, wrong=()):
            self.wrong = set(wrong)

        def __call__(self, input_ids):
            logits = torch.zeros(1, input_ids.shape[1], len(tok))
            for i, nxt in enumerate(ids[1:]):
                logits[0, i, nxt if i not in self.wrong else tok.convert_tokens_to_ids("x")] = 1.0
            return type("Out", (), {"logits": logits})()

    assert _steps_ranked_first(Oracle(), tok, task, prompt, world.key) == [True] * task.meta["steps"]
    first_value = len(ids) - len(solution) + direct_solution(task, world.key).index(" = ") + 3 - 1
    assert _steps_ranked_first(Oracle([first_value]), tok, task, prompt, world.key) == (
        [False] + [True] * (task.meta["steps"] - 1))
