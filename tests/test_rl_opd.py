"""On-policy distillation (algorithm=opd): the advantage in closed form, the teacher's context, the stage end to end."""

from __future__ import annotations

import json

import pytest
import torch

from grpo_helpers import save_tiny_model, toy_config
from molrl.config.blocks import RlModelSource
from molrl.errors import MolrlError
from molrl.graders.grade import Grade
from molrl.rl.config import OpdSettings
from molrl.rl.algorithms.opd import opd_advantages, teacher_messages, teacher_prefix_ids
from molrl.tasks import Task, TestCase

TEACHER = torch.tensor([[-0.5, -1.0, -2.0], [-0.1, -3.0, 0.0]])  # [B=2, T=3] log pi_T of the sampled tokens
POLICY = torch.tensor([[-1.0, -1.0, -1.0], [-0.2, -2.0, 0.0]])
BASE = torch.tensor([[-0.8, -1.5, -1.2], [-0.3, -2.5, 0.0]])  # the student's base (the default reference)
OTHER = torch.tensor([[-0.6, -0.6, -0.6], [-0.6, -0.6, 0.0]])  # another reference (the teacher's pre-RL base)
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


@pytest.mark.parametrize("lam", [1.0, 1.25])
@pytest.mark.parametrize("reference", [BASE, OTHER], ids=["student_base", "other"])
def test_advantage_in_closed_form(lam, reference):
    # A_t = lam (log pi_T - log pi_ref) - (log pi_theta - log pi_ref), token by token, 0 off the mask
    expected = torch.zeros(2, 3)
    for b in range(2):
        for t in range(3):
            if MASK[b, t]:
                expected[b, t] = lam * (TEACHER[b, t] - reference[b, t]) - (POLICY[b, t] - reference[b, t])
    torch.testing.assert_close(opd_advantages(TEACHER, reference, POLICY, MASK, lam), expected)


def test_lambda_one_reduces_to_teacher_minus_policy_whatever_the_reference():
    # lam = 1: the reference cancels; A_t = log pi_T - log pi_theta (standard on-policy distillation)
    for reference in (BASE, OTHER):
        torch.testing.assert_close(opd_advantages(TEACHER, reference, POLICY, MASK, 1.0), (TEACHER - POLICY) * MASK)
    # the teacher is the student: nothing to learn
    assert opd_advantages(POLICY, BASE, POLICY, MASK, 1.0).abs().max().item() == 0.0


SQUARE = Task(id="sq", prompt="Return x squared.", kind="code", entry_point="sq",
              tests=[TestCase("call", args=[3], expected=9)], reference="def sq(x):\n    return x * x")


def test_the_feedback_teacher_reads_the_attempt_and_its_test_results():
    grade = Grade(0.3, False, "partial", details={"total": 1, "passed": 0, "status": "ok", "tests": [
        {"index": 0, "passed": False, "error": "wrong answer", "got": 6}]})
    messages = teacher_messages(SQUARE, "Write sq.", "```python\ndef sq(x): return x + x\n```", grade, "feedback")
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert "sq(3) returned 6, expected 9" in messages[2]["content"] and "Your solution is wrong." in messages[2]["content"]
    reference = teacher_messages(SQUARE, "Write sq.", "", grade, "reference")
    assert reference == [{"role": "user", "content": "Write sq.\n\nA reference solution:\n" + SQUARE.reference}]
    with pytest.raises(MolrlError, match="task m has no reference"):
        teacher_messages(Task(id="m", prompt="?", kind="math", answer="1"), "?", "", None, "reference")


def test_alignment_fails_loudly_where_the_real_tokenizer_merges_across_the_boundary(qwen3_tokenizer):
    tok = qwen3_tokenizer
    messages = [{"role": "user", "content": "What is 2+2?"}]
    prefix = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    clean = tok("The answer is \\boxed{4}.", add_special_tokens=False)["input_ids"]
    assert teacher_prefix_ids(tok, messages, False, clean, "t") == tok(prefix, add_special_tokens=False)["input_ids"]
    # the template ends in blank lines; a completion that starts with one more newline merges into "\n\n\n"
    merged = tok("\nThe answer is 4.", add_special_tokens=False)["input_ids"]
    with pytest.raises(MolrlError, match="task t: the tokenizer merges tokens across the boundary"):
        teacher_prefix_ids(tok, messages, False, merged, "t")


def _zero_adapter(base, path):
    from peft import LoraConfig, get_peft_model

    from molrl.models import load_model

    model = get_peft_model(load_model(str(base)), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                             task_type="CAUSAL_LM"))
    model.save_pretrained(path)  # lora_B = 0: the adapter leaves the base as it is
    return path


def test_a_teacher_equal_to_the_student_leaves_the_policy_unchanged(tmp_path):
    from safetensors.torch import load_file

    from molrl.rl.run import run_rl

    base = save_tiny_model(tmp_path / "base")
    # at the start the policy is its base (fresh LoRA, B = 0), and so is this teacher: A_t = 0 on every token
    cfg = toy_config(tmp_path / "run", base, algorithm="opd", max_steps=2, max_new_tokens=6,
                     opd=OpdSettings(teacher="model", teacher_model=_zero_adapter(base, tmp_path / "teacher")))
    out = run_rl(cfg)
    weights = load_file(out / "adapter" / "adapter_model.safetensors")
    lora_b = [w for name, w in weights.items() if "lora_B" in name]
    assert lora_b and all(torch.count_nonzero(w) == 0 for w in lora_b)  # no update: the step was a no-op
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "opd/advantage" in line]
    assert len(rows) == 2 and all(abs(r["opd/advantage"]) < 1e-6 for r in rows)


def test_feedback_teacher_run_trains_and_logs_the_distillation_terms(tmp_path):
    from safetensors.torch import load_file

    from molrl.rl.run import run_rl

    base = save_tiny_model(tmp_path / "base")
    out = run_rl(toy_config(tmp_path / "run", base, algorithm="opd", max_steps=2, max_new_tokens=6,
                            opd=OpdSettings(teacher="feedback", lam=1.25)))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "opd/advantage" in line]
    assert len(rows) == 2
    # the teacher reads another context than the student, so it disagrees with it and the policy moves
    assert all(r["opd/teacher_minus_reference"] != 0 for r in rows)
    weights = load_file(out / "adapter" / "adapter_model.safetensors")
    assert any(torch.count_nonzero(w) > 0 for name, w in weights.items() if "lora_B" in name)
    assert not any("teacher" in name or "opd_reference" in name for name in weights)


def test_opd_refuses_a_second_kl_term():
    from molrl.rl.config import RlConfig

    with pytest.raises(ValueError, match="set beta=0"):
        RlConfig(algorithm="opd", beta=0.04)
    with pytest.raises(ValueError, match="opd.teacher_model"):
        RlConfig(algorithm="opd", opd=OpdSettings(teacher="model"))


def test_the_feedback_teacher_reads_the_probes_output_before_the_verdict():
    task = Task(id="rule/478", prompt="What is f(478)?", kind="math", answer="3", probe="print('f(478) =', f(478))")
    probe = {"status": "ok", "exit_code": 0, "stdout": "f(478) = 3\n", "stderr": "", "truncated": False,
             "duration_s": 0.01, "error": None}
    messages = teacher_messages(task, task.prompt, "Output:\nf(478) = 5\n\\boxed{5}", Grade(0.0, False, "wrong"),
                                "feedback", probe)
    assert messages[2] == {"role": "tool", "content": "Output:\nf(478) = 3\n\nYour answer is wrong."}


def test_demo_rule_tasks_carry_a_probe_that_prints_their_answer(tmp_path):
    from molrl.demo.run import write_world
    from molrl.demo.world import WorldConfig, build_world
    from molrl.graders.code import program_for
    from molrl.sandbox import SandboxConfig, SandboxPool
    from molrl.tasks import JsonlSpec, load_tasks

    cfg = WorldConfig(train_problems=6, heldout_problems=2, general_train=4, general_eval=2)
    write_world(build_world(cfg), cfg, tmp_path)
    tasks = load_tasks(tmp_path / "rl_train.jsonl", "jsonl", spec=JsonlSpec(kind="math"))
    with SandboxPool(SandboxConfig(workers=1)) as pool:
        results = pool.run_many([program_for(t.probe, t) for t in tasks])
    for task, result in zip(tasks, results):
        call = task.prompt.removeprefix("What is ").removesuffix("?")
        assert result.stdout == f"{call} = {task.answer}\n", task.id


@pytest.mark.parametrize("lam", ["-1", "0"])
def test_opd_lambda_at_or_below_zero_is_refused_with_the_valid_range(lam):
    # lambda <= 0 distils away from the teacher (or ignores it): refused when the config loads
    from molrl.config import ConfigError, load_config
    from molrl.rl.config import RlConfig

    with pytest.raises(ConfigError, match=rf"opd.lam={float(lam)} is out of range; allowed: a number in \(0, "):
        load_config(RlConfig, None, ["algorithm=opd", f"opd.lam={lam}"])
    assert load_config(RlConfig, None, ["algorithm=opd", "opd.lam=1.25"]).opd.lam == 1.25


def _full_model(path, seed):
    """A tiny full model saved on disk (not an adapter), with its own random weights."""
    from molrl.tiny import build_tiny_pair

    model, tok = build_tiny_pair("chatml", seed=seed, initializer_range=0.1)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _opd_rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "opd/advantage" in line]


def test_a_full_model_teacher_and_a_full_model_reference_run(tmp_path):
    # the paper's main setting: a separate (here: other) teacher model, and the teacher's own base as reference
    from molrl.rl.run import run_rl

    base = save_tiny_model(tmp_path / "base")
    teacher = _full_model(tmp_path / "teacher", seed=3)
    reference = _full_model(tmp_path / "reference", seed=4)
    out = run_rl(toy_config(tmp_path / "run", base, algorithm="opd", max_steps=2, max_new_tokens=6,
                            opd=OpdSettings(teacher="model", teacher_model=teacher, reference=str(reference))))
    rows = _opd_rows(out)
    assert len(rows) == 2
    # teacher, reference and student are three different models: every log-ratio is non-zero
    assert all(r["opd/teacher_minus_reference"] != 0 and r["opd/policy_minus_reference"] != 0 for r in rows)


def test_the_students_initial_model_as_reference_is_the_starting_adapter(tmp_path):
    # a policy that starts from a MoL adapter: its initial model is base + that adapter, so at step 1
    # log pi_theta - log pi_ref is exactly 0 (where the adapter-disabled base would differ)
    from grpo_helpers import save_mol_adapter
    from molrl.rl.config import rl_lora
    from molrl.rl.run import run_rl

    base = save_tiny_model(tmp_path / "base")
    mol = save_mol_adapter(base, tmp_path / "mol")
    rows = {}
    for reference in ("student_initial", "student_base"):
        cfg = toy_config(tmp_path / reference, base, algorithm="opd", max_steps=1, max_new_tokens=6,
                         opd=OpdSettings(teacher="feedback", reference=reference))
        cfg.model = RlModelSource(str(base), adapter=mol / "adapter")
        cfg.lora = rl_lora()  # left unset: continue trains the adapter in its own shape
        rows[reference] = _opd_rows(run_rl(cfg))[0]
    assert rows["student_initial"]["opd/policy_minus_reference"] == pytest.approx(0.0, abs=1e-6)
    assert abs(rows["student_base"]["opd/policy_minus_reference"]) > 1e-3


def test_a_self_teacher_reads_the_feedback_with_the_current_policy(tmp_path):
    # SDPO: the teacher is the policy itself, in the feedback context; its log-probs differ from the
    # policy's own on the same tokens only through the context
    from molrl.rl.run import run_rl

    base = save_tiny_model(tmp_path / "base")
    out = run_rl(toy_config(tmp_path / "run", base, algorithm="opd", max_steps=2, max_new_tokens=6,
                            opd=OpdSettings(teacher="feedback", teacher_weights="current")))
    rows = _opd_rows(out)
    assert len(rows) == 2 and all(r["opd/teacher_minus_reference"] != 0 for r in rows)


def test_a_self_teacher_on_the_students_own_prompt_gives_zero_advantage(tmp_path):
    # the control: the current policy as teacher, reading exactly the student's prompt, is the student:
    # A_t = (log pi_theta - log pi_ref) - (log pi_theta - log pi_ref) = 0 on every token, so nothing moves
    from safetensors.torch import load_file

    from molrl.rl.run import run_rl

    base = save_tiny_model(tmp_path / "base")
    out = run_rl(toy_config(tmp_path / "run", base, algorithm="opd", max_steps=2, max_new_tokens=6,
                            opd=OpdSettings(teacher="model", teacher_weights="current")))
    assert all(abs(r["opd/advantage"]) < 1e-6 for r in _opd_rows(out))
    weights = load_file(out / "adapter" / "adapter_model.safetensors")
    assert all(torch.count_nonzero(w) == 0 for name, w in weights.items() if "lora_B" in name)
