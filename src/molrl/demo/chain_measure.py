"""The chain world's measured properties under its trained base, for the report.

- Completion lengths (tokens) of the base's own single-step answers on the held-out problems,
  sampled at GRPO's temperature, and greedy: p50, p90, max.
- The feedback teacher's accuracy: the base reads the student's attempt (its own greedy answer)
  and the environment's feedback on it (the probe's output, run in the sandbox, and the verdict,
  as on-policy distillation's feedback teacher reads them), then answers greedily. Beside it, the
  student's accuracy without the feedback.
- Entropy (nats) of the base's next-token distribution on the correct solution, teacher-forced,
  at the rule's steps (the value after ``f(n) = ``) and at every other completion token (format);
  and how many of the rule's values the feedback teacher, teacher-forced on the correct solution
  after reading the feedback, ranks first (what its per-token signal knows, beyond the boxed answer).

The maths (percentiles, the position split) is in pure functions; ``measure_world`` runs the model.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from molrl.demo.chain_base import RULE_STEP, RULE_VALUE, direct_solution
from molrl.demo.world import World
from molrl.tasks import Task
from molrl.records.writes import write_text


@dataclass
class WorldProperties:
    """What ``measure_world`` measured on the held-out problems."""

    problems: int
    """Held-out problems measured."""
    samples: int
    """Sampled completions per problem (for the sampled lengths)."""
    sampled_lengths: dict[str, float]
    """p50 / p90 / max / mean completion tokens of the base's samples at GRPO's temperature."""
    greedy_lengths: dict[str, float]
    """The same for the base's greedy answers."""
    student_accuracy: float
    """The base's greedy single-step accuracy (no feedback)."""
    teacher_accuracy: float
    """The base's greedy accuracy after reading its attempt and the environment's feedback on it."""
    rule_entropy: float
    """Mean next-token entropy (nats) at the rule's steps of the correct solutions."""
    format_entropy: float
    """Mean next-token entropy (nats) at every other completion token of the correct solutions."""
    rule_positions: int
    """Rule-step positions the entropy is averaged over."""
    format_positions: int
    """Format positions the entropy is averaged over."""
    first_rule_entropy: float = math.nan
    """Mean entropy at the rule steps that state a digit's value for the first time in the solution (a later
    step on the same digit can be a copy of it)."""
    first_rule_positions: int = 0
    """First-statement positions that entropy is averaged over."""
    teacher_step_accuracy: float = math.nan
    """Fraction of the rule's values in the correct solution that the feedback teacher, teacher-forced on that
    solution, predicts by its most likely token: what its per-token signal knows beyond the boxed answer."""
    teacher_step_positions: int = 0
    """Rule-step positions that fraction is over."""


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50, p90 (nearest rank), max and mean of ``values``.

    >>> percentiles([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    {'p50': 5, 'p90': 9, 'max': 10, 'mean': 5.5}
    """
    ordered = sorted(values)
    rank = lambda q: ordered[max(0, math.ceil(q * len(ordered)) - 1)]  # noqa: E731
    return {"p50": rank(0.5), "p90": rank(0.9), "max": ordered[-1], "mean": sum(ordered) / len(ordered)}


def rule_step_chars(completion: str) -> list[int]:
    """Character offsets of the rule's values in a completion: rule_step_chars('1: f(472) = 3\\n') == [12]."""
    return [m.start(1) for m in RULE_VALUE.finditer(completion)]


def first_statement_chars(completion: str) -> list[int]:
    """Offsets of the rule's values on a last digit the completion has not stepped from before.

    >>> first_statement_chars('3: f(472) = 3\\n2: f(3) = 2\\n1: f(2) = 3\\n')  # f(2) repeats f(472)
    [12, 24]
    """
    seen: set[str] = set()
    out = []
    for m in RULE_STEP.finditer(completion):
        if m.group(1)[-1] not in seen:
            out.append(m.start(2))
        seen.add(m.group(1)[-1])
    return out


def measure_world(world: World, base_dir: Path, world_dir: Path, cfg: Any, samples: int = 4) -> str:
    """Measure the world under the base in ``base_dir``; write ``properties.json`` in ``world_dir``; return markdown.

    ``cfg`` is the demo's pipeline config (its GRPO temperature, eval prompt and length limit are used).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    saved = world_dir / "properties.json"
    if saved.is_file():
        return properties_markdown(WorldProperties(**json.loads(saved.read_text())))
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir).eval()
    tasks = world.rule_heldout
    from molrl.eval.config import EvalConfig
    from molrl.pipeline.config import stage_config
    from molrl.rl.config import RlConfig

    evaluation = stage_config(EvalConfig, cfg.eval, {}, [], "eval")
    rl = stage_config(RlConfig, cfg.rl, {}, [], "rl", shared=True)  # the runs' shared section, read for its sampling
    settings = {"math_prompt": evaluation.math_prompt, "max_new_tokens": evaluation.sampling.max_new_tokens,
                "temperature": rl.sampling.temperature}
    with torch.no_grad():
        props = _measure(model, tokenizer, tasks, world.key, settings, samples)
    write_text(saved, json.dumps(asdict(props), indent=1))
    return properties_markdown(props)


def _measure(model: Any, tokenizer: Any, tasks: Sequence[Task], key: str, settings: dict[str, Any],
             samples: int) -> WorldProperties:
    """The measurements of ``WorldProperties`` (see the module docstring)."""
    from molrl.engines.generation import SamplingConfig, TransformersGenerator
    from molrl.graders.code import program_for
    from molrl.sandbox import SandboxConfig, SandboxPool
    from molrl.tasks.grade import grade
    from molrl.traces.spans import render_prompts

    prompts = render_prompts(tokenizer, tasks, enable_thinking=True, math_template=settings["math_prompt"])
    gen = TransformersGenerator(model, tokenizer, batch_size=64)
    limit = settings["max_new_tokens"]
    greedy = [c[0] for c in gen.generate(prompts, SamplingConfig(temperature=0.0, max_new_tokens=limit))]
    sampled = gen.generate(prompts, SamplingConfig(n=samples, temperature=settings["temperature"],
                                                   max_new_tokens=limit, seed=1))
    count = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 1  # noqa: E731  (+ EOS)
    with SandboxPool(SandboxConfig(workers=2)) as pool:
        student = grade(tasks, greedy, pool)
        probes = pool.run_many([program_for(t.probe, t) for t in tasks])
        teacher_prompts = [_teacher_prompt(tokenizer, *row, settings["math_prompt"])
                           for row in zip(tasks, greedy, student, probes)]
        taught = [c[0] for c in gen.generate(teacher_prompts, SamplingConfig(temperature=0.0, max_new_tokens=limit))]
        teacher = grade(tasks, taught, pool)
    rule, fmt, first = _entropies(model, tokenizer, tasks, prompts, key)
    steps = [hit for task, prompt in zip(tasks, teacher_prompts) for hit in _steps_ranked_first(model, tokenizer,
                                                                                              task, prompt, key)]
    return WorldProperties(
        problems=len(tasks), samples=samples,
        sampled_lengths=percentiles([count(c) for group in sampled for c in group]),
        greedy_lengths=percentiles([count(c) for c in greedy]),
        student_accuracy=sum(g.correct for g in student) / len(tasks),
        teacher_accuracy=sum(g.correct for g in teacher) / len(tasks),
        rule_entropy=sum(rule) / max(len(rule), 1), format_entropy=sum(fmt) / max(len(fmt), 1),
        rule_positions=len(rule), format_positions=len(fmt),
        first_rule_entropy=sum(first) / max(len(first), 1), first_rule_positions=len(first),
        teacher_step_accuracy=sum(steps) / max(len(steps), 1), teacher_step_positions=len(steps))


def _teacher_prompt(tokenizer: Any, task: Task, attempt: str, graded: Any, probe: Any, math_prompt: str) -> Any:
    """The feedback teacher's context for ``attempt`` (graded ``graded``): the attempt, the ``probe``'s output
    (a sandbox result) and the verdict, as on-policy distillation's feedback teacher reads them."""
    from molrl.episode.environment import exec_record
    from molrl.episode.feedback import (ExecutionFeedback, Observation, TestFeedback, VerdictFeedback,
                                        render_feedback)
    from molrl.tasks.prompts import user_message
    from molrl.traces.spans import chat_prompt

    obs = Observation(action="solution", exec=exec_record(probe), grade=graded.to_dict(), verdict=graded.correct,
                      final=True)
    feedback, _ = render_feedback([ExecutionFeedback(), TestFeedback(), VerdictFeedback()], task, obs, [])
    messages = [{"role": "user", "content": user_message(task, math_template=math_prompt)},
                {"role": "assistant", "content": attempt}, {"role": "tool", "content": feedback}]
    return chat_prompt(tokenizer, messages, enable_thinking=True)


def _entropies(model: Any, tokenizer: Any, tasks: Sequence[Task], prompts: Sequence[str],
               key: str) -> tuple[list[float], list[float], list[float]]:
    """Next-token entropies on each correct solution, teacher-forced: (at rule steps, at every other token, at
    the rule steps that state a digit's value first)."""
    rule, fmt, first = [], [], []
    for task, prompt in zip(tasks, prompts):
        solution = direct_solution(task, key)
        enc, logits = _forced(model, tokenizer, prompt, solution, [tokenizer.eos_token_id])
        logps = logits.float().log_softmax(-1)  # [C + 1, V]
        entropy = (-(logps.exp() * logps).sum(-1)).tolist()
        steps, firsts = set(rule_step_chars(solution)), set(first_statement_chars(solution))
        for (start, _), h in zip(enc["offset_mapping"] + [(-1, -1)], entropy):
            (rule if start in steps else fmt).append(h)
            if start in firsts:
                first.append(h)
    return rule, fmt, first


def _forced(model: Any, tokenizer: Any, prompt: str, solution: str, tail: Sequence[int] = ()) -> tuple[Any, Any]:
    """``solution`` (then the ``tail`` token ids) teacher-forced after ``prompt``: its encoding with character
    offsets, and the logits that predict each of its tokens and the tail's, [C + len(tail), V]."""
    import torch

    from molrl.engines.generation import prompt_ids as ids_of

    prompt_ids = ids_of(tokenizer, prompt)
    enc = tokenizer(solution, add_special_tokens=False, return_offsets_mapping=True)
    ids = torch.tensor([prompt_ids + enc["input_ids"] + list(tail)])  # [1, P + C + len(tail)]
    return enc, model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1]


def _steps_ranked_first(model: Any, tokenizer: Any, task: Task, prompt: str, key: str) -> list[bool]:
    """For each rule value of ``task``'s correct solution after ``prompt``, teacher-forced: is it the most likely token?"""
    solution = direct_solution(task, key)
    enc, logits = _forced(model, tokenizer, prompt, solution)
    ranked = logits.argmax(-1).tolist()  # [C]
    steps = set(rule_step_chars(solution))
    return [top == token for (start, _), top, token in zip(enc["offset_mapping"], ranked, enc["input_ids"])
            if start in steps]


def properties_markdown(p: WorldProperties) -> str:
    """The report's section on the world's measured properties."""
    s, g = p.sampled_lengths, p.greedy_lengths
    return "\n".join([
        "## The chain world under its base",
        "",
        f"Measured on the {p.problems} held-out problems with the trained base, before any of the pipeline.",
        "",
        "| property | value |",
        "|---|---|",
        f"| completion tokens, sampled ({p.problems} × {p.samples}) | p50 {s['p50']:.0f}, p90 {s['p90']:.0f} "
        f"({s['p90'] / s['p50']:.1f}x p50), max {s['max']:.0f}, mean {s['mean']:.1f} |",
        f"| completion tokens, greedy | p50 {g['p50']:.0f}, p90 {g['p90']:.0f}, max {g['max']:.0f} |",
        f"| accuracy without feedback (the student) | {p.student_accuracy:.3f} |",
        f"| accuracy reading the feedback (the teacher) | {p.teacher_accuracy:.3f} |",
        f"| rule values the teacher ranks first, teacher-forced ({p.teacher_step_positions} positions) | "
        f"{p.teacher_step_accuracy:.3f} |",
        f"| entropy at rule steps ({p.rule_positions} positions) | {p.rule_entropy:.3f} nats |",
        f"| entropy at rule steps on a digit first stepped from ({p.first_rule_positions} positions) | "
        f"{p.first_rule_entropy:.3f} nats |",
        f"| entropy at format tokens ({p.format_positions} positions) | {p.format_entropy:.3f} nats |",
        "",
    ])
