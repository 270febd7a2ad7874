"""The RL step's contracts in closed form: advantages, the loss and its aggregation, the trainer around them.

The pure functions are checked on small tensors; ``RlTrainer`` is checked on a fixed batch of the
tiny model (two completions of one prompt, lengths 3 and 1, padded to 4), where the expected
values are derived in the comments, and against the private TRL names it relies on.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from grpo_helpers import loss_inputs
from molrl.rl.config import RlConfig, rl_sampling, rl_train
from molrl.rl.run import trl_args
from molrl.rl.algorithms import ALGORITHMS
from molrl.rl.loss import PolicyLossSettings, policy_loss, sampler_weights
from molrl.rl.groups import zero_std_fraction
from molrl.rl.score import Scorer, Scores
from molrl.rl.trainer import TRL_SURFACE, RlTrainer
from molrl.tasks import Task

MAX_COMPLETION = 4  # Dr.GRPO's constant normaliser is B * max_completion_length = 2 * 4
TASK = Task(id="m", prompt="hi", kind="math", answer="1")


class FixedScorer(Scorer):
    """Scores the rows of a batch with fixed rewards, in order."""

    def __init__(self, rewards):
        super().__init__(None, None)
        self.rewards = rewards

    def score(self, tasks, completions, stop_reasons=None):
        n = len(completions)
        return Scores(list(self.rewards)[:n], ["math/wrong"] * n, [None] * n, [None] * n)


def make_trainer(tmp_path, algorithm="dr_grpo", beta=0.0, epsilon=0.2, rewards=None):
    """A trainer on the tiny model; with beta > 0 the model gets a LoRA adapter (its reference is the base)."""
    from datasets import Dataset
    from peft import LoraConfig
    from molrl.tiny import build_tiny_pair

    model, tok = build_tiny_pair("chatml", initializer_range=0.1)
    cfg = RlConfig(output_dir=tmp_path, algorithm=algorithm, beta=beta, epsilon=epsilon,
                   sampling=rl_sampling(n=2, max_new_tokens=MAX_COMPLETION, temperature=1.0),
                   train=rl_train(micro_batch_size=2, max_steps=1))
    args = trl_args(cfg, tmp_path / "ckpt", cuda=False)
    prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    row = {"prompt": prompt, "prompt_ids": tok(prompt, add_special_tokens=False)["input_ids"],
           "task_json": TASK.to_json()}
    ds = Dataset.from_list([row] * 4)
    peft_config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False) if beta else None
    trainer = RlTrainer(model=model, scorer=FixedScorer(rewards or [0.0, 0.0]), config=cfg, args=args,
                        train_dataset=ds, processing_class=tok, peft_config=peft_config)
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop; one micro-batch per step here
    return trainer, trainer.model


def fixed_batch(advantages):
    """Prompt 'ab' (2 tokens), completions of 3 and 1 tokens, right-padded to 4; advantages [B] on every token."""
    prompt_ids = torch.tensor([[97, 98], [97, 98]])  # [B=2, P=2]
    completion_ids = torch.tensor([[99, 100, 101, 0], [102, 0, 0, 0]])  # [B, C=4]
    completion_mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])  # [B, C] real completion tokens
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor(advantages, dtype=torch.float32)[:, None] * completion_mask,  # [B, C]
        "num_items_in_batch": completion_mask.sum(),
    }


def completion_logps(model, batch):
    """log pi(o_t | q, o_<t) of every completion position, by a plain forward pass: [B, C]."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)  # [B, P+C]
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]  # [B, P+C-1, V] predicts tokens 1..
    logps = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)  # [B, P+C-1]
    return logps[:, -batch["completion_ids"].size(1):]  # [B, C]


def trainer_loss_and_grads(trainer, model, batch):
    model.zero_grad()
    loss = trainer._compute_loss(model, batch)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


# --- advantages, closed form ----------------------------------------------------------------------

MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1]], dtype=torch.float32)  # [N=4, T=3]
REWARDS = torch.tensor([1.0, 0.0, 0.5, 0.5])  # two groups of G = 2: [1, 0] and a tie [0.5, 0.5]
STD = math.sqrt(0.5)  # sample std of [1, 0]


@pytest.mark.parametrize("algorithm, per_row", [
    ("dr_grpo", [0.5, -0.5, 0.0, 0.0]),  # R - mean
    ("grpo", [0.5 / (STD + 1e-4), -0.5 / (STD + 1e-4), 0.0, 0.0]),  # (R - mean) / (std + 1e-4)
    ("dr_grpo_std", [0.5 / (STD + 1e-4), -0.5 / (STD + 1e-4), 0.0, 0.0]),
])
def test_advantages_in_closed_form(algorithm, per_row):
    advantages = ALGORITHMS[algorithm].advantage_fn(REWARDS, torch.ones(4, dtype=torch.bool), MASK, 2)
    assert advantages.shape == MASK.shape  # [N, T]: the row's advantage on each of its loss tokens, 0 elsewhere
    torch.testing.assert_close(advantages, torch.tensor(per_row)[:, None] * MASK)


def test_a_group_of_ties_carries_no_signal_and_is_counted():
    every = torch.ones(4, dtype=torch.bool)
    assert zero_std_fraction(REWARDS, every, 2) == 0.5
    assert zero_std_fraction(torch.tensor([0.0, 1.0, 2.0, 3.0]), every, 4) == 0.0


def test_aggregation_is_per_algorithm():
    assert {name: algorithm.aggregation for name, algorithm in ALGORITHMS.items()} == {"grpo": "sequence_mean", "dr_grpo": "constant", "dr_grpo_std": "constant",
                           "opd": "token_mean", "ppo": "token_mean"}


# --- the loss, closed form ------------------------------------------------------------------------

def _leaf(values):
    return torch.tensor(values, dtype=torch.float32, requires_grad=True)


def test_constant_aggregation_sums_tokens_over_b_times_t_max():
    # on-policy: ratio 1, no clipping, token loss -A_i; loss = -(1 * 3 + (-1) * 1) / (2 * 4) = -0.25,
    # and d loss / d logp_{i,t} = -A_i / 8 on each loss token
    logps = _leaf([[-1.0, -2.0, -0.5, -3.0], [-1.5, -1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 0, 0, 0]])
    adv = torch.tensor([1.0, -1.0])[:, None] * mask
    stats = policy_loss(logps, loss_inputs(adv, mask), PolicyLossSettings("constant", 4))
    loss = stats.loss
    loss.backward()
    assert loss.item() == pytest.approx(-0.25)
    torch.testing.assert_close(logps.grad, -adv / 8)
    assert stats.tokens.item() == 4 and stats.clipped_low.item() == stats.clipped_high.item() == 0


def test_sequence_mean_aggregation_averages_within_each_completion_first():
    # (1/2) * (-(1 * 3) / 3 - ((-1) * 1) / 1) = 0 where the constant normaliser gave -0.25 (the length bias);
    # d loss / d logp_{i,t} = -A_i / (|o_i| * B)
    logps = _leaf([[-1.0, -2.0, -0.5, -3.0], [-1.5, -1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 0, 0, 0]])
    adv = torch.tensor([1.0, -1.0])[:, None] * mask
    loss = policy_loss(logps, loss_inputs(adv, mask), PolicyLossSettings("sequence_mean", 4)).loss
    loss.backward()
    assert loss.item() == pytest.approx(0.0, abs=1e-7)
    torch.testing.assert_close(logps.grad, -adv / (torch.tensor([[3.0], [1.0]]) * 2))


def test_token_mean_aggregation_averages_over_all_loss_tokens():
    # -(1 * 3 + (-1) * 1) / 4 tokens = -0.5; d loss / d logp_{i,t} = -A_i / 4
    logps = _leaf([[-1.0, -2.0, -0.5, -3.0], [-1.5, -1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 0, 0, 0]])
    adv = torch.tensor([1.0, -1.0])[:, None] * mask
    loss = policy_loss(logps, loss_inputs(adv, mask), PolicyLossSettings("token_mean", 4)).loss
    loss.backward()
    assert loss.item() == pytest.approx(-0.5)
    torch.testing.assert_close(logps.grad, -adv / 4)


def test_clipping_and_the_kl_term_match_the_formula():
    # ratios e^0.5 (A > 0: clipped at 1.2, no gradient) and e^-0.4 (A < 0: clipped at 0.8, no gradient);
    # KL3 = e^d - d - 1 with d = ref - logp, weighted by the ratio
    beta, eps = 0.1, 0.2
    logps = _leaf([[-1.0], [-2.0]])
    behaviour = torch.tensor([[-1.5], [-1.6]])
    reference = torch.tensor([[-0.7], [-2.2]])
    mask = torch.ones(2, 1)
    adv = torch.tensor([[0.7], [-1.3]])
    stats = policy_loss(logps, loss_inputs(adv, mask, behaviour, reference), PolicyLossSettings("constant", 1, eps, eps, beta))
    loss = stats.loss
    loss.backward()
    ratio = torch.exp(torch.tensor([[0.5], [-0.4]]))
    d = reference - logps.detach()
    kl = torch.exp(d) - d - 1
    expected = (-(ratio.clamp(1 - eps, 1 + eps) * adv) + beta * ratio * kl).sum() / 2
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    # gradient: clipped surrogate contributes nothing; d(r * KL3)/d logp = r * KL3 + r * (1 - e^d)
    torch.testing.assert_close(logps.grad, beta * (ratio * kl + ratio * (1 - torch.exp(d))) / 2)
    assert stats.clipped_high.item() == 1 and stats.clipped_low.item() == 1
    assert stats.kl.item() == pytest.approx(kl.sum().item(), rel=1e-6)


def test_sampler_weights_drop_completions_past_the_cap():
    trainer = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    sampler = torch.tensor([[-1.5, float("nan")], [-3.0, -1.0]])  # NaN: the sampler's log-prob is unknown
    weights = sampler_weights(trainer, sampler, torch.ones(2, 2))
    torch.testing.assert_close(weights, torch.tensor([[math.exp(0.5)], [0.0]]))  # e^2 > 3: left out


# --- the trainer ----------------------------------------------------------------------------------

def test_dr_grpo_loss_is_token_sum_over_constant(tmp_path):
    # On-policy (old = current) the ratio is 1 and no clipping acts, so the per-token loss is -A_i:
    # loss = -(sum_i A_i |o_i|) / (B * L) = -(1 * 3 + (-1) * 1) / (2 * 4) = -0.25.
    trainer, model = make_trainer(tmp_path)
    batch = fixed_batch([1.0, -1.0])
    loss, grads = trainer_loss_and_grads(trainer, model, batch)
    assert loss.item() == pytest.approx(-0.25, abs=1e-6)

    # Its gradient is -(1/8) * (grad sum_t log pi(o_1,t) - grad log pi(o_2,1)).
    model.zero_grad()
    logps = completion_logps(model, batch)  # [B, C]
    masked = logps * batch["completion_mask"]
    (-(masked[0].sum() - masked[1].sum()) / 8).backward()
    for name, p in model.named_parameters():
        if name in grads:
            torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-7)


def test_grpo_loss_averages_per_sequence(tmp_path):
    # GRPO averages within each completion first: (1/2) * (-(1 * 3)/3 - ((-1) * 1)/1) = 0, where
    # Dr.GRPO gave -0.25: the length bias Dr.GRPO removes.
    trainer, model = make_trainer(tmp_path, algorithm="grpo")
    loss, _ = trainer_loss_and_grads(trainer, model, fixed_batch([1.0, -1.0]))
    assert loss.item() == pytest.approx(0.0, abs=1e-6)


def test_dr_grpo_loss_with_clipping_and_kl_matches_hand_computation(tmp_path):
    # Off-policy old log-probs push some ratios outside [1 - eps, 1 + eps]; beta adds TRL's k3 KL
    # estimate exp(ref - logp) - (ref - logp) - 1, weighted by the ratio (bias-corrected KL).
    beta, eps = 0.1, 0.2
    trainer, model = make_trainer(tmp_path, beta=beta, epsilon=eps)
    batch = fixed_batch([0.7, -1.3])
    with torch.no_grad():
        current = completion_logps(model, batch)  # [B, C]
    batch["behaviour_logps"] = current + torch.tensor([[0.5, -0.5, 0.05, 0.0], [-0.4, 0.0, 0.0, 0.0]])
    batch["reference_logps"] = current + torch.tensor([[0.3, 0.1, -0.2, 0.0], [0.2, 0.0, 0.0, 0.0]])
    loss, grads = trainer_loss_and_grads(trainer, model, batch)

    model.zero_grad()
    logp = completion_logps(model, batch)  # [B, C]
    adv = batch["advantages"]  # [B, C]
    ratio = torch.exp(logp - batch["behaviour_logps"])
    surrogate = -torch.min(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv)
    d = batch["reference_logps"] - logp
    kl = (torch.exp(d) - d - 1) * ratio
    per_token = (surrogate + beta * kl) * batch["completion_mask"]
    expected = per_token.sum() / (2 * MAX_COMPLETION)
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)  # fused vs plain log-softmax rounding
    # the batch really exercises clipping: ratio e^-0.5 < 0.8 with A > 0 and e^0.4 > 1.2 with A < 0
    assert math.exp(-0.5) < 1 - eps and math.exp(0.4) > 1 + eps
    for name, p in model.named_parameters():
        if name in grads:
            torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize(
    "algorithm, expected",
    [
        # rewards [1, 0] of one group: mean 0.5, unbiased std sqrt(0.5) = 0.7071
        ("dr_grpo", [0.5, -0.5]),  # A = R - mean
        ("dr_grpo_std", [0.5 / (0.70711 + 1e-4), -0.5 / (0.70711 + 1e-4)]),  # A = (R - mean) / (std + 1e-4)
        ("grpo", [0.5 / (0.70711 + 1e-4), -0.5 / (0.70711 + 1e-4)]),
    ],
)
def test_the_trainer_gives_each_token_its_completions_advantage(tmp_path, algorithm, expected):
    trainer, model = make_trainer(tmp_path, algorithm=algorithm, rewards=[1.0, 0.0])
    trainer.model.train()
    rows = [trainer.train_dataset[0], trainer.train_dataset[0]]  # one prompt, G = 2
    out = trainer._generate_and_score_completions(rows)
    advantages, mask = out["advantages"], out["completion_mask"]
    assert advantages.shape == mask.shape
    for row, value in enumerate(expected):
        assert advantages[row][mask[row].bool()].tolist() == pytest.approx([value] * int(mask[row].sum()), rel=1e-4)


def test_the_private_trl_names_the_step_relies_on_are_there(tmp_path):
    # fails loudly when the pinned TRL changes underneath RlTrainer's two overrides
    from trl import GRPOTrainer

    for name, params in TRL_SURFACE["methods"].items():
        method = getattr(GRPOTrainer, name, None)
        assert method is not None, f"TRL's GRPOTrainer no longer has {name}"
        missing = set(params) - set(inspect.signature(method).parameters)
        assert not missing, f"TRL's GRPOTrainer.{name} lost parameters {missing}"
    trainer, _ = make_trainer(tmp_path, beta=0.1)
    for name in TRL_SURFACE["attributes"]:
        assert hasattr(trainer, name), f"TRL's GRPOTrainer no longer sets {name}"
    # _generate returns the 8 fields rollout unpacks
    rollout_source = inspect.getsource(GRPOTrainer._generate)
    assert "return prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images, tool_images" \
        in rollout_source


def test_the_vllm_generation_attributes_partial_rollouts_read_are_there():
    # partial rollouts on vLLM drive TRL's colocated engine themselves with TRL's own sampling settings
    from trl.generation.vllm_generation import VLLMGeneration

    source = inspect.getsource(VLLMGeneration)
    for name in ("self.temperature", "self.top_p", "self.top_k", "self.min_p", "self.repetition_penalty",
                 "self.generation_kwargs", "self.enable_sleep_mode", "self._llm_weights_sleeping", "self.llm = LLM(",
                 "def sync_weights("):
        assert name in source, f"TRL's VLLMGeneration no longer has {name}"
    assert "self._last_loaded_step" in inspect.getsource(GRPOTrainer := __import__("trl").GRPOTrainer)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_the_lora_dropout_a_user_sets_is_the_one_that_trains(tmp_path, dropout):
    """TRL turns every dropout off for RL; a LoRA dropout set in the config must not be dropped silently."""
    from datasets import Dataset
    from peft import LoraConfig
    from molrl.rl.config import rl_lora
    from molrl.tiny import build_tiny_pair

    model, tok = build_tiny_pair("chatml", initializer_range=0.1)
    cfg = RlConfig(output_dir=tmp_path,
                   sampling=rl_sampling(n=2, max_new_tokens=MAX_COMPLETION),
                   train=rl_train(micro_batch_size=2, max_steps=1), lora=rl_lora(rank=4, dropout=dropout))
    prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    row = {"prompt": prompt, "prompt_ids": tok(prompt, add_special_tokens=False)["input_ids"], "task_json": TASK.to_json()}
    peft_config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=dropout)
    trainer = RlTrainer(model=model, scorer=FixedScorer([0.0, 0.0]), config=cfg,
                        args=trl_args(cfg, tmp_path / "ckpt", cuda=False), train_dataset=Dataset.from_list([row] * 4),
                        processing_class=tok, peft_config=peft_config)
    rates = {m.p for name, m in trainer.model.named_modules() if "lora_dropout" in name and isinstance(m, torch.nn.Dropout)}
    assert rates == ({dropout} if dropout else set())  # at 0 peft puts no dropout module in


def test_every_registered_aggregation_splits_a_step_into_micro_batches_that_add_up():
    """Each entry of the registry, enumerated: the sum of micro-batch shares at the step's normaliser is the whole
    step's loss, and an unknown name is one line naming the known ones."""
    from molrl.rl.batch import StepCounts
    from molrl.rl.loss import AGGREGATORS, aggregator, policy_normaliser

    logps = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -1.0, -1.0], [-0.2, -0.3, -0.4]])
    mask = torch.tensor([[1.0, 1, 0], [1, 0, 0], [1, 1, 1]])
    adv = torch.tensor([0.5, -1.0, 2.0])[:, None] * mask
    for name in AGGREGATORS:
        settings = PolicyLossSettings(name, 3)
        whole = policy_loss(logps, loss_inputs(adv, mask), settings).loss
        step = policy_normaliser(name, StepCounts.of(mask), 3)
        parts = sum(policy_loss(logps[i:i + 1], loss_inputs(adv[i:i + 1], mask[i:i + 1]), settings, step).loss
                    for i in range(3))
        assert parts.item() == pytest.approx(whole.item(), abs=1e-6), name
    with pytest.raises(ValueError, match="sequence_mean, constant, token_mean"):
        aggregator("median")
