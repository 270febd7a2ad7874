"""Active partial rollouts (APRIL): the rule's pure functions in closed form, and runs that account for
every completion they start, also across a kill -9 and a resume."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from grpo_helpers import kill_when, save_tiny_model, toy_config
from molrl.rl.rollouts.partial_state import (PartialCompletion, PartialGroup, RolloutState, StopWhenGroupsDone, accounting,
                              choose_trained, groups_to_start, importance_weights, off_policy_mask)

TESTS = Path(__file__).parent


def test_importance_weights_and_the_off_policy_mask_on_a_hand_built_batch():
    # row 0: two tokens from step 3 (resumed), one from step 5 (this step); row 1: all from step 5, one pad
    steps = torch.tensor([[3, 3, 5], [5, 5, 5]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    off = off_policy_mask(steps, 5, mask)
    assert off.tolist() == [[True, True, False], [False, False, False]]
    policy = torch.tensor([[math.log(0.5), math.log(0.9), math.log(0.3)], [math.log(0.2)] * 3])
    behaviour = torch.tensor([[math.log(0.25), math.log(0.3), math.log(0.6)], [math.log(0.4)] * 3])
    weights = importance_weights(policy, behaviour, off, cap=2.5)
    # 0.5 / 0.25 = 2 (under the cap); 0.9 / 0.3 = 3 -> truncated at 2.5; on-policy tokens weigh 1 whatever
    # their log-probs say (they are the step's own samples)
    assert weights == pytest.approx(torch.tensor([[2.0, 2.5, 1.0], [1.0, 1.0, 1.0]]))


def test_the_masked_treatment_leaves_only_this_steps_tokens_in_the_loss():
    steps = torch.tensor([[1, 2, 2, 0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    off = off_policy_mask(steps, 2, mask)
    assert (mask * (~off).int()).tolist() == [[0, 1, 1, 0]]


def test_groups_in_flight_are_the_over_provisioned_count_including_the_resumed_ones():
    assert groups_to_start(0, 4, 2.0) == 8
    assert groups_to_start(3, 4, 2.0) == 5
    assert groups_to_start(0, 3, 1.5) == 5  # ceil(4.5)
    assert groups_to_start(0, 4, 1.0) == 4  # no over-provisioning: the synchronous step
    assert groups_to_start(9, 4, 2.0) == 0
    assert choose_trained([2, 0, 5], 2) == [2, 0]
    with pytest.raises(ValueError, match="only 1 groups finished"):
        choose_trained([1], 2)


def test_the_stop_rule_stops_rows_at_eos_or_budget_and_the_batch_once_enough_groups_are_done():
    eos = 9
    # 4 rows: group 0 = rows 0, 1; group 1 = rows 2, 3; group 2 had both rows finish in an earlier step
    stop = StopWhenGroupsDone(groups=[0, 0, 1, 1], budgets=[5, 5, 2, 5], eos_ids=[eos], prompt_length=3,
                              sizes=[2, 2, 2], finished_before=[0, 0, 2], needed=3, already_done=[2])
    seq = torch.zeros(4, 3, dtype=torch.long)
    seq = torch.cat([seq, torch.tensor([[1], [eos], [1], [1]])], 1)  # 1 token each: row 1 ends (EOS)
    assert stop(seq).tolist() == [False, True, False, False]
    seq = torch.cat([seq, torch.tensor([[eos], [0], [1], [1]])], 1)  # 2 tokens: row 0 EOS, row 2 at its budget
    assert stop(seq).tolist() == [True, True, True, False]  # group 0 done: 2 of 3 groups
    assert stop.finish_order == [2, 0]
    seq = torch.cat([seq, torch.tensor([[0], [0], [0], [eos]])], 1)  # row 3 ends: group 1 done, 3 groups -> stop all
    assert stop(seq).tolist() == [True, True, True, True]
    assert stop.finish_order == [2, 0, 1] and stop.lengths == [2, 1, 2, 3]


def test_accounting_finds_duplicates_and_lost_completions():
    ok = accounting(2, 2, ["0/0", "0/1"], ["1/0", "1/1"])
    assert ok["duplicates"] == ok["lost"] == ok["unknown"] == []
    bad = accounting(2, 2, ["0/0", "0/0", "7/0"], ["1/0"])
    assert bad["duplicates"] == ["0/0"] and bad["lost"] == ["0/1", "1/1"] and bad["unknown"] == ["7/0"]


def test_the_buffer_round_trips_through_its_checkpoint_form():
    state = RolloutState(buffer=[PartialGroup(3, {"prompt": "p", "task_json": "{}"}, [1, 2],
                                              [PartialCompletion("3/0", [4, 5], [-0.5, -1.0], [2, 2], False),
                                               PartialCompletion("3/1", [6], [-0.1], [2], True)], 2)],
                         pending=[{"prompt": "q", "task_json": "{}"}], started_groups=4, extra_draws=1)
    again = RolloutState.from_json(json.loads(json.dumps(state.to_json())))
    assert again == state and not again.buffer[0].done


def partial_config(out: Path, base: Path, **overrides):
    settings = dict(algorithm="grpo", max_steps=6, prompts_per_step=2, max_new_tokens=96)
    settings.update(overrides)
    cfg = toy_config(out, base, **settings)
    cfg.rollout.partial = True
    return cfg


def check_accounting(out: Path, group: int = 8) -> dict:
    state = json.loads((out / "rollout_buffer.json").read_text())
    lines = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    result = accounting(state["started_groups"], group, [x["id"] for x in lines],
                        [c["id"] for g in state["buffer"] for c in g["completions"]])
    assert result["duplicates"] == [] and result["lost"] == [] and result["unknown"] == [], result
    assert result["started"] == result["trained"] + result["buffered"]
    return {"result": result, "lines": lines, "state": state}


@pytest.fixture(scope="module")
def long_tail_base(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("partial") / "base", eos_logit=2.0)


@pytest.mark.parametrize("treatment", ["importance", "mask"])
def test_a_run_trains_every_started_completion_once_or_keeps_it_buffered(tmp_path, long_tail_base, treatment):
    from molrl.rl import run_rl

    cfg = partial_config(tmp_path / "run", long_tail_base, save_steps=3)
    cfg.rollout.off_policy = treatment
    out = run_rl(cfg)
    checked = check_accounting(out)
    lines = checked["lines"]
    assert len(lines) == 6 * 2 * 8  # every step trained its 2 groups
    assert sum(x["off_policy_tokens"] for x in lines) > 0  # some completions were resumed across steps
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all("partial/off_policy_token_fraction" in m and "partial/buffer_groups" in m for m in metrics if "reward" in m)
    saved = json.loads((out / "checkpoints" / "checkpoint-3" / "rollout_state.json").read_text())
    assert saved["started_groups"] > 0 and "buffer" in saved


KILLED_RUN = """
import sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from test_rl_partial import partial_config
from molrl.rl import run_rl
run_rl(partial_config(Path({out!r}), Path({base!r}), max_steps=12, save_steps=1))
"""


def test_kill_9_mid_run_then_resume_loses_nothing_and_trains_nothing_twice(tmp_path, long_tail_base):
    from molrl.rl import run_rl

    out = tmp_path / "run"
    script = KILLED_RUN.format(tests=str(TESTS), out=str(out), base=str(long_tail_base))
    kill_when(script, out / "checkpoints" / "checkpoint-3" / "rollout_state.json")
    assert not (out / "adapter").exists()  # killed before the end
    checkpoints = sorted(int(p.name.split("-")[1]) for p in (out / "checkpoints").glob("checkpoint-*"))
    last = checkpoints[-1]
    saved = json.loads((out / "checkpoints" / f"checkpoint-{last}" / "rollout_state.json").read_text())
    assert saved["buffer"], "the checkpoint holds unfinished groups"  # so a resume that dropped them would lose some
    run_rl(partial_config(out, long_tail_base, max_steps=12, save_steps=1))
    checked = check_accounting(out)
    steps = [x["step"] for x in checked["lines"]]
    assert sorted(set(steps)) == list(range(1, 13)) and all(steps.count(s) == 16 for s in range(1, 13))


def test_a_checkpoint_torn_by_a_kill_is_passed_over(tmp_path):
    from molrl.records.runfiles import last_whole_checkpoint

    assert last_whole_checkpoint(tmp_path / "none") is None
    for step, state in ((2, '{"global_step": 2}'), (4, '{"global_step": 4}'), (6, '{"global_st')):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(state)
    (tmp_path / "checkpoint-8").mkdir()  # killed before its trainer state was written
    assert last_whole_checkpoint(tmp_path) == str(tmp_path / "checkpoint-4")


def test_partial_rollouts_refuse_settings_they_cannot_honour(tmp_path):
    from molrl.rl.config import RlConfig, RolloutSettings

    with pytest.raises(ValueError, match="over_provision=0.5"):
        RlConfig(rollout=RolloutSettings(partial=True, over_provision=0.5))
    with pytest.raises(ValueError, match="cannot be combined"):
        RlConfig(rollout=RolloutSettings(partial=True, behaviour="props"), algorithm="grpo")


class FakeOutput:
    def __init__(self, request_id, token_ids, finished):
        self.request_id, self.finished = request_id, finished
        self.outputs = [type("Completion", (), {"token_ids": token_ids})()]


class FakeEngine:
    """vLLM's LLMEngine surface that partial rollouts use: request i emits token i+1 per step and
    finishes after its own length (or its max_tokens), outputs cumulative."""

    def __init__(self, lengths):
        self.lengths, self.requests, self.aborted, self.steps = lengths, {}, [], 0

    def add_request(self, name, prompt, params, lora_request=None):
        i = len(self.requests)
        self.requests[name] = {"i": i, "tokens": [], "limit": min(self.lengths[i], params["max_tokens"]), "done": False}

    def has_unfinished_requests(self):
        return any(not r["done"] for r in self.requests.values())

    def step(self):
        self.steps += 1
        outs = []
        for name, r in self.requests.items():
            if r["done"]:
                continue
            r["tokens"].append(r["i"] + 1)
            r["done"] = len(r["tokens"]) >= r["limit"]
            outs.append(FakeOutput(name, list(r["tokens"]), r["done"]))
        return outs

    def abort_request(self, names):
        self.aborted += names
        for name in names:
            self.requests[name]["done"] = True


def test_the_engine_backend_aborts_unfinished_requests_once_enough_groups_are_done():
    from molrl.engines.policy import engine_generate
    from molrl.rl.rollouts.partial_state import GroupTracker

    # groups of 2 rows: g0 rows finish after 2 and 3 tokens, g1 after 9 and 1, g2 after 4 and 4 (budget 3 on row 4)
    engine = FakeEngine([2, 3, 9, 1, 4, 4])
    tracker = GroupTracker([0, 0, 1, 1, 2, 2], [2, 2, 2], [0, 0, 0], needed=2)
    params = [{"max_tokens": m} for m in (10, 10, 10, 10, 3, 10)]
    tokens = engine_generate(engine, [[7]] * 6, params, tracker, "t")
    # step 3: g0 done; step 4: g2 done (row 4 at its budget of 3, row 5 at 4) -> 2 groups, g1's row 2 aborted
    assert tracker.finish_order == [0, 2] and engine.steps == 4
    assert engine.aborted == ["t-2"]
    assert tokens == [[1, 1], [2, 2, 2], [3, 3, 3, 3], [4], [5, 5, 5], [6, 6, 6, 6]]
    assert tracker.done == [True, True, False, True, True, True]


def test_a_step_filled_by_groups_that_finished_earlier_generates_nothing_and_starts_nothing(tmp_path):
    # without an EOS bias every completion runs to its 8-token budget: all groups in flight finish at the same
    # decoding step, so step 1 leaves 2 finished groups in the buffer and step 2 trains on them alone
    from molrl.rl import run_rl

    out = run_rl(partial_config(tmp_path / "run", save_tiny_model(tmp_path / "base"), max_steps=3,
                                max_new_tokens=8))
    checked = check_accounting(out)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "reward" in line]
    assert [m["partial/generated_tokens"] for m in metrics] == [4 * 8 * 8, 0.0, 4 * 8 * 8]
    assert [m["partial/off_policy_token_fraction"] for m in metrics] == [0.0, 1.0, 0.0]
    assert checked["result"]["started"] == 8 * 8
