"""What a model knows of a library world's library, probed one function at a time without running anything.

Three probes, each a choice among a function's behaviours (``molrl.demo.library.QUIRKS``), scored by the model's
likelihood of each candidate, so they measure knowledge without sampling noise. A probe's figure is the share the
true candidate takes among them: of the candidates' whole probability (``behaviour_share`` of summed
log-likelihoods, the chance the model, made to pick one, picks the truth), and, beside it (``per_token``), of their
mean log-likelihood per token, which discounts length but dilutes a one-token difference over a long answer: two
solutions that differ in ``// 100`` against ``// 1000`` share every other token, so the per-token share of even a
sure model stays near a guess.

- **feedback** (what MoL's cross-entropy trains): for each function, the demonstrator's episode up to its probe of
  that function, then the output the probe would print under each behaviour (run in the sandbox against the world's
  library with that one function changed).
- **answer** (what single-turn evaluation needs): for each function, single-function tasks on held-out twists
  (texts no training task has), each answered with the function written for each behaviour; the share of
  probability on the answer the world's behaviour calls for, and how often it is the likeliest (``argmax``).
- **in context** (the control): the demonstrator's episode up to the true probe output, then the solution written
  for each behaviour: whether the model turns feedback it can see into code.

A base that guesses gives each behaviour its share (1/3, or 1/2 for ``ship``); a model that has absorbed the world's
library puts more on the truth. Both probes use the world's own items and tables, so they change only with what
the model knows.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any, Sequence

import torch

from molrl.demo.library import (FAMILIES, QUIRKS, TWISTS, LibraryWorld, Quirks, library_source, library_task,
                                solution_code)
from molrl.tasks import Task

PROBE_TWISTS = 3
"""Held-out twists of the answer probe's tasks, per function."""


def behaviour_share(logps: Sequence[float], true: int) -> float:
    """The probability of candidate ``true`` among candidates of summed log-likelihood ``logps`` (a softmax).

    >>> round(behaviour_share([math.log(0.2), math.log(0.6)], 1), 6)
    0.75
    >>> behaviour_share([-3.0, -3.0, -3.0], 0) == 1 / 3
    True
    """
    top = max(logps)
    weights = [math.exp(x - top) for x in logps]
    return weights[true] / sum(weights)


def with_behaviour(world: LibraryWorld, family: str, member: Any) -> tuple[Quirks, str]:
    """The world's quirks and library source with ``family``'s behaviour set to ``member`` (prices rescaled to the
    unit, so their digit count tells it as the world's do)."""
    q = world.quirks.with_(family, member)
    prices = {i: p // world.quirks.scale * q.scale + p % world.quirks.scale % q.scale for i, p in world.prices.items()}
    prices = {i: p if p % q.scale else p + 1 for i, p in prices.items()}  # never a whole number of units
    return q, library_source(q, prices, world.stock, world.weights, world.ship_rates, world.items)


def sequence_logp(model: Any, tokenizer: Any, trace: Any, target: str = "feedback") -> tuple[float, int]:
    """(summed log-likelihood under ``model``, token count) of ``trace``'s last message (``target``: the feedback or
    the decision mask of ``molrl.traces.tokenize``, its last run: the message and its end-of-turn token)."""
    from molrl.divergence import token_logps
    from molrl.traces.tokenize import TokenizeConfig, tokenize_trace

    tok = tokenize_trace(trace, tokenizer, TokenizeConfig(max_length=None, require_feedback=False,
                                                          require_decision=False))
    mask = tok.feedback_mask if target == "feedback" else tok.decision_mask
    last = max(i for i, m in enumerate(mask) if m)
    start = last
    while start > 0 and mask[start - 1]:
        start -= 1  # the last message's run of tokens
    ids = torch.tensor([tok.input_ids])
    keep = torch.zeros_like(ids, dtype=torch.bool)
    keep[0, start:last + 1] = True
    with torch.no_grad():
        logits = model(ids).logits.float()
    return float(token_logps(logits[:, :-1], ids[:, 1:], keep[:, 1:]).sum()), last + 1 - start


def per_token(scored: tuple[float, int]) -> float:
    """Mean log-likelihood per token of a ``sequence_logp`` result.

    >>> per_token((-6.0, 3))
    -2.0
    """
    total, count = scored
    return total / count


def feedback_candidates(world: LibraryWorld, tokenizer: Any, episode: Any, pool: Any) -> dict[str, list]:
    """Per function: the demonstrator's conversations up to that function's probe output, one per behaviour (the
    world's first), run through the real episode loop against the world's library with the behaviour changed."""
    from molrl.demo.collection import run_format
    from molrl.demo.library_base import LibraryDemonstrator

    singles: dict[str, Task] = {}
    for t in world.train:  # each function's first single-function task
        if "+" not in t.meta["family"]:
            singles.setdefault(t.meta["family"], t)
    tasks, keys = [], []
    for family in FAMILIES:
        for member in world.quirks.truth_first(family):
            _, source = with_behaviour(world, family, member)
            tasks.append(replace(singles[family], preamble=source))
            keys.append(family)
    episodes = run_format(LibraryDemonstrator(), tokenizer, tasks, pool, episode)
    out: dict[str, list] = {f: [] for f in FAMILIES}
    for family, ep in zip(keys, episodes):
        trace = ep.to_trace({})
        first_tool = next(i for i, m in enumerate(trace.messages) if m["role"] == "tool")
        out[family].append(replace(trace, messages=trace.messages[: first_tool + 1]))
    return out


def in_context_candidates(world: LibraryWorld, feedback: dict[str, list]) -> dict[str, list]:
    """Per function: the demonstrator's conversation up to the true probe output (``feedback_candidates``' first),
    then a submitted solution written for each behaviour (the world's first): whether a model turns the feedback in
    its context into code."""
    out: dict[str, list] = {}
    for family in FAMILIES:
        seen = feedback[family][0]
        twist = next(t.meta["twist"] for t in world.train if t.meta["family"] == family)
        out[family] = [replace(seen, messages=[*seen.messages, {"role": "assistant", "content": "<solution>\n"
                       f"{solution_code([family], twist, world.quirks.with_(family, m))}</solution>"}])
                       for m in world.quirks.truth_first(family)]
    return out


def answer_candidates(world: LibraryWorld, code_prompt: str | None = None) -> dict[str, list[list[Any]]]:
    """Per function: for each of ``PROBE_TWISTS`` held-out twists, single-turn conversations answering the
    single-function task with the function written for each behaviour (the world's first)."""
    from molrl.demo.library_base import direct_code_traces

    rng = random.Random(world.quirks.key())
    out: dict[str, list[list[Any]]] = {}
    for family in FAMILIES:
        groups = []
        for t in range(PROBE_TWISTS):
            task = library_task(world, (family,), len(TWISTS) + t, world.items, 1, rng, "probe")
            codes = [solution_code([family], task.meta["twist"], world.quirks.with_(family, m))
                     for m in world.quirks.truth_first(family)]
            groups.append(direct_code_traces([replace(task, reference=code) for code in codes], code_prompt))
        out[family] = groups
    return out


def shares(scored: Sequence[tuple[float, int]]) -> tuple[float, float]:
    """(share of the whole probability, share by mean log-likelihood per token) of the first of ``scored``
    candidates (``sequence_logp`` results).

    >>> round(shares([(math.log(0.3), 3), (math.log(0.1), 1)])[0], 9)
    0.75
    """
    return behaviour_share([s for s, _ in scored], 0), behaviour_share([per_token(s) for s in scored], 0)


def probe_library(model: Any, tokenizer: Any, world: LibraryWorld, episode: Any, pool: Any,
                  code_prompt: str | None = None) -> dict[str, Any]:
    """The probes of ``model`` on ``world``'s library: per function, ``feedback`` (P(true output)), ``answer``
    (mean P(true answer) over the probe's tasks), ``answer_argmax`` (share of tasks where it is the likeliest),
    ``answer_in_context`` (P(true solution) submitted after the true probe output: the control that says whether
    the model turns feedback it can see into code), ``guess`` (1 / the function's behaviours) and ``per_token``
    (the same shares by mean log-likelihood per token); ``mean`` over the functions. What tells is a share's change
    from the base's."""
    model.eval()
    feedback = feedback_candidates(world, tokenizer, episode, pool)
    answers = answer_candidates(world, code_prompt)
    in_context = in_context_candidates(world, feedback)
    out: dict[str, Any] = {}
    for family in FAMILIES:
        fb = shares([sequence_logp(model, tokenizer, t) for t in feedback[family]])
        read = shares([sequence_logp(model, tokenizer, t, target="decision") for t in in_context[family]])
        answer, tops = [], []
        for group in answers[family]:
            scored = [sequence_logp(model, tokenizer, t, target="decision") for t in group]
            answer.append(shares(scored))
            tops.append(float(max(range(len(scored)), key=lambda i: scored[i][0]) == 0))
        mean_answer = [sum(a[k] for a in answer) / len(answer) for k in (0, 1)]
        out[family] = {"feedback": fb[0], "answer": mean_answer[0], "answer_argmax": sum(tops) / len(tops),
                       "answer_in_context": read[0], "guess": 1 / len(QUIRKS[family]),
                       "per_token": {"feedback": fb[1], "answer": mean_answer[1], "answer_in_context": read[1]}}
    out["mean"] = {k: sum(out[f][k] for f in FAMILIES) / len(FAMILIES) for k in out[FAMILIES[0]] if k != "per_token"}
    out["mean"]["per_token"] = {k: sum(out[f]["per_token"][k] for f in FAMILIES) / len(FAMILIES)
                                for k in out[FAMILIES[0]]["per_token"]}
    return out
