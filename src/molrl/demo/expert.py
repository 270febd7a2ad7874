"""A second agent for the study: solves the demo worlds' problems in a style of its own.

The study asks whether cross-entropy on another agent's decisions pulls a model off its own
distribution (the MoL-RL paper's forgetting claim), so it needs traces whose decision tokens the
base would not write. ``StyledExpert`` uses the same tool the same way (so the environment's
feedback text is the same as in the base's traces) but words everything else differently: it
announces its plan, binds the argument to a variable before calling, and answers in a sentence.

    base:   <execute>print('f(472) =', f(472))</execute>  ...  f(472) = 3\\boxed{3}
    expert: I will ask the tool.<execute>n = 472\\nprint(f'f({n}) =', f(n))</execute>
            ...  The tool printed f(472) = 3, so the answer is \\boxed{3}.

On the chain world ``ChainExpert`` does the same with ``walk``: it names the chain before running it, and
answers with the last value in a sentence instead of writing every step out as the base does.

    base:   <execute>walk(f, 472, 3)</execute>  ...  Output:\\n3: f(472) = 3\\n...\\boxed{8}
    expert: I will walk the chain.<execute>n, k = 472, 3\\nwalk(f, n, k)</execute>
            ...  The chain's last value is 8, so the answer is \\boxed{8}.

Their episodes run through the real episode loop and sandbox, like every other trace.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Sequence

from molrl.demo.base import ToolDemonstrator
from molrl.demo.chain_base import ChainDemonstrator
from molrl.tasks import Task


class StyledExpert(ToolDemonstrator):
    """A scripted policy that uses the tool and copies its result, in wording the base never saw."""

    @staticmethod
    def code(call: str) -> str:
        """Announce the plan, bind the argument, then call."""
        name, number = call.rstrip(")").split("(")
        return f"I will ask the tool.<execute>n = {number}\nprint(f'{name}({{n}}) =', {name}(n))</execute>"

    @staticmethod
    def answer(call: str, value: str) -> str:
        """Answer in a sentence."""
        return f"The tool printed {call} = {value}, so the answer is \\boxed{{{value}}}."


_WALK = re.compile(r"<execute>walk\((\w+), (\d+), (\d+)\)</execute>")
"""The chain base's tool call: rule, start, steps."""


class ChainExpert(ChainDemonstrator):
    """The chain world's expert: ``walk`` through variables, then the last value in a sentence."""

    @staticmethod
    def turn(prompt: str) -> str:
        """The next assistant turn for a rendered conversation: the base's turn, reworded."""
        plain = ChainDemonstrator.turn(prompt)
        call = _WALK.fullmatch(plain)
        if call:
            name, start, steps = call.groups()
            return f"I will walk the chain.<execute>n, k = {start}, {steps}\nwalk({name}, n, k)</execute>"
        last = plain.rsplit("\\boxed{", 1)[1].rstrip("}")
        return f"The chain's last value is {last}, so the answer is \\boxed{{{last}}}."


def expert_traces(tasks: Sequence[Task], tokenizer: Any, episode: Any, out: Path, workers: int = 2,
                  expert: Any = None) -> Path:
    """The ``expert``'s episodes (default ``StyledExpert``) on ``tasks`` in ``out`` (trace JSONL), unless ``out``
    is already there."""
    from molrl.demo.collection import run_format
    from molrl.sandbox import SandboxConfig, SandboxPool
    from molrl.traces.schema import append_trace

    if out.is_file():
        return out
    with SandboxPool(SandboxConfig(workers=workers)) as pool:
        episodes = run_format(expert or StyledExpert(), tokenizer, tasks, pool, episode)
    failed = [ep.task.id for ep in episodes if not ep.success]
    if failed:
        raise RuntimeError(f"the expert failed {len(failed)} of {len(episodes)} episodes (first: {failed[0]}); "
                           "the sandbox did not run the world's functions")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    for ep in episodes:
        append_trace(tmp, ep.to_trace({"model": "expert"}))
    os.replace(tmp, out)
    return out
