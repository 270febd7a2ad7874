"""The demo base model: demonstrations through the real loop, what it trains on, save/load."""

from __future__ import annotations

import math

import pytest

from molrl.demo.base import BaseModelConfig, base_example, expression, demonstration_traces, direct_traces, train_base
from molrl.demo.base_fit import collate
from molrl.demo.world import WorldConfig, build_world

WORLD = WorldConfig(train_problems=6, heldout_problems=2, general_train=4, general_eval=2)


@pytest.fixture(scope="module")
def demos():
    from molrl.demo.collection import CollectionFormat
    from molrl.sandbox import SandboxConfig, SandboxPool
    from molrl.tiny import build_tiny_tokenizer

    world = build_world(WORLD)
    episode = CollectionFormat(max_turns=2, max_solutions=1, system_prompt="Run code.", thinking=True,
                               feedback=["execution", "verdict"])
    with SandboxPool(SandboxConfig(workers=1)) as pool:
        tok = build_tiny_tokenizer("chatml")
        rule = demonstration_traces(world.rule_train, tok, episode, pool, hide_value=True)
        return world, rule + demonstration_traces(world.general_train, tok, episode, pool)


def test_demonstrations_get_every_output_from_the_sandbox(demos):
    world, traces = demos
    assert len(traces) == 10 and all(t.success for t in traces)
    for task, trace in [(world.rule_train[0], traces[0]), (world.general_train[0], traces[6])]:
        tool = [m["content"] for m in trace.messages if m["role"] == "tool"]
        assert tool[0] == f"Output:\n{expression(task)} = {task.answer}"
        assert tool[1] == "Your answer is correct."


def _trained_text(trace, learn_feedback=True):
    """The trace's text with every token the base does not train on shown as '?'."""
    from molrl.demo.base import without_trailing_feedback
    from molrl.tiny import build_tiny_tokenizer
    from molrl.traces.tokenize import TokenizeConfig, tokenize_trace

    tok = build_tiny_tokenizer("chatml")
    trace = trace if learn_feedback else without_trailing_feedback(trace)
    example = tokenize_trace(trace, tok, TokenizeConfig(enable_thinking=True, require_feedback=False))
    _, labels, unsure, _, _ = collate([base_example(example, trace, tok, learn_feedback)], tok.pad_token_id)
    ids = [t if t != -100 else tok.convert_tokens_to_ids("?") for t in labels[0].tolist()]
    # tokens the base must stay unsure of (f's values) show as '~'
    ids = [tok.convert_tokens_to_ids("~") if u else t for t, u in zip(ids, unsure[0].tolist())]
    return tok.decode(ids)


def test_base_learns_tool_output_except_the_rules_values(demos):
    world, traces = demos
    rule, general = world.rule_train[0], world.general_train[0]
    n, value = rule.meta["input"], rule.answer
    trained = _trained_text(traces[0])
    # the code, the tool's output line with f's value as a uniform guess, the answer without the
    # copied value (fitting it could teach f as well as copying), the verdict
    assert f"<execute>print('f({n}) =', f({n}))</execute><|im_end|>" in trained
    assert f"Output:\nf({n}) = {'~' * len(value)}?" in trained
    assert f"f({n}) = {'?' * len(value)}\n\\boxed{{{value}}}<|im_end|>" in trained and "Your answer is correct." in trained
    # a general function's output is learned whole (the base knows those functions)
    expr = f"{general.meta['family']}({general.meta['input']})"
    assert f"Output:\n{expr} = {general.answer}?" in _trained_text(traces[6])
    # with learn_feedback off, no tool output at all
    assert "Output:" not in _trained_text(traces[6], learn_feedback=False).replace("?", "")


def test_unsure_tokens_are_trained_towards_a_uniform_digit(tmp_path, demos):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    world, traces = demos
    cfg = BaseModelConfig(hidden_size=32, num_layers=1, steps=60, batch_size=4, learning_rate=1e-2, warmup_steps=5)
    rule = direct_traces(world.rule_train, kind="domain", hide_value=True)
    out = train_base(rule, cfg, tmp_path / "base")
    tok, model = AutoTokenizer.from_pretrained(out), AutoModelForCausalLM.from_pretrained(out)
    text = tok.apply_chat_template(rule[0].messages, tokenize=False)
    prefix = text[: text.index(" = ") + 3]
    with torch.no_grad():
        probs = model(**tok(prefix, return_tensors="pt")).logits[0, -1].softmax(-1)
    digits = probs[tok.convert_tokens_to_ids(list("0123456789"))]
    # most of the mass on the ten digits, spread evenly: entropy near log(10), no digit singled out
    spread = digits / digits.sum()
    assert digits.sum() > 0.8 and -(spread * spread.log()).sum() > 0.95 * math.log(10)


def test_base_saves_and_loads_with_its_chat_template(tmp_path, demos):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from molrl.chat import render

    world, traces = demos
    cfg = BaseModelConfig(hidden_size=32, num_layers=1, steps=3, batch_size=4)
    out = train_base([*traces, *direct_traces(world.general_train, math_prompt="{prompt}")], cfg, tmp_path / "base")
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    messages = traces[0].messages
    from molrl.tiny import build_tiny_tokenizer

    assert render(tok, messages) == render(build_tiny_tokenizer("chatml"), messages)
    assert model.config.hidden_size == 32


def test_training_is_deterministic(tmp_path, demos):
    world, traces = demos
    cfg = BaseModelConfig(hidden_size=32, num_layers=1, steps=3, batch_size=4)
    a = train_base(traces, cfg, tmp_path / "a")
    b = train_base(traces, cfg, tmp_path / "b")
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


def test_rule_format_examples_hide_the_value_but_teach_the_statement():
    world = build_world(WORLD)
    task = world.rule_train[0]
    (trace,) = direct_traces([task], kind="domain", hide_value=True, math_prompt="Q: {prompt}")
    assert trace.messages[0]["content"] == f"Q: {task.prompt}"
    trained = _trained_text(trace)
    # the value after "= " is never a target; the statement and the boxed copy of it are
    n = task.meta["input"]
    assert f"Output:\nf({n}) = {'~' * len(task.answer)}\n\\boxed{{{task.answer}}}<|im_end|>" in trained


def test_code_answer_examples_hide_the_value_and_teach_returning_the_stated_one():
    world = build_world(WorldConfig(train_problems=6, heldout_problems=2, general_train=4, general_eval=2,
                                    code_problems=2, code_heldout=1))
    rule, general = world.code_train[0], world.code_general[0]
    (hidden,) = direct_traces([rule], kind="domain", hide_value=True, code_prompt="{prompt}")
    (shown,) = direct_traces([general], code_prompt="{prompt}")
    assert hidden.messages[0]["content"] == rule.prompt
    call, value = rule.meta["call"], rule.meta["value"]
    # the value stated after "= " is a uniform guess; the solve() that returns the stated value is learned
    assert f"Output:\n{call} = ~\n```\ndef solve(): return {value}\n```<|im_end|>" in _trained_text(hidden)
    assert shown.messages[1]["content"] == (f"Output:\n{general.meta['call']} = {general.meta['value']}\n"
                                            f"```\ndef solve(): return {general.meta['value']}\n```")
    assert "~" not in _trained_text(shown).split("assistant")[-1]


def test_copy_weight_counts_each_copied_token_that_many_times():
    import random

    import torch

    from molrl.demo.base_fit import BaseExample, _fit_step
    from molrl.tiny import build_tiny_model

    torch.manual_seed(0)
    model = build_tiny_model(12, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, seed=0)
    ids = [1, 5, 7, 3, 9, 4, 2]
    learn = [False, True, True, True, True, False, True]
    unsure = [False, False, False, False, False, True, False]
    copied = [False, False, True, False, True, False, False]
    example = BaseExample(ids, learn, unsure, copied)
    digits = list(range(2, 12))
    with torch.no_grad():
        logps = model(input_ids=torch.tensor([ids])).logits[0, :-1].float().log_softmax(-1)  # [L-1, V]
    ce = [-logps[i - 1, ids[i]].item() for i in range(1, len(ids))]  # the loss of predicting token i
    guess = -logps[4, digits].mean().item()  # token 5 is trained towards a uniform digit
    for weight in (1.0, 4.0):
        cfg = BaseModelConfig(batch_size=1, micro_batch_size=1, copy_weight=weight)
        w = [1.0 + (weight - 1.0) * c for c in copied]
        expected = (sum(w[i] * ce[i - 1] for i in range(1, len(ids)) if learn[i]) + guess) / (
            sum(w[i] for i in range(1, len(ids)) if learn[i]) + 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        got = _fit_step(model, random.Random(0), [example], cfg, 0, digits, list(model.parameters()), opt,
                        torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0))
        assert math.isclose(got, expected, rel_tol=1e-5), (weight, got, expected)


def test_guess_excluded_spreads_the_uniform_target_over_the_other_nine_digits():
    import random

    import torch

    from molrl.demo.base_fit import BaseExample, _fit_step
    from molrl.tiny import build_tiny_model

    model = build_tiny_model(12, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, seed=0)
    ids = [1, 5, 7, 3, 9]
    learn = [False, True, True, False, True]
    unsure = [False, False, False, True, False]
    digits = list(range(2, 12))
    with torch.no_grad():
        logps = model(input_ids=torch.tensor([ids])).logits[0, :-1].float().log_softmax(-1)  # [L-1, V]
    ce = [-logps[i - 1, ids[i]].item() for i in range(1, len(ids))]
    # token 3 is unsure, and its guess leaves out token 7: the mean of -log p over the other nine digits
    nine = -sum(logps[2, d].item() for d in digits if d != 7) / 9
    cfg = BaseModelConfig(batch_size=1, micro_batch_size=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    example = BaseExample(ids, learn, unsure, None, [-1, -1, -1, 7, -1])
    got = _fit_step(model, random.Random(0), [example], cfg, 0, digits, list(model.parameters()), opt,
                    torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0))
    assert math.isclose(got, (ce[0] + ce[1] + ce[3] + nine) / 4, rel_tol=1e-5)
    assert not math.isclose(nine, -logps[2, digits].mean().item(), rel_tol=1e-3)  # the tenth digit mattered


def test_the_first_short_steps_draw_only_short_sequences(monkeypatch):
    import molrl.demo.base_fit as base_fit
    from molrl.demo.base_fit import BaseExample, fit
    from molrl.tiny import build_tiny_model

    drawn = []
    monkeypatch.setattr(base_fit, "_fit_step", lambda model, rng, pool, *rest: drawn.append(len(pool)) or 0.0)
    short = BaseExample([1, 2, 3], [False, True, True], [False] * 3)
    long = BaseExample(list(range(1, 11)), [False] + [True] * 9, [False] * 10)
    model = build_tiny_model(12, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, seed=0)
    fit(model, [short, long], BaseModelConfig(steps=5, short_steps=3, short_length=4), 0, list(range(2, 12)))
    assert drawn == [1, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="no sequence has at most 2 tokens"):
        fit(model, [short, long], BaseModelConfig(steps=5, short_steps=3, short_length=2), 0, list(range(2, 12)))


def test_a_base_is_reused_only_where_its_marker_says_the_same_making(tmp_path):
    import json

    from molrl.demo.base import made_before

    marker = tmp_path / "DONE"
    made_of = {"world": {"seed": 0}, "base": {"steps": 10}}
    assert not made_before(marker, made_of)  # nothing made yet
    marker.write_text(json.dumps(made_of))
    assert made_before(marker, made_of)
    assert not made_before(marker, {**made_of, "base": {"steps": 11}})
