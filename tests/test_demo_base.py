"""The demo base model: demonstrations through the real loop, decision-only training, save/load."""

from __future__ import annotations

import pytest

from molrl.demo.base import BaseModelConfig, collate, demonstration_traces, direct_traces, train_base
from molrl.demo.world import WorldConfig, build_world

WORLD = WorldConfig(train_problems=6, heldout_problems=2, general_train=4, general_eval=2)


@pytest.fixture(scope="module")
def demos():
    from molrl.collect.config import EpisodeConfig
    from molrl.sandbox import SandboxConfig, SandboxPool
    from molrl.tiny import build_tiny_tokenizer

    world = build_world(WORLD)
    episode = EpisodeConfig(max_turns=2, max_solutions=1, system_prompt="Run code.", feedback=["execution", "verdict"])
    with SandboxPool(SandboxConfig(workers=1)) as pool:
        return world, demonstration_traces(world, build_tiny_tokenizer("chatml"), episode, pool)


def test_demonstrations_get_the_rule_output_from_the_sandbox(demos):
    world, traces = demos
    assert len(traces) == 6 and all(t.success for t in traces)
    task = world.rule_train[0]
    tool = [m["content"] for m in traces[0].messages if m["role"] == "tool"]
    assert tool[0] == f"Output:\nf({task.meta['input']}) = {task.answer}"
    assert tool[1] == "Your answer is correct."


def test_labels_cover_decision_tokens_only(demos):
    from molrl.tiny import build_tiny_tokenizer
    from molrl.traces.tokenize import TokenizeConfig, tokenize_trace

    _, traces = demos
    tok = build_tiny_tokenizer("chatml")
    example = tokenize_trace(traces[0], tok, TokenizeConfig(enable_thinking=True))
    _, labels = collate([example], tok.pad_token_id)
    trained = tok.decode([t for t in labels[0].tolist() if t != -100])
    # the code, the end of turn, the copied answer and its end of turn; never the tool output line
    assert trained.startswith("<execute>print(") and "Output:" not in trained and "correct" not in trained
    assert trained.count("<|im_end|>") == 2


def test_base_saves_and_loads_with_its_chat_template(tmp_path, demos):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from molrl.chat import render

    world, traces = demos
    cfg = BaseModelConfig(hidden_size=32, num_layers=1, steps=3, batch_size=4)
    out = train_base([*traces, *direct_traces(world.general_train)], cfg, tmp_path / "base")
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
    from molrl.demo.base import hide_value
    from molrl.tiny import build_tiny_tokenizer
    from molrl.traces.tokenize import TokenizeConfig, tokenize_trace

    world = build_world(WORLD)
    task = world.rule_train[0]
    (trace,) = direct_traces([task], kind="domain", hide_value=True)
    tok = build_tiny_tokenizer("chatml")
    example = hide_value(tokenize_trace(trace, tok, TokenizeConfig(require_feedback=False)), trace, tok)
    _, labels = collate([example], tok.pad_token_id)
    trained = tok.decode([t if t != -100 else tok.convert_tokens_to_ids("?") for t in labels[0].tolist()])
    # the value after "= " is never a target; the statement and the boxed copy of it are
    n = task.meta["input"]
    assert f"Output:\nf({n}) = {'?' * len(task.answer)}\n\\boxed{{{task.answer}}}<|im_end|>" in trained
