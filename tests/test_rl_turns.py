"""Multi-turn RL rollouts: exact tokens across turns, token roles, the loss terms, kill and resume."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from grpo_helpers import kill_when, save_tiny_model, toy_config
from molrl.chat import render
from molrl.demo.run import task_record
from molrl.demo.world import WorldConfig, build_world, rule_setup_code
from molrl.rl.config import RlConfig, TaskSource, rl_sampling, rl_train
from molrl.rl.rollouts.turns import Turns, TurnStop, final_answer
from molrl.rl.score import score
from molrl.rl.terms import decision_kl, feedback_cross_entropy
from molrl.sandbox import SandboxConfig, SandboxPool
from molrl.tasks import Task
from molrl.traces.schema import Trace
from molrl.traces.spans import tokenize_tail
from molrl.traces.tokenize import TokenizeConfig, tokenize_trace

TESTS = Path(__file__).parent
KEY = "3456789012"  # f(n) = KEY[last digit of n]: f(622) = 5


# the loss terms, in closed form
def test_feedback_ce_is_the_mean_negative_log_prob_over_feedback_tokens_only():
    logps = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -9.0, -9.0]])
    feedback = torch.tensor([[0, 1, 1], [1, 0, 0]])
    # (2 + 3 + 4) / 3 feedback tokens; the -1 and -9s are not feedback
    assert feedback_cross_entropy(logps, feedback).item() == pytest.approx(3.0)
    assert feedback_cross_entropy(logps, torch.zeros_like(feedback)).item() == 0.0


def test_decision_kl_is_the_full_vocabulary_kl_over_decision_tokens_only():
    policy = torch.zeros(1, 2, 2)  # p = (1/2, 1/2) at both positions
    base = torch.tensor([[[0.0, math.log(3.0)], [5.0, -5.0]]])  # q = (1/4, 3/4) at position 0
    # KL(p || q) = 1/2 ln(1/2 / 1/4) + 1/2 ln(1/2 / 3/4) = 1/2 ln(4/3); position 1 is not a decision
    assert decision_kl(policy, base, torch.tensor([[1, 0]])).item() == pytest.approx(0.5 * math.log(4 / 3), rel=1e-5)
    assert decision_kl(policy, policy.clone(), torch.tensor([[1, 1]])).item() == pytest.approx(0.0, abs=1e-7)


# a turn's end
def test_a_turn_stops_at_eos_at_a_complete_stop_string_or_at_its_budget():
    from molrl.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer("chatml")
    rows = ["ab" + "<|im_end|>" + "xyz", "<execute>1</execute>zz", "abcdefgh"]
    ids = [tok(r, add_special_tokens=False)["input_ids"] for r in rows]
    stop = TurnStop(tok, ["</execute>"], [tok.eos_token_id], start=1, budgets=[50, 50, 5])
    width = max(len(r) for r in ids)
    for n in range(1, width + 1):  # feed the rows one token at a time after a 1-token "prompt"
        batch = torch.tensor([[0] + (r + [0] * width)[:n] for r in ids])
        stop(batch, None)
    assert stop.lengths == [3, len(tok("<execute>1</execute>")["input_ids"]), 5]
    assert stop.at_limit == [False, False, True]


# exact tokens across turns, with the real Qwen3 tokenizer
class ScriptedTurns(Turns):
    """The multi-turn policy with a scripted sampler in place of the model: each turn's ids as given."""

    def __init__(self, trainer, cfg, script):
        super().__init__(trainer, cfg)
        self.script = list(script)

    def generate(self, sequences, budgets):
        self.seen = getattr(self, "seen", []) + [list(sequences[0])]
        return [list(self.script.pop(0)) for _ in sequences], [False] * len(sequences), [None] * len(sequences)


def scripted_trainer(tokenizer, pool):
    """What the multi-turn policy reads of a trainer; the run's settings come from the policy's own config."""
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    metrics = defaultdict(list)
    return SimpleNamespace(processing_class=tokenizer, eos_token_ids=[im_end], scorer=SimpleNamespace(pool=pool), metrics=lambda: metrics,
                           state=SimpleNamespace(num_input_tokens_seen=0), engine=None)


def test_trained_ids_are_the_sampled_ids_plus_the_rendered_feedback_ids_under_qwen3(qwen3_tokenizer):
    tok = qwen3_tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    task = Task(id="rule/622", prompt="What is f(622)?", kind="math", answer=KEY[2], preamble=rule_setup_code(KEY))
    run = "<execute>print(f(622))</execute>"
    turn1 = [tok.convert_tokens_to_ids(t) for c in run for t in tok.tokenize(c)]  # one token per character
    assert len(turn1) != len(tok(run, add_special_tokens=False)["input_ids"])  # so a re-tokenisation would differ
    turn2 = tok(f"\\boxed{{{KEY[2]}}}", add_special_tokens=False)["input_ids"] + [im_end]  # it ends its turn itself
    cfg = RlConfig(sampling=rl_sampling(n=2, max_new_tokens=400), train=rl_train(micro_batch_size=2))
    cfg.episode.max_turns = 2
    with SandboxPool(SandboxConfig(workers=1, timeout_s=10)) as pool:
        policy = ScriptedTurns(scripted_trainer(tok, pool), cfg, [turn1, turn2])
        row = policy.start_row(task, 0)
        while not row.episode.done:
            policy.round([row])
    episode = row.episode
    assert [m["role"] for m in episode.messages] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert episode.stop_reason == "solved"
    feedback1, feedback2 = episode.messages[3]["content"], episode.messages[5]["content"]
    assert feedback1.startswith(f"Output:\n{KEY[2]}")  # the sandbox ran f with the hidden rule
    # Qwen3's template, written out: what closes turn 1, the tool message, the next header with its think prefill
    tail1 = (f"<|im_end|>\n<|im_start|>user\n<tool_response>\n{feedback1}\n</tool_response><|im_end|>\n"
             "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    tail2 = f"\n<|im_start|>user\n<tool_response>\n{feedback2}\n</tool_response><|im_end|>\n"  # after the sampled EOS
    ids1, ids2 = (tok(t, add_special_tokens=False)["input_ids"] for t in (tail1, tail2))
    assert row.ids == turn1 + ids1 + turn2 + ids2
    assert row.sampled == [1] * len(turn1) + [0] * len(ids1) + [1] * len(turn2) + [0] * len(ids2)
    assert policy.seen[1] == row.prompt_ids + turn1 + ids1  # turn 2 was sampled from exactly those ids
    # feedback tokens: exactly each tool message's text, and the ones the trace labeller gives the whole trace
    cut = len(turn1) + len(ids1)  # where turn 2 starts
    ours = [[i for i, f in zip(row.ids[:cut], row.feedback[:cut]) if f],
            [i for i, f in zip(row.ids[cut:], row.feedback[cut:]) if f]]
    assert [tok.decode(x).strip() for x in ours] == [feedback1, feedback2]  # a token may carry the newline after
    whole = tokenize_trace(Trace(messages=episode.messages), tok, TokenizeConfig(enable_thinking=False, max_length=None))
    labelled = [[i for i, m, f in zip(whole.input_ids, whole.token_message, whole.feedback_mask) if f and m == k]
                for k in (3, 5)]
    assert ours == labelled
    # the template rewrites turn 1 when it renders the whole episode (its empty think block is dropped), which is
    # why the trained row is assembled from tokens and never from a rendering of the messages
    assert "<|im_start|>assistant\n<execute>" in render(tok, episode.messages, enable_thinking=False)
    assert "<|im_start|>assistant\n<think>\n\n</think>\n\n<execute>" in tok.decode(row.prompt_ids + row.ids)
    # the reward reads the final answer
    assert final_answer(episode) == f"\\boxed{{{KEY[2]}}}"
    assert score([task], [final_answer(episode)]).rewards == [1.0]


def test_the_tail_after_a_turn_is_labelled_like_the_whole_trace(qwen3_tokenizer):
    tok = qwen3_tokenizer
    messages = [{"role": "user", "content": "What is f(3)?"},
                {"role": "assistant", "content": "<think>\nrun it\n</think>\n\n<execute>print(f(3))</execute>"},
                {"role": "tool", "content": "Output:\n7"}]
    tail = tokenize_tail(tok, messages, 1, enable_thinking=True)
    roles = dict(zip(tail.roles, tail.input_ids))
    assert tok.decode([i for i, r in zip(tail.input_ids, tail.roles) if r == "feedback"]) == "Output:\n7"
    assert tail.roles[0] == "decision" and tail.input_ids[0] == tok.convert_tokens_to_ids("<|im_end|>")
    assert "prompt" not in roles
    with pytest.raises(Exception, match="message 2"):
        tokenize_tail(tok, messages, 2)


# the policy in a real trainer (tiny model, demo-world tasks)
@pytest.fixture(scope="module")
def world_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("turns")
    world = build_world(WorldConfig(train_problems=16, heldout_problems=4, general_train=8, general_eval=4))
    (root / "tasks.jsonl").write_text("\n".join(json.dumps(task_record(t)) for t in world.rule_train) + "\n")
    return root / "tasks.jsonl", save_tiny_model(root / "base", eos_logit=2.0)


def turns_config(out: Path, tasks: Path, base: Path, **overrides) -> RlConfig:
    cfg = toy_config(out, base, data=TaskSource(path=tasks, format="jsonl"), max_new_tokens=128,
                     n=4, micro_batch_size=4, **overrides)
    cfg.data.spec.kind = "math"
    cfg.episode.max_turns = 2
    cfg.episode.system_prompt = "Run code in <execute></execute>. Answer in \\boxed{}."
    cfg.episode.feedback = ["execution", "verdict"]  # without an action: "[no feedback]"
    cfg.episode.turn_tokens = 8  # (the tiny tokenizer has a token per character)
    return cfg


def four_rollouts(tmp_path: Path, world_files) -> tuple:
    """A trainer of the multi-turn config and one rollout of its first prompt, four times (seed 0)."""
    from molrl.rl.run import build_trainer

    torch.manual_seed(0)
    trainer, _, pool = build_trainer(turns_config(tmp_path / "run", *world_files))
    try:
        row = trainer.train_dataset[0]
        batch = trainer.rollouts["train"].rollout([{"prompt": row["prompt"], "task_json": row["task_json"]}] * 4)
    finally:
        pool.close()
    return trainer, batch


def test_a_rollout_batch_trains_sampled_tokens_and_attends_to_all(tmp_path, world_files):
    trainer, batch = four_rollouts(tmp_path, world_files)
    sampled, feedback, attention = batch.completion_mask.bool(), batch.feedback_mask.bool(), batch.attention().bool()
    assert feedback.any() and sampled.any()  # random turns get feedback between them
    assert not (sampled & feedback).any()
    assert (attention >= (sampled | feedback)).all() and (attention & ~sampled & ~feedback).any()  # template too
    assert attention.sum(1).tolist() == batch.lengths
    assert batch.prompts[0].startswith("<|im_start|>system\nRun code in <execute>")
    # each episode's end travels with its row, so one the sandbox stopped is no verdict (molrl.rl.score.exclusion)
    assert len(batch.stop_reasons) == 4 and all(isinstance(reason, str) for reason in batch.stop_reasons)


def test_a_run_logs_both_terms_and_the_kl_starts_at_zero(tmp_path, world_files):
    from molrl.rl import run_rl

    cfg = turns_config(tmp_path / "run", *world_files, max_steps=2)
    cfg.loss.ce_weight, cfg.loss.kl_weight = 0.05, 0.05
    cfg.completion_logps = True
    out = run_rl(cfg)
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "reward" in line]
    assert len(steps) == 2 and all(s["turns/feedback_tokens"] > 0 for s in steps)
    assert all(math.isfinite(s["loss/feedback_ce"]) and s["loss/feedback_ce"] > 0 for s in steps)
    assert steps[0]["loss/decision_kl"] == pytest.approx(0.0, abs=1e-6)  # a fresh adapter is the base
    assert steps[1]["loss/decision_kl"] > 1e-7  # one step later the policy has moved from it
    lines = (out / "completions.jsonl").read_text().splitlines()
    assert len(lines) == 2 * 4
    rows = [json.loads(line) for line in lines]
    for row in rows:  # the whole episode the policy wrote and was shown, not only its final answer
        assert row["episode"] and row["completion"] in row["episode"]  # an episode that submitted nothing too
        assert len(row["token_ids"]) == len(row["trainer_logps"]) == len(row["engine_logps"]) == row["tokens"]
        assert all(x is None for x in row["engine_logps"])  # transformers: no engine log-probs
        assert all(math.isfinite(x) and x <= 0 for x in row["trainer_logps"])
    assert any("<|im_start|>" in row["episode"] for row in rows)  # a later turn, after the environment's feedback


def test_multi_turn_settings_it_cannot_honour_are_refused(tmp_path):
    with pytest.raises(ValueError, match="rollout.partial"):
        cfg = RlConfig()
        cfg.episode.max_turns, cfg.rollout.partial = 2, True
        cfg.__post_init__()
    with pytest.raises(ValueError, match="loss.ce_weight=0.05 does nothing with episode.max_turns=1"):
        cfg = RlConfig()
        cfg.loss.ce_weight = 0.05
        cfg.__post_init__()
    with pytest.raises(ValueError, match="opd"):
        cfg = RlConfig(algorithm="opd", beta=0.0)
        cfg.episode.max_turns = 2
        cfg.__post_init__()


KILLED_RUN = """
import sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from test_rl_turns import turns_config
from molrl.rl import run_rl
cfg = turns_config(Path({out!r}), Path({tasks!r}), Path({base!r}), max_steps=6, save_steps=1)
cfg.loss.ce_weight = 0.05
run_rl(cfg)
"""


@pytest.mark.slow
def test_kill_9_mid_run_then_resume_loses_and_repeats_no_step(tmp_path, world_files):
    from molrl.rl import run_rl

    out, (tasks, base) = tmp_path / "run", world_files
    script = KILLED_RUN.format(tests=str(TESTS), out=str(out), tasks=str(tasks), base=str(base))
    kill_when(script, out / "checkpoints" / "checkpoint-2" / "trainer_state.json")
    assert not (out / "adapter").exists()  # killed before the end
    cfg = turns_config(out, tasks, base, max_steps=6, save_steps=1)
    cfg.loss.ce_weight = 0.05
    run_rl(cfg)
    steps = [json.loads(line)["step"] for line in (out / "completions.jsonl").read_text().splitlines()]
    assert sorted(set(steps)) == list(range(1, 7)) and all(steps.count(s) == 4 for s in range(1, 7))
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in logged if "loss/feedback_ce" in m] == list(range(1, 7))
    assert (out / "adapter").is_dir()


@pytest.mark.slow
def test_two_processes_run_multi_turn_episodes_with_both_terms(tmp_path, world_files):
    tasks, base = world_files
    out, repo = tmp_path / "run", TESTS.parent
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", ACCELERATE_USE_CPU="true")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "molrl.cli", "rl",
           "--config", str(repo / "configs/rl_tiny.yaml"), f"output_dir={out}", f"model.path={base}",
           "train.max_steps=2", "sandbox.workers=1", f"data.path={tasks}", "data.format=jsonl",
           "data.spec.kind=math", "episode.max_turns=2", "episode.feedback=[execution, verdict]",
           "episode.turn_tokens=8", "sampling.max_new_tokens=128", "loss.ce_weight=0.05",
           "loss.kl_weight=0.05"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [m for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "reward" in m]
    assert [m["step"] for m in steps] == [1, 2]
    assert all(m["loss/feedback_ce"] > 0 and m["turns/feedback_tokens"] > 0 for m in steps)
    assert steps[0]["loss/decision_kl"] == pytest.approx(0.0, abs=1e-6) and steps[1]["loss/decision_kl"] > 0
    completions = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert len(completions) == 2 * 2 * 8  # 2 steps x 2 ranks x 1 prompt x 8 episodes
    assert (out / "adapter" / "adapter_config.json").is_file()


@pytest.mark.parametrize("term", ["policy_gradient", "feedback_ce"])
def test_one_step_raises_the_log_probs_its_term_trains(tmp_path, world_files, term):
    from molrl.rl.batch import LossInputs
    from molrl.rl.terms import FeedbackCE

    trainer, batch = four_rollouts(tmp_path, world_files)
    advantages = torch.zeros_like(batch.completion_mask, dtype=torch.float32)
    if term == "policy_gradient":
        advantages[0] = 1.0  # row 0 was good, the others neutral
    else:
        trainer.terms = [FeedbackCE(1.0)]
    inputs = LossInputs(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask, advantages,
                        batch.completion_mask.sum(), attention_mask=batch.attention_mask,
                        feedback_mask=batch.feedback_mask)
    sampled0 = torch.zeros_like(batch.completion_mask)
    sampled0[0] = batch.completion_mask[0]

    def mean_logp(mask):
        logps = trainer.logprobs.completion(trainer.model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                         batch.attention())
        return ((logps * mask).sum() / mask.sum()).item()

    trained = sampled0 if term == "policy_gradient" else batch.feedback_mask
    before = mean_logp(trained)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # (set by TRL's loop, which this step runs without)
    trainer._compute_loss(trainer.model, inputs.to_dict()).backward()
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    with torch.no_grad():  # one plain gradient step
        for p in params:
            p -= 0.5 * p.grad
    assert mean_logp(trained) > before + 1e-4
