"""The library probe: its candidates are the world's truth first and every other behaviour after, each as the
sandbox and the grader see it; its likelihoods are the model's own; its share is a softmax."""

from __future__ import annotations

import math

import pytest
import torch

from molrl.demo.library import FAMILIES, QUIRKS, LibraryConfig, build_library_world
from molrl.demo.library_measure import (answer_candidates, behaviour_share, shares, feedback_candidates, probe_library,
                                        sequence_logp)
from molrl.sandbox import SandboxConfig, SandboxPool

SMALL = LibraryConfig(train_twists=2, heldout_twists=2, general_train=4, general_eval=4)
FORMAT = dict(max_turns=3, max_solutions=1, max_total_tokens=2048, feedback=["execution", "verdict"],
              system_prompt="Run code in <execute></execute>. Submit the function in <solution></solution>.",
              thinking=True)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(workers=2, cache_size=0)) as p:
        yield p


@pytest.fixture(scope="module")
def tokenizer():
    from molrl.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer("chatml")


def test_shares_weigh_whole_probability_and_per_token_likelihood():
    # a one-token difference diluted over a long answer: the sequence share sees it, the per-token share barely
    sure = [(math.log(0.9), 40), (math.log(0.05), 40), (math.log(0.05), 40)]
    whole, per_tok = shares(sure)
    assert whole == pytest.approx(0.9)
    assert per_tok == pytest.approx(1 / (1 + 2 * math.exp(math.log(0.05 / 0.9) / 40)))
    assert per_tok < 0.36
    # candidates of different lengths: per token, a long sure continuation outweighs a short likelier one
    assert shares([(-2.0, 20), (-1.0, 1)]) == pytest.approx((1 / (1 + math.e), 1 / (1 + math.exp(-0.9))))


def test_behaviour_share_is_a_softmax_over_the_candidates():
    assert behaviour_share([0.0], 0) == 1.0
    assert behaviour_share([math.log(1), math.log(3)], 1) == pytest.approx(0.75)
    assert behaviour_share([-1000.0, -1001.0], 0) == pytest.approx(1 / (1 + math.exp(-1)))  # no underflow


@pytest.mark.parametrize("seed", range(3))
def test_answer_candidates_put_the_worlds_answer_first_and_only_it_passes(seed, pool):
    from molrl.graders.code import grade_code
    import dataclasses

    world = build_library_world(dataclasses.replace(SMALL, seed=seed))
    for family, groups in answer_candidates(world).items():
        for group in groups:
            assert len(group) == len(QUIRKS[family])
            task = next(t for t in world.train if t.meta["family"] == family)
            answers = [t.messages[-1]["content"] for t in group]
            assert len(set(answers)) == len(answers)
            assert "Write a Python function `solve`" in group[0].messages[0]["content"]
    # the first candidate is the reference the world's behaviour calls for: it passes, the others fail
    from molrl.demo.library import library_task
    import random

    for family, groups in answer_candidates(world).items():
        task = library_task(world, (family,), 12, world.items, 4, random.Random(1), "probe")
        answers = [t.messages[-1]["content"] for t in groups[0]]
        stages = [g.stage for g in grade_code(answers, [task] * len(answers), pool)]
        assert stages[0] == "all_pass" and "all_pass" not in stages[1:], (family, stages)


def test_feedback_candidates_show_the_true_output_first_and_every_other_behaviours(pool, tokenizer):
    from molrl.demo.collection import CollectionFormat

    world = build_library_world(SMALL)
    found = feedback_candidates(world, tokenizer, CollectionFormat(**FORMAT), pool)
    for family in FAMILIES:
        outputs = [t.messages[-1]["content"] for t in found[family]]
        assert len(outputs) == len(QUIRKS[family]) and len(set(outputs)) == len(outputs)
        assert all(t.messages[-1]["role"] == "tool" and f"# probe {family}" in t.messages[-2]["content"]
                   for t in found[family])
    true_price = found["price"][0].messages[-1]["content"]
    assert f"price {world.items[0]} {world.prices[world.items[0]]}" in true_price


def test_in_context_candidates_submit_each_behaviours_solution_after_the_true_output(pool, tokenizer):
    from molrl.demo.collection import CollectionFormat
    from molrl.demo.library_measure import in_context_candidates

    world = build_library_world(SMALL)
    found = feedback_candidates(world, tokenizer, CollectionFormat(**FORMAT), pool)
    for family, group in in_context_candidates(world, found).items():
        assert len(group) == len(QUIRKS[family])
        assert all(t.messages[:-1] == found[family][0].messages for t in group)  # the true output, then a solution
        solutions = [t.messages[-1]["content"] for t in group]
        assert all(s.startswith("<solution>") for s in solutions) and len(set(solutions)) == len(solutions)
        task = next(t for t in world.train if t.meta["family"] == family)
        assert solutions[0] == f"<solution>\n{task.reference}</solution>"
        assert task.prompt in group[0].messages[1]["content"]  # the solution answers the task the conversation poses


def test_sequence_logp_is_the_models_log_likelihood_of_the_last_message(tokenizer):
    from molrl.chat import render
    from molrl.tiny import build_tiny_model
    from molrl.traces.schema import Trace

    model = build_tiny_model(len(tokenizer), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=0)
    trace = Trace(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ab"}])
    got = sequence_logp(model, tokenizer, trace, target="decision")
    text = render(tokenizer, trace.messages, enable_thinking=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    start = text.index("ab")
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    positions = [i for i, (a, b) in enumerate(enc["offset_mapping"]) if start <= a < start + 2]
    positions.append(positions[-1] + 1)  # the turn's end token, which the decision mask holds too
    assert tokenizer.decode([ids[positions[-1]]]) == "<|im_end|>"
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    manual = sum(float(logp[i - 1, ids[i]]) for i in positions)
    assert got[0] == pytest.approx(manual, abs=1e-4) and got[1] == len(positions)


def test_probe_library_gives_a_share_per_function_and_their_mean(pool, tokenizer):
    from molrl.demo.collection import CollectionFormat
    from molrl.tiny import build_tiny_model

    world = build_library_world(SMALL)
    model = build_tiny_model(len(tokenizer), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=0)
    found = probe_library(model, tokenizer, world, CollectionFormat(**FORMAT), pool)
    assert sorted(found) == sorted([*FAMILIES, "mean"])
    for family in FAMILIES:
        row = found[family]
        assert 0 < row["feedback"] < 1 and 0 < row["answer"] < 1 and row["guess"] == 1 / len(QUIRKS[family])
        assert 0 < row["answer_in_context"] < 1
        assert sorted(row["per_token"]) == ["answer", "answer_in_context", "feedback"]
        assert all(0 < v < 1 for v in row["per_token"].values())
    assert found["mean"]["per_token"]["feedback"] == pytest.approx(
        sum(found[f]["per_token"]["feedback"] for f in FAMILIES) / 4)
    assert found["mean"]["guess"] == pytest.approx(sum(1 / len(QUIRKS[f]) for f in FAMILIES) / 4)
