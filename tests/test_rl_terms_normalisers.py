"""The RL loss is a mean over the optimiser step, and the feedback CE is the model's own (temperature 1).

Closed-form checks of the pure functions (``molrl.rl.loss``, ``molrl.rl.terms``) with a normaliser, then
``RlTrainer._compute_loss`` on a fixed multi-turn batch of the tiny model (4 rows, two with feedback tokens and
two without): the step's gradient is the same in one micro-batch, in 2 x 2, in 4 x 1 and over two processes,
for every aggregation and with both terms on.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict

from grpo_helpers import loss_inputs
from molrl.rl.batch import LossInputs, StepCounts
from molrl.rl.config import RlConfig, rl_sampling, rl_train
from molrl.rl.loss import PolicyLossSettings, policy_loss, policy_normaliser, value_loss
from molrl.rl.run import trl_args
from molrl.rl.score import Scorer
from molrl.rl.terms import DecisionKL, FeedbackCE, decision_kl, feedback_cross_entropy, token_logps
from molrl.rl.trainer import RlTrainer
from molrl.tasks import Task

TESTS = Path(__file__).parent
AGGREGATIONS = ("sequence_mean", "constant", "token_mean")
WIDTH = 6  # completion width T and max_completion_length
TEMPERATURE = 0.9  # the default sampling temperature


# --- closed form ----------------------------------------------------------------------------------

def test_feedback_ce_over_micro_batches_divides_by_the_steps_feedback_tokens():
    # per-token CE [4] in one micro-batch and [1, 1, 1] in another: the step's 4 feedback tokens carry
    # 4 + 1 + 1 + 1 = 7, so the step's CE is 7 / 4 = 1.75 = 4/4 + 3/4; the mean of the micro-batch means
    # (4 + 1) / 2 = 2.5 is what dividing each by its own count gives
    first, second = torch.tensor([[-4.0, 0.0]]), torch.tensor([[-1.0, -1.0, -1.0]])
    first_mask, second_mask = torch.tensor([[1, 0]]), torch.tensor([[1, 1, 1]])
    shares = [feedback_cross_entropy(first, first_mask, 4.0), feedback_cross_entropy(second, second_mask, 4.0)]
    assert [s.item() for s in shares] == pytest.approx([1.0, 0.75])
    assert sum(shares).item() == pytest.approx(1.75)
    assert (feedback_cross_entropy(first, first_mask) + feedback_cross_entropy(second, second_mask)).item() / 2 \
        == pytest.approx(2.5)  # each its own mean: not the step's CE
    assert feedback_cross_entropy(first, torch.zeros_like(first_mask), 4.0).item() == 0.0  # no feedback: adds 0


def test_decision_kl_divides_its_sum_by_the_steps_decision_tokens():
    # KL((1/2, 1/2) || (1/4, 3/4)) = 1/2 ln(4/3) at the one decision token; the step has 3 decision tokens
    policy = torch.zeros(1, 2, 2)
    base = torch.tensor([[[0.0, math.log(3.0)], [5.0, -5.0]]])
    assert decision_kl(policy, base, torch.tensor([[1, 0]]), 3.0).item() == pytest.approx(0.5 * math.log(4 / 3) / 3,
                                                                                         rel=1e-5)


def test_token_log_probs_are_the_models_at_temperature_one_on_the_masked_tokens_only():
    # logits (0, ln 3): p = (1/4, 3/4); token 1 at position 0, position 1 not selected
    logits = torch.tensor([[[0.0, math.log(3.0)], [2.0, 0.0]]])
    logps = token_logps(logits, torch.tensor([[1, 0]]), torch.tensor([[1, 0]]))
    torch.testing.assert_close(logps, torch.tensor([[math.log(3 / 4), 0.0]]))


def test_each_aggregation_divides_by_its_count_of_the_step():
    counts = StepCounts(torch.tensor(10.0), torch.tensor(3.0), torch.tensor(4.0))  # tokens, feedback, completions
    assert policy_normaliser("token_mean", counts, 6).item() == 10  # loss tokens
    assert policy_normaliser("sequence_mean", counts, 6).item() == 4  # completions
    assert policy_normaliser("constant", counts, 6).item() == 24  # completions x max_completion_length


@pytest.mark.parametrize("aggregation, normaliser", [("token_mean", 4), ("sequence_mean", 2), ("constant", 2 * 4)])
def test_two_micro_batches_of_the_policy_loss_add_up_to_the_steps(aggregation, normaliser):
    # on-policy, token loss -A_i: rows of 3 and 1 tokens with A = 1 and -1, one row per micro-batch; the step's
    # loss is token_mean -(3 - 1) / 4 = -0.5, sequence_mean -(3/3 - 1/1) / 2 = 0, constant -(3 - 1) / (2 * 4)
    logps = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-1.5, -1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 0, 0, 0]])
    adv = torch.tensor([1.0, -1.0])[:, None] * mask
    settings = PolicyLossSettings(aggregation, 4)
    whole = policy_loss(logps, loss_inputs(adv, mask), settings).loss
    parts = [policy_loss(logps[i:i + 1], loss_inputs(adv[i:i + 1], mask[i:i + 1]), settings, normaliser=normaliser).loss
             for i in range(2)]
    assert whole.item() == pytest.approx({"token_mean": -0.5, "sequence_mean": 0.0, "constant": -0.25}[aggregation])
    assert sum(parts).item() == pytest.approx(whole.item(), abs=1e-7)


def test_the_value_loss_divides_its_sum_by_the_steps_loss_tokens():
    # 0.5 (V - R)^2 = 0.5 * 0.64 and 0.5 * 0.81 (no clipping: V_old = V), over a step of 5 loss tokens
    values, returns = torch.tensor([[0.5, -0.1]]), torch.tensor([[-0.3, 0.8]])
    loss = value_loss(values, values, returns, torch.ones(1, 2), 10.0, 5.0)
    assert loss.item() == pytest.approx(0.5 * (0.64 + 0.81) / 5)


def test_the_step_counts_reach_every_micro_batch_through_trls_shuffle_and_split():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]])
    feedback = torch.tensor([[0, 0, 1], [0, 1, 1], [0, 0, 0], [0, 0, 0]])

    def two_processes(local):  # gather, as if a second process had the same rows
        return torch.cat([local, local])

    inputs = LossInputs(mask, mask, mask, mask, mask.float(), feedback_mask=feedback).counted(two_processes)
    for chunk in split_tensor_dict(shuffle_sequence_dict(inputs.to_dict()), 2):
        counts = LossInputs.from_dict(chunk).counts()
        # 6 loss tokens, 3 feedback tokens and 4 completions per process, two processes
        assert (counts.tokens.item(), counts.feedback.item(), counts.completions.item()) == (12, 6, 8)


# --- the trainer on a fixed batch -----------------------------------------------------------------

def make_trainer(out: Path, algorithm: str = "dr_grpo", temperature: float = TEMPERATURE) -> RlTrainer:
    """A trainer on the tiny model with a random (non-zero) LoRA adapter, in training mode; PPO's critic shared."""
    from datasets import Dataset
    from peft import LoraConfig

    from molrl.tiny import build_tiny_pair

    model, tok = build_tiny_pair("chatml", initializer_range=0.1)
    cfg = RlConfig(output_dir=out, algorithm=algorithm, beta=0.0,
                   sampling=rl_sampling(n=2, max_new_tokens=WIDTH, temperature=temperature),
                   train=rl_train(micro_batch_size=2, max_steps=1))
    cfg.ppo.critic = "shared"
    prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    row = {"prompt": prompt, "prompt_ids": tok(prompt, add_special_tokens=False)["input_ids"],
           "task_json": Task(id="m", prompt="hi", kind="math", answer="1").to_json()}
    torch.manual_seed(0)
    trainer = RlTrainer(model=model, scorer=Scorer(None, None), config=cfg,
                        args=trl_args(cfg, out / "ckpt", cuda=False), train_dataset=Dataset.from_list([row] * 4),
                        processing_class=tok, peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                                     init_lora_weights=False))
    trainer.model.train()
    return trainer


def step_rows() -> dict[str, torch.Tensor]:
    """Four multi-turn rows of lengths 6, 5, 4 and 2: sampled tokens, feedback on rows 0 and 1 only."""
    generator = torch.Generator().manual_seed(0)
    sampled = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 0, 0, 1, 1, 0], [1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]])
    feedback = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 1, 1, 0, 0, 0], [0] * 6, [0] * 6])
    attention = torch.tensor([[1] * 6, [1] * 5 + [0], [1] * 4 + [0] * 2, [1] * 2 + [0] * 4])
    prompt_ids = torch.randint(0, 256, (4, 3), generator=generator)
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": torch.randint(0, 256, (4, WIDTH), generator=generator) * attention,
        "completion_mask": sampled,
        "advantages": torch.tensor([1.0, -0.5, 0.7, -1.2])[:, None] * sampled,
        "attention_mask": attention,
        "feedback_mask": feedback,
        "extra.returns": torch.randn(4, WIDTH, generator=generator),
        "extra.old_values": torch.zeros(4, WIDTH),
    }


def step_inputs(trainer: RlTrainer, rows: slice = slice(None)) -> dict[str, torch.Tensor]:
    """This process's ``rows`` of the step, with the step's counts over every process (as ``RlTrainer.step``)."""
    local = LossInputs.from_dict({k: v[rows] for k, v in step_rows().items()})
    return local.counted(trainer.accelerator.gather).to_dict()


def gradients(trainer: RlTrainer, model, inputs: dict[str, torch.Tensor], micro_batches: int,
              aggregation: str) -> dict[str, torch.Tensor]:
    """The gradient of one optimiser step over ``inputs`` split into ``micro_batches`` accumulated micro-batches."""
    trainer.loss_settings = replace(trainer.loss_settings, aggregation=aggregation)
    trainer.current_gradient_accumulation_steps = trainer.args.steps_per_generation = micro_batches
    model.zero_grad()
    for chunk in split_tensor_dict(inputs, micro_batches):
        trainer._compute_loss(model, chunk).backward()
    return {n: p.grad.clone() for n, p in trainer.accelerator.unwrap_model(model).named_parameters()
            if p.grad is not None}


def relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """||a - b|| / ||b|| over all parameters."""
    assert a.keys() == b.keys()
    diff = sum(((a[k].double() - b[k].double()) ** 2).sum() for k in b)
    return math.sqrt(diff) / math.sqrt(sum((b[k].double() ** 2).sum() for k in b))


def completion_logits(trainer: RlTrainer, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """[B, T, V] the policy's plain logits at the completion positions, by a forward pass of its own."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["attention_mask"]], dim=1)
    return trainer.model(input_ids=ids, attention_mask=attention).logits[:, -WIDTH - 1:-1]


def test_feedback_ce_is_the_models_cross_entropy_at_temperature_one(tmp_path):
    trainer = make_trainer(tmp_path)
    trainer.terms = [FeedbackCE(1.0)]
    batch = step_inputs(trainer)
    batch["advantages"] = torch.zeros_like(batch["advantages"])  # the policy term adds 0: the loss is the CE
    trained = gradients(trainer, trainer.model, batch, 1, "token_mean")
    logged = trainer.metrics()["loss/feedback_ce"][-1]

    trainer.model.zero_grad()
    logits = completion_logits(trainer, batch)  # [B, T, V]
    feedback = batch["feedback_mask"].bool()
    targets = batch["completion_ids"][feedback]
    ce = torch.nn.functional.cross_entropy(logits[feedback], targets)  # the model's CE, temperature 1
    tempered = torch.nn.functional.cross_entropy(logits[feedback] / TEMPERATURE, targets)  # what TRL's log-probs give
    assert abs(tempered.item() - ce.item()) > 0.05  # the batch tells the two apart
    assert logged == pytest.approx(ce.item(), rel=1e-5)
    ce.backward()
    expected = {n: p.grad for n, p in trainer.model.named_parameters() if p.grad is not None}
    assert relative_difference(trained, expected) < 1e-5


@pytest.fixture(scope="module")
def trainer_with_terms(tmp_path_factory):
    trainer = make_trainer(tmp_path_factory.mktemp("split"))
    trainer.terms = [FeedbackCE(1.0), DecisionKL(1.0)]
    return trainer


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_a_steps_gradient_is_the_same_however_it_is_split_into_micro_batches(trainer_with_terms, aggregation):
    trainer = trainer_with_terms
    inputs = step_inputs(trainer)
    whole = gradients(trainer, trainer.model, inputs, 1, aggregation)
    logged = {name: trainer.metrics()[name][-1] for name in ("loss/feedback_ce", "loss/decision_kl", "entropy")}
    for micro in (2, 4):  # 2 x 2 (rows 2-3 have no feedback) and 4 x 1
        split = gradients(trainer, trainer.model, inputs, micro, aggregation)
        assert relative_difference(split, whole) < 1e-5, micro
        for name, value in logged.items():  # TRL logs the mean of the micro-batches' entries: the step's mean
            assert sum(trainer.metrics()[name][-micro:]) / micro == pytest.approx(value, rel=1e-5), (micro, name)
    assert logged["loss/feedback_ce"] > 0 and logged["loss/decision_kl"] > 0


def test_ppos_value_loss_is_split_invariant_too(tmp_path):
    trainer = make_trainer(tmp_path, algorithm="ppo")  # token_mean, the shared critic's value loss beside it
    trainer.terms = [FeedbackCE(1.0), DecisionKL(1.0)]
    inputs = step_inputs(trainer)
    whole = gradients(trainer, trainer.model, inputs, 1, "token_mean")
    assert any("molrl_value_head" in name for name in whole)
    for micro in (2, 4):
        assert relative_difference(gradients(trainer, trainer.model, inputs, micro, "token_mean"), whole) < 1e-5


def test_an_optimiser_step_fed_by_part_of_a_generation_batch_counts_its_share(trainer_with_terms):
    trainer = trainer_with_terms
    inputs = LossInputs.from_dict(step_inputs(trainer))  # 4 + 3 + 4 + 2 = 13 loss tokens, 4 feedback, 4 rows
    trainer.current_gradient_accumulation_steps, trainer.args.steps_per_generation = 2, 4  # 2 steps per generation
    counts = trainer.step_counts(inputs)
    assert (counts.tokens.item(), counts.feedback.item(), counts.completions.item()) == (6.5, 2, 2)  # half of each
    trainer.model.eval()  # evaluation: neither split nor accumulated
    try:
        assert trainer.step_counts(inputs).tokens.item() == 13
    finally:
        trainer.model.train()


TWO_PROCESSES = """
import sys
sys.path.insert(0, {tests!r})
from pathlib import Path
import torch
from test_rl_terms_normalisers import gradients, make_trainer, step_inputs
from molrl.rl.terms import DecisionKL, FeedbackCE
AGGREGATIONS = {aggregations!r}
trainer = make_trainer(Path({out!r}), {algorithm!r})
trainer.terms = [FeedbackCE(1.0), DecisionKL(1.0)]
initial = torch.load({initial!r})
with torch.no_grad():
    for name, p in trainer.model.named_parameters():
        if name in initial:
            p.copy_(initial[name])
acc = trainer.accelerator
assert acc.num_processes == 2
model = acc.prepare_model(trainer.model)  # DDP: gradients averaged over the two processes
inputs = step_inputs(trainer, slice(2 * acc.process_index, 2 * acc.process_index + 2))
result = {{(a, m): gradients(trainer, model, inputs, m, a) for a in AGGREGATIONS for m in (1, 2)}}
if acc.is_main_process:
    torch.save(result, {result!r})
"""


@pytest.mark.parametrize("algorithm, aggregations", [
    ("dr_grpo", AGGREGATIONS),
    # PPO's shared value head sits outside the DDP forward: left out of DDP, its gradient averaged by molrl
    pytest.param("ppo", ("token_mean",), marks=pytest.mark.slow),
])
def test_two_processes_give_the_gradient_of_one(tmp_path, algorithm, aggregations):
    trainer = make_trainer(tmp_path / "one", algorithm)
    trainer.terms = [FeedbackCE(1.0), DecisionKL(1.0)]
    initial = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    torch.save(initial, tmp_path / "initial.pt")
    inputs = step_inputs(trainer)
    one = {a: gradients(trainer, trainer.model, inputs, 1, a) for a in aggregations}
    if algorithm == "ppo":
        assert any("molrl_value_head" in name for name in one["token_mean"])
    script = TWO_PROCESSES.format(tests=str(TESTS), out=str(tmp_path / "two"), initial=str(tmp_path / "initial.pt"),
                                  result=str(tmp_path / "two.pt"), algorithm=algorithm, aggregations=aggregations)
    (tmp_path / "two.py").write_text(script)
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", ACCELERATE_USE_CPU="true")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(tmp_path / "two.py")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = torch.load(tmp_path / "two.pt")
    for (aggregation, micro), grads in two.items():  # 2 processes x 1 micro-batch of 2 rows, 2 x 2 of 1 row
        assert relative_difference(grads, one[aggregation]) < 1e-5, (aggregation, micro)
