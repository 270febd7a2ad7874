"""The multi-turn RL tail seam: what is appended after a sampled turn never repeats what the turn holds.

Before, a turn ending in whitespace before its end-of-turn got the whitespace and the end-of-turn again
(``Let me think. \\n<|im_end|> \\n<|im_end|>\\n<|im_start|>user...``): the rendered tail started at the end
of the turn's stripped content, so it held the trailing whitespace the template keeps, and the check for the
policy's own EOS compared it with that whitespace. ``molrl.traces.spans.tokenize_tail`` now starts after the
whitespace and drops an end-of-turn token the policy sampled itself. Enumerated over three templates (tiny
ChatML, tiny Llama 3, the real Qwen3), turn endings and with or without the policy's own EOS.
"""

from __future__ import annotations

import pytest

from molrl.chat import render
from molrl.traces.spans import tokenize_tail

ENDINGS = ["", " ", "\n", " \n", "\n\n", "\t \n", "  "]
STEM = "Let me think."


@pytest.fixture(scope="module", params=["chatml", "llama3", "qwen3"])
def tokenizer(request):
    if request.param == "qwen3":
        return request.getfixturevalue("qwen3_tokenizer")
    from molrl.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer(request.param)


def end_of_turn(tok) -> int:
    """The template's end-of-turn id (what closes an assistant turn)."""
    return tok.convert_tokens_to_ids("<|eot_id|>" if "<|eot_id|>" in tok.get_vocab() else "<|im_end|>")


def conversation(ending: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": "What is f(3)?"}, {"role": "assistant", "content": STEM + ending},
            {"role": "user", "content": "Your answer is not in the expected format."}]


@pytest.mark.parametrize("ending", ENDINGS)
@pytest.mark.parametrize("own_eos", [True, False])
@pytest.mark.parametrize("thinking", [True, False])
def test_finding_13_the_tail_holds_one_end_of_turn_and_the_turns_own_whitespace_once(tokenizer, ending, own_eos,
                                                                                       thinking):
    tok, eot = tokenizer, end_of_turn(tokenizer)
    messages = conversation(ending)
    sampled = tok(STEM + ending, add_special_tokens=False)["input_ids"] + ([eot] if own_eos else [])
    tail = tokenize_tail(tok, messages, 1, enable_thinking=thinking, add_generation_prompt=True,
                         sampled_end=sampled[-1])
    row = sampled + tail.input_ids
    # the whole rendering, from the turn's text on: what the row must read as, the turn's own whitespace kept once
    whole = render(tok, messages, add_generation_prompt=True, enable_thinking=thinking)
    after = whole[whole.index(STEM) + len(STEM):].lstrip(" \t\n")
    assert tok.decode(row) == STEM + ending + after
    assert row.count(eot) == whole[whole.index(STEM):].count(tok.convert_ids_to_tokens(eot))
    assert tail.roles[0] == ("template" if own_eos else "decision")  # the end-of-turn closes the model's turn
    assert tail.text == tok.decode(tail.input_ids)


def test_finding_13_the_issue_example_under_qwen3(qwen3_tokenizer):
    tok = qwen3_tokenizer
    sampled = tok("Let me think. \n", add_special_tokens=False)["input_ids"] + [end_of_turn(tok)]
    tail = tokenize_tail(tok, conversation(" \n"), 1, add_generation_prompt=True, sampled_end=sampled[-1])
    assert tok.decode(sampled + tail.input_ids).startswith("Let me think. \n<|im_end|>\n<|im_start|>user\n")


def test_finding_13_another_eos_the_policy_ended_with_keeps_the_templates_end_of_turn(qwen3_tokenizer):
    # Qwen3 also stops at <|endoftext|>; the chat format still needs its <|im_end|>, which is no repeat of it
    tok = qwen3_tokenizer
    sampled = tok("Let me think.", add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|endoftext|>")]
    tail = tokenize_tail(tok, conversation(""), 1, add_generation_prompt=True, sampled_end=sampled[-1])
    assert tail.input_ids[0] == end_of_turn(tok)


def test_finding_13_a_multi_turn_row_repeats_no_end_of_turn(qwen3_tokenizer):
    # through the rollout policy: a turn with no action, ending " \n" and its own EOS, gets the format feedback
    from test_rl_turns import ScriptedTurns, scripted_trainer

    from molrl.rl.config import RlConfig, rl_sampling, rl_train
    from molrl.sandbox import SandboxConfig, SandboxPool
    from molrl.tasks import Task

    tok = qwen3_tokenizer
    eot = end_of_turn(tok)
    turn1 = tok("Let me think. \n", add_special_tokens=False)["input_ids"] + [eot]
    turn2 = tok("\\boxed{5}", add_special_tokens=False)["input_ids"] + [eot]
    cfg = RlConfig(sampling=rl_sampling(n=2, max_new_tokens=400), train=rl_train(micro_batch_size=2))
    cfg.episode.max_turns = 2
    with SandboxPool(SandboxConfig(workers=1, timeout_s=10)) as pool:
        policy = ScriptedTurns(scripted_trainer(tok, pool), cfg, [turn1, turn2])
        row = policy.start_row(Task(id="t", prompt="What is f(3)?", kind="math", answer="5"), 0)
        opening = len(row.episode.messages)
        while not row.episode.done:
            policy.round([row])
    text = tok.decode(row.ids)
    assert text.startswith("Let me think. \n<|im_end|>\n<|im_start|>user\n")
    assert "<|im_end|> \n<|im_end|>" not in text and "<|im_end|><|im_end|>" not in text
    assert row.ids.count(eot) == len(row.episode.messages) - opening  # one end-of-turn per message after the prompt
