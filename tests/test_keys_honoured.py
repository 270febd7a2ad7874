"""Shown means honoured: every key a stage's ``--describe`` shows changes what the stage does or is refused by its
range, and a combination that leaves a key doing nothing is named in one line."""

from __future__ import annotations

import logging
from collections import defaultdict
from types import SimpleNamespace

import pytest

from molrl.rl.config import RlConfig, rl_sampling, rl_train
from molrl.rl.rollouts.turns import Turns
from molrl.sandbox import SandboxConfig, SandboxPool
from molrl.task_types import Task


# a combination that makes a key do nothing, named at run time
class NoActionTurns(Turns):
    """The multi-turn policy with a scripted sampler: every turn is ``turn_tokens`` tokens of prose, cut at its
    budget without an action, and no model scores the batch."""

    def generate(self, sequences, budgets):
        prose = self.trainer.processing_class("Let me think about it. " * 20, add_special_tokens=False)["input_ids"]
        return [prose[:b] for b in budgets], [True] * len(sequences), [None] * len(sequences)

    def to_batch(self, inputs, *rest, **kwargs):
        return SimpleNamespace(records=None)


def one_turn_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "ran out of its sampling.max_new_tokens" in r.getMessage()]


@pytest.mark.parametrize("max_new_tokens,named", [(128, True), (1000, False)])
def test_a_multi_turn_run_with_no_room_for_a_second_turn_is_named_once(max_new_tokens, named, caplog):
    """rollout.turns=2, turn_tokens=64, max_new_tokens=128: the first turn's format feedback does not fit, so every
    episode ends after one turn; with 1000 tokens the second turn is taken and nothing is said."""
    from molrl.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer("chatml")
    cfg = RlConfig(sampling=rl_sampling(n=2, max_new_tokens=max_new_tokens), train=rl_train(micro_batch_size=2))
    cfg.rollout.turns, cfg.rollout.turn_tokens = 2, 64
    metrics = defaultdict(list)
    task = Task(id="t", prompt="What is 2 + 2?", kind="math", answer="4")
    inputs = [{"prompt": "", "task_json": task.to_json()}] * 2
    caplog.set_level(logging.WARNING)
    with SandboxPool(SandboxConfig(workers=1, timeout_s=10)) as pool:
        trainer = SimpleNamespace(processing_class=tok, eos_token_ids=[tok.convert_tokens_to_ids("<|im_end|>")],
                                  scorer=SimpleNamespace(pool=pool), metrics=lambda: metrics,
                                  state=SimpleNamespace(num_input_tokens_seen=0), engine=None)
        policy = NoActionTurns(trainer, cfg)
        for _ in range(2):  # two steps, one line
            policy.rollout(inputs)
    assert metrics["turns/mean"] == ([1.0, 1.0] if named else [2.0, 2.0])
    lines = one_turn_lines(caplog)
    assert len(lines) == (1 if named else 0)
    if named:
        assert lines[0].startswith("rollout.turns=2, but every episode of this step ran out of its "
                                   "sampling.max_new_tokens=128 after one turn (a turn takes up to "
                                   "rollout.turn_tokens=64 tokens, and the feedback and next turn's header after it "
                                   "need up to ")
        assert lines[0].endswith("raise sampling.max_new_tokens or lower rollout.turn_tokens")
