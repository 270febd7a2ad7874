"""On-policy distillation with reward extrapolation (G-OPD / ExOPD, arXiv 2602.12125).

Per token of the student's own completion, ``A_t = lam * (log pi_T - log pi_ref) - (log pi_theta - log pi_ref)``
from the teacher's, the reference's and the sampling policy's log-probs of the sampled tokens; its optimum is
pi_theta proportional to pi_T^lam * pi_ref^(1 - lam), so lam = 1 distils the teacher and lam > 1 extrapolates
past it. The teacher scores the student's tokens in its own context (``teacher_messages``): after the
environment's feedback on this very completion (``feedback``), beside the task's reference solution
(``reference``), or on the student's prompt (``model``). Aggregation: mean over the micro-batch's loss tokens.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from molrl.chat import render
from molrl.episode.environment import exec_record
from molrl.episode.feedback import ExecutionFeedback, Observation, TestFeedback, VerdictFeedback, render_feedback
from molrl.content import encode_template
from molrl.errors import MolrlError
from molrl.graders.code import program_for
from molrl.rl.algorithms.base import CURRENT, Algorithm
from molrl.rl.algorithms.grpo import dr_grpo_advantages, local_rows
from molrl.rl.batch import AdvantageInputs, pad_rows
from molrl.tasks.prompts import user_message
from molrl.task_types import Task
from molrl.traces.spans import encode_chat


def opd_advantages(teacher: torch.Tensor, reference: torch.Tensor, policy: torch.Tensor, mask: torch.Tensor,
                   lam: float) -> torch.Tensor:
    """On-policy distillation with reward extrapolation (G-OPD), per token of the student's completion: [B, T].

    ``A_t = lam * (log pi_T(y_t) - log pi_ref(y_t)) - (log pi_theta(y_t) - log pi_ref(y_t))`` from the
    teacher's, the reference's and the sampling policy's log-probs of the sampled tokens (each [B, T]).
    Its optimum is pi_theta proportional to pi_T^lam * pi_ref^(1 - lam): lam = 1 distils the teacher.
    """
    return (lam * (teacher - reference) - (policy - reference)) * mask


def teacher_messages(task: Task, user: str, completion: str, grade: Any, teacher: str,
                     probe: dict[str, Any] | None = None) -> list[dict[str, str]]:
    """The conversation a teacher reads before it scores the student's ``completion`` (posed by ``user``).

    feedback: the student's attempt, then the environment's feedback on it as collection writes it (the
    output of the task's probe when it has one, test results for code, the verdict), so the teacher scores
    the same completion again having seen its outcome; reference: the task with its reference solution;
    model: the student's own prompt. ``probe`` is the sandbox result of ``task.probe`` (``exec_record``).
    """
    if teacher == "feedback":
        obs = Observation(action="solution", exec=probe, grade=None if grade is None else grade.to_dict(),
                          verdict=bool(grade is not None and grade.correct), final=True)
        feedback, _ = render_feedback([ExecutionFeedback(), TestFeedback(), VerdictFeedback()], task, obs, [])
        return [{"role": "user", "content": user}, {"role": "assistant", "content": completion},
                {"role": "tool", "content": feedback}]
    if teacher == "reference":
        if not task.reference:
            raise MolrlError(f"opd.teacher=reference: task {task.id} has no reference solution; "
                             "use opd.teacher=feedback, or give the tasks a reference")
        return [{"role": "user", "content": f"{user}\n\nA reference solution:\n{task.reference}"}]
    return [{"role": "user", "content": user}]


def teacher_prefix_ids(tokenizer: Any, messages: list[dict[str, str]], enable_thinking: bool,
                       completion_ids: Sequence[int], task_id: str) -> list[int]:
    """Token ids of the teacher's context ``messages`` with the generation prompt, checked to end where the
    student's completion begins.

    Contents (the task, the attempt, the feedback) are encoded as plain text (``encode_chat``). The teacher scores
    exactly the student's tokens (``prefix_ids + completion_ids``); that is its own reading of the text only when
    tokenising the generation prompt followed by the completion does not merge tokens across the boundary;
    MolrlError otherwise, naming the task and the boundary.
    """
    prefix_ids = encode_chat(tokenizer, messages, add_generation_prompt=True, enable_thinking=enable_thinking)
    bare = render(tokenizer, messages, add_generation_prompt=False, enable_thinking=enable_thinking)
    full = render(tokenizer, messages, add_generation_prompt=True, enable_thinking=enable_thinking)
    header = full[len(bare):] if full.startswith(bare) else ""  # the generation prompt's text
    text = tokenizer.decode(list(completion_ids), skip_special_tokens=False)
    whole = encode_template(tokenizer, header + text)[0]
    if header and whole != encode_template(tokenizer, header)[0] + encode_template(tokenizer, text)[0]:
        raise MolrlError(f"opd teacher context of task {task_id}: the tokenizer merges tokens across the boundary "
                         f"{header[-20:]!r} | {text[:20]!r}, so the teacher would not score the student's tokens; "
                         "end the teacher's context (chat template, feedback) on a token boundary")
    return prefix_ids


class Opd(Algorithm):
    """On-policy distillation: the teacher's per-token log-ratio to the reference is the student's reward."""

    aggregation = "token_mean"

    def __init__(self, trainer: Any, cfg: Any):
        super().__init__(trainer, cfg)
        opd = cfg.opd
        if opd.reference == "student_initial":
            reference = self.freeze_initial("opd_reference")
        else:
            reference = self.load_frozen(None if opd.reference == "student_base" else opd.reference, "opd_reference")
        teacher = CURRENT if opd.teacher_weights == "current" else self.load_frozen(opd.teacher_model, "teacher")
        self.frozen = {"teacher": teacher, "reference": reference}
        self._probes: dict[str, dict[str, Any]] = {}  # task id -> its probe's sandbox result (probes are fixed code)

    @classmethod
    def runs_code(cls, cfg: Any, tasks: Sequence[Task]) -> bool:
        """The feedback teacher reads the sandbox output of each task's probe."""
        return cfg.opd.teacher == "feedback" and any(t.probe for t in tasks)

    def token_advantages(self, inputs: AdvantageInputs, ma_ids):
        outcome = local_rows(dr_grpo_advantages(inputs.rewards, inputs.verdicts, inputs.masks, inputs.group), inputs)
        return self.distillation_advantages(inputs) + self.cfg.opd.outcome_weight * outcome, {}

    def distillation_advantages(self, inputs: AdvantageInputs) -> torch.Tensor:
        """[B, T] ``opd_advantages`` of the batch: the teacher scores the student's tokens in its own context."""
        trainer, batch, opd = self.trainer, inputs.batch, self.cfg.opd
        mask = batch.completion_mask.float()
        policy = trainer.policy_logps(batch)
        with self.frozen_model("reference") as model:
            reference = trainer.logprobs.completion(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                                 batch.completion_mask)
        if opd.teacher == "model":
            prompt_ids, prompt_mask = batch.prompt_ids, batch.prompt_mask
        else:
            prompt_ids, prompt_mask = self.teacher_prompts(inputs)
        with self.frozen_model("teacher") as model:
            teacher = trainer.logprobs.completion(model, prompt_ids, prompt_mask, batch.completion_ids,
                                               batch.completion_mask)
        advantages = opd_advantages(teacher, reference, policy, mask, opd.lam)
        metrics, tokens = trainer.metrics(), mask.sum().clamp(min=1.0)
        metrics["opd/teacher_minus_reference"].append((((teacher - reference) * mask).sum() / tokens).item())
        metrics["opd/policy_minus_reference"].append((((policy - reference) * mask).sum() / tokens).item())
        metrics["opd/advantage"].append(((advantages * mask).sum() / tokens).item())
        return advantages

    def teacher_prompts(self, inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, mask) [B, P'] of the teacher's context of each row, left-padded."""
        cfg, trainer, batch = self.cfg, self.trainer, inputs.batch
        tokenizer = trainer.processing_class
        probes = self.probe_results(batch.tasks) if cfg.opd.teacher == "feedback" else {}
        prefixes = []
        for row, (task, completion, grade) in enumerate(zip(batch.tasks, batch.completions, inputs.scores.grades)):
            user = user_message(task, cfg.code_prompt, cfg.math_prompt)
            messages = teacher_messages(task, user, completion, grade, cfg.opd.teacher, probes.get(task.id))
            tokens = batch.completion_ids[row][batch.completion_mask[row].bool()].tolist()
            prefixes.append(teacher_prefix_ids(tokenizer, messages, cfg.thinking, tokens, task.id))
        return pad_rows(prefixes, tokenizer.pad_token_id, "left", trainer.accelerator.device)

    def probe_results(self, tasks: Sequence[Task]) -> dict[str, dict[str, Any]]:
        """The sandbox result of each task's probe, by task id (run once per task per run: a probe is fixed code)."""
        cache, pool = self._probes, self.trainer.scorer.pool
        todo = list({t.id: t for t in tasks if t.probe and t.id not in cache}.values())
        if todo:
            if pool is None:
                raise MolrlError(f"opd feedback teacher: task {todo[0].id} has a probe but the run has no sandbox pool")
            results = pool.run_many([program_for(t.probe, t) for t in todo])
            cache.update({t.id: exec_record(r) for t, r in zip(todo, results)})
        return {t.id: cache[t.id] for t in tasks if t.id in cache}
