"""The chain world's base model: the demo's tiny Qwen3, trained on the chain world's text.

Like the digit world's base (``molrl.demo.base``), it learns everything it reads except the secret
rule's values, here at every step of every chain. Its data:

- tool-use episodes through the real episode loop and sandbox (``ChainDemonstrator``: run
  ``walk(f, 472, 12)``, then answer with the printed steps and the boxed last value), on the
  training problems and on general ones;
- the feedback teacher's view: a direct attempt, then the environment's feedback on it (the
  probe's output and the verdict, rendered by the same providers on-policy distillation uses),
  then the answer in the direct format, copying the feedback's steps. This is how a model that
  reads feedback answers, in the student's own answer format;
- direct single-turn answers, posed as evaluation poses them, on rule and general problems.

Every rule episode and attempt runs in a decoy world, its own random permutation for ``f``
(``molrl.demo.chain.decoy``), so the base learns to read and copy ``f``'s values but never sees the
secret ones. On top of that, each value of ``f`` the base states on its own (in a direct answer or
an attempt) is trained towards a uniform guess over the digits, so at every rule step the base is
unsure; the values an answer copies from feedback before it are learned (``chain_example``). The
general rules' values are learned everywhere. The long world's base (``molrl demo --world long``) also
weights the copied values (``BaseModelConfig.copy_weight``), trains nothing at an attempt's values
(``attempt_values``: the teacher reads past its attempt to the feedback), learns a value stated a
second time as a copy (``repeat_values``), guesses over the nine digits a step can map to
(``guess_others``) and draws its decoy problems' starts and lengths afresh (``fresh_decoys``: a
training start never tells the chain's length), so that it reads long feedback.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from molrl.demo.base import made_before, train_base, write_making_time
from molrl.demo.base_fit import BaseExample
from molrl.demo.chain import QUESTION, ChainWorldConfig, decoy_at, decoy_keys, fresh_problems, solution_text, walk_output
from molrl.demo.world import World
from molrl.engines.generation import SamplingConfig
from molrl.tasks import Task
from molrl.traces.schema import Trace
from molrl.records.writes import write_text

log = logging.getLogger(__name__)

_OUTPUT = re.compile(r"Output:\n((?:\d+: \w\(\d+\) = \d+\n?)+)")
"""The tool's printed steps in a rendered conversation, whatever the chat template wraps tool messages in."""
RULE_VALUE = re.compile(r"\bf\(\d+\) = (\d)")
"""A step of the secret rule; group 1 is its value."""
RULE_STEP = re.compile(r"\bf\((\d+)\) = (\d)")
"""A step of the secret rule; group 1 is its input, group 2 its value."""


class ChainDemonstrator:
    """A scripted policy for the episode loop: run ``walk`` on the asked chain, then answer with its output.

    It reads only the rendered conversation, like a model: with no tool output yet it writes the
    code; after an output it answers with the steps printed and the boxed last value.
    """

    def generate(self, prompts: Sequence[str], sampling: SamplingConfig) -> list[list[str]]:
        """One scripted turn per prompt (``sampling`` is ignored: the policy is deterministic)."""
        return [[self.turn(p)] for p in prompts]

    @staticmethod
    def turn(prompt: str) -> str:
        """The next assistant turn for a rendered conversation."""
        outputs = _OUTPUT.findall(prompt)
        if outputs:
            return solution_text(outputs[-1])
        questions = QUESTION.findall(prompt)
        if not questions:
            raise ValueError(f"no 'What is g^k(n)?' question in prompt: {prompt[-200:]!r}")
        name, steps, start = questions[-1]
        return f"<execute>walk({name}, {start}, {steps})</execute>"


def direct_solution(task: Task, key: str) -> str:
    """The direct answer to chain problem ``task`` when ``f`` is ``key`` (the public rules ignore it)."""
    name = task.prompt[len("What is "):].split("^")[0]
    return solution_text(walk_output(name, key, task.meta["input"], task.meta["steps"]))


def demonstration_traces(tasks: Sequence[Task], tokenizer: Any, episode: Any, pool: Any) -> list[Trace]:
    """Tool-use episodes of ``ChainDemonstrator`` on ``tasks``, through the real episode loop and sandbox."""
    from molrl.demo.collection import run_format

    episodes = run_format(ChainDemonstrator(), tokenizer, tasks, pool, episode)
    failed = [ep.task.id for ep in episodes if not ep.success]
    if failed:
        raise RuntimeError(f"the chain demonstrator failed {len(failed)} episodes (first: {failed[0]}); "
                           "the sandbox did not run the world's functions")
    return [ep.to_trace({"model": "demonstrator"}) for ep in episodes]


def teacher_traces(attempts: Sequence[Task], hinted: Sequence[Task], pool: Any,
                   math_prompt: str | None = None) -> list[Trace]:
    """The feedback teacher's view, then its answer: attempt ``attempts[i]``, feedback on ``hinted[i]``, the copy.

    ``attempts[i]`` and ``hinted[i]`` are one problem in two decoy worlds: the attempt states the first's
    chain, the feedback (the probe's output run in the sandbox, and the verdict on the attempt) shows the
    second's, and the answer copies the feedback in the direct format.
    """
    from molrl.episode.environment import exec_record
    from molrl.episode.feedback import (ExecutionFeedback, Observation, TestFeedback, VerdictFeedback,
                                        render_feedback)
    from molrl.graders.code import program_for
    from molrl.tasks.prompts import MATH_INSTRUCTION, user_message

    results = pool.run_many([program_for(t.probe, t) for t in hinted])
    providers = [ExecutionFeedback(), TestFeedback(), VerdictFeedback()]
    traces = []
    for attempt, task, result in zip(attempts, hinted, results):
        if result.status != "ok":
            raise RuntimeError(f"the probe of {task.id} did not run in the sandbox: {result.status}")
        tried = direct_solution(attempt, attempt.meta["decoy_key"])
        obs = Observation(action="solution", exec=exec_record(result), verdict=attempt.answer == task.answer,
                          final=True)
        feedback, _ = render_feedback(providers, task, obs, [])
        messages = [{"role": "user", "content": user_message(task, math_template=math_prompt or MATH_INSTRUCTION)},
                    {"role": "assistant", "content": tried}, {"role": "tool", "content": feedback},
                    {"role": "assistant", "content": solution_text(result.stdout)}]
        traces.append(Trace(messages=messages, meta={"source": "demo", "kind": "domain", "task_id": task.id,
                                                     "success": True}))
    return traces


def direct_traces(tasks: Sequence[Task], keys: Sequence[str] | None = None, kind: str = "general",
                  math_prompt: str | None = None) -> list[Trace]:
    """Single-turn conversations answering ``tasks`` directly (``f`` through ``keys[i]``), posed as evaluation does."""
    from molrl.tasks.prompts import MATH_INSTRUCTION, user_message

    keys = keys or [""] * len(tasks)
    return [Trace(messages=[{"role": "user", "content": user_message(t, math_template=math_prompt or MATH_INSTRUCTION)},
                            {"role": "assistant", "content": direct_solution(t, key)}],
                  meta={"source": "demo", "kind": kind, "task_id": t.id, "success": True})
            for t, key in zip(tasks, keys)]


def chain_example(example: Any, trace: Trace, tokenizer: Any, learn_feedback: bool = True,
                  attempt_values: str = "unsure", repeat_values: bool = False,
                  guess_others: bool = False) -> BaseExample:
    """What the base trains on in ``example`` (a tokenised ``trace``): every token but the values of ``f`` it states.

    A value of ``f`` that an assistant turn states without feedback before it (a direct answer, an
    attempt) is trained towards a uniform guess over the digits; one in a turn after feedback showing
    the steps (``Output:``) is a copy and is learned, and marked in ``copy_mask``. With
    ``attempt_values="context"`` an attempt's values (a turn followed by feedback) train nothing; with
    ``repeat_values`` a value a turn states again (the same last digit) is learned as a copy; with
    ``guess_others`` the uniform guess leaves out the step's input digit (no rule maps a digit to itself). The
    environment's text is learned whole: its values of ``f`` are a decoy world's, so the base learns
    that a rule stays the same within one output, not the secret rule. ``learn_feedback`` is accepted
    for ``train_base``; the chain base always learns the environment's text.
    """
    if attempt_values not in ("unsure", "context"):
        raise ValueError(f"attempt_values must be 'unsure' or 'context', not {attempt_values!r}")
    from molrl.chat import render

    text = render(tokenizer, trace.messages, enable_thinking=True)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if list(enc["input_ids"]) != list(example.input_ids):
        raise ValueError(f"trace {trace.meta.get('task_id')}: rendering differs from its tokenisation")
    learn = [d or f for d, f in zip(example.decision_mask, example.feedback_mask)]
    unsure_chars: dict[tuple[int, int], str] = {}  # each unsure value's characters: its input's last digit
    copied_chars: list[tuple[int, int]] = []
    context_chars: list[tuple[int, int]] = []
    start, hinted = 0, False
    for i, message in enumerate(trace.messages):
        at = text.index(message["content"], start)
        start = at + len(message["content"])
        if message["role"] == "assistant":
            attempt = not hinted and any(m["role"] == "tool" for m in trace.messages[i + 1:])
            stated: set[str] = set()  # last digits whose f this turn has stated
            for m in RULE_STEP.finditer(message["content"]):
                value = (at + m.start(2), at + m.end(2))
                known = hinted or (repeat_values and m.group(1)[-1] in stated)
                if attempt and attempt_values == "context":
                    context_chars.append(value)
                elif known:
                    copied_chars.append(value)
                else:
                    unsure_chars[value] = m.group(1)[-1]
                stated.add(m.group(1)[-1])
        hinted = hinted or (message["role"] == "tool" and message["content"].startswith("Output:"))
    inputs = _covering(enc["offset_mapping"], unsure_chars)  # per token: its unsure value's input digit, or None
    unsure = [d is not None for d in inputs]
    learn = [m and not u and not c for m, u, c in zip(learn, unsure, _covered(enc["offset_mapping"], context_chars))]
    copied = [m and c for m, c in zip(learn, _covered(enc["offset_mapping"], copied_chars))]
    excluded = [-1 if d is None else tokenizer.convert_tokens_to_ids(d) for d in inputs] if guess_others else None
    return BaseExample(list(example.input_ids), learn, unsure, copied, excluded)


def _covering(offsets: Sequence[tuple[int, int]], spans: dict[tuple[int, int], Any]) -> list[Any]:
    """For each token's character span in ``offsets``, the value of the first of ``spans`` it overlaps, or None."""
    return [next((v for (begin, end), v in spans.items() if a < end and b > begin), None) for a, b in offsets]


def _covered(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[bool]:
    """For each token's character span in ``offsets``, whether it overlaps one of ``spans``."""
    return [v is not None for v in _covering(offsets, dict.fromkeys(spans, True))]


def chain_base_traces(world: World, seed: int, tokenizer: Any, episode: Any, pool: Any,
                      math_prompt: str | None = None, general_demos: int | None = None,
                      teacher_rounds: int = 2, fresh: ChainWorldConfig | None = None) -> list[Trace]:
    """Everything the chain base trains on (see the module docstring), its decoy worlds drawn from ``seed``.

    ``teacher_rounds``: feedback-teacher conversations per training problem, each in other decoy worlds;
    ``general_demos``: the general problems with a tool-use episode (None: as many as there are rule
    problems). The decoy problems are the training
    problems in other worlds, or with ``fresh`` (the world's config) problems of their own shape each
    (``molrl.demo.chain.fresh_problems``), never starting from a held-out start.
    """
    rule = world.rule_train
    keys = iter(decoy_keys(seed, (2 + 2 * teacher_rounds) * len(rule)))
    if fresh is None:
        shapes = [(t.meta["input"], t.meta["steps"]) for t in rule] * (2 + teacher_rounds)
    else:
        avoid = {t.meta["input"] for t in world.rule_heldout}
        shapes = fresh_problems(fresh, avoid, (2 + teacher_rounds) * len(rule), seed)
    problems = iter(shapes)
    demo_tasks = [decoy_at(*next(problems), next(keys)) for _ in rule]
    direct = [decoy_at(*next(problems), next(keys)) for _ in rule]
    asked = [next(problems) for _ in range(teacher_rounds) for _ in rule]  # one problem, two decoy worlds each
    attempts = [decoy_at(*shape, next(keys)) for shape in asked]
    hinted = [decoy_at(*shape, next(keys)) for shape in asked]
    general_demos = len(rule) if general_demos is None else general_demos
    return [
        *demonstration_traces([*demo_tasks, *world.general_train[:general_demos]], tokenizer, episode, pool),
        *teacher_traces(attempts, hinted, pool, math_prompt),
        *direct_traces(direct, [t.meta["decoy_key"] for t in direct], kind="domain", math_prompt=math_prompt),
        *direct_traces(world.general_train, math_prompt=math_prompt),
    ]


def build_chain_base(world: World, preset: Any, base_dir: Path, episode: Any, math_prompt: str | None = None) -> Path:
    """The trained chain base in ``base_dir`` (trained now unless one of the same world and settings is there)."""
    from molrl.sandbox import SandboxConfig, SandboxPool
    from molrl.tiny import build_tiny_tokenizer

    marker = base_dir / "DONE"
    made_of = {"world": asdict(preset.world), "base": asdict(preset.base), "episode": episode.key(),
               "math_prompt": math_prompt}
    if made_before(marker, made_of):
        log.info("%s: base model already trained, reused", base_dir)
        return base_dir
    started = time.time()
    with SandboxPool(SandboxConfig(workers=2)) as pool:
        traces = chain_base_traces(world, preset.world.seed, build_tiny_tokenizer("chatml"), episode, pool, math_prompt,
                                   teacher_rounds=preset.base.teacher_rounds,
                                   fresh=preset.world if preset.base.fresh_decoys else None)
    make_example = functools.partial(chain_example, attempt_values=preset.base.attempt_values,
                                     repeat_values=preset.base.repeat_values, guess_others=preset.base.guess_others)
    train_base(traces, preset.base, base_dir, make_example=make_example)
    write_text(marker, json.dumps(made_of))
    write_making_time(base_dir, time.time() - started)
    return base_dir
