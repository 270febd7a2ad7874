"""The library world's base: what a model is taught before the pipeline, in decoy libraries, never the world's own.

Neither the tiny base nor a small pretrained chat model writes code against a module it has never seen
(SmolLM2-135M-Instruct passes 0 of 192 sampled library tasks, and 0 when each function's behaviour is stated in the
prompt: ``benchmarks/RESULTS.md``). So the base is taught the world's formats first, as the chain world's base is,
on text that shows every format and never the world's own library:

- tool-use episodes of ``LibraryDemonstrator`` through the real episode loop and sandbox: it probes each function
  the task uses (one ``<execute>`` block a function, on ``lib.ITEMS``), reads the printed values and tracebacks, and
  submits the function the feedback calls for;
- direct single-turn answers, posed as evaluation poses them (a ```python block);

each on a task of a **decoy library**: a library world of its own seed, with quirks drawn at random
(``decoy_tasks``). Across decoys every behaviour of every function is as likely, so the base learns to probe, read
and answer, and, answering without running code, guesses each function's behaviour from a uniform prior; the
world's own library is shown only by the pipeline's collection. Plain-Python general tasks are answered directly
(the world's own ``general_train``).
"""

from __future__ import annotations

import json
import logging
import random
import re
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from molrl.demo.library import (ENTRY, FAMILIES, QUIRKS, ALL_TWISTS, LibraryConfig, LibraryWorld, Quirks,
                                build_library_world, solution_code)
from molrl.engines.generation import SamplingConfig
from molrl.tasks import Task
from molrl.traces.schema import Trace
from molrl.records.writes import write_text

log = logging.getLogger(__name__)

_ASK = re.compile(r"The module `lib` is available: (.*?)\. Write a Python function `"
                  + ENTRY + r"\(([^)]*)\)` that returns (.*?)\.(?:\n|$|<)", re.DOTALL)
"""The task's sentence in a rendered conversation: the functions it describes, the signature, what it returns."""
_PROBED = re.compile(r"# probe (\w+)")
"""The marker each probe's code starts with."""


@dataclass
class LibraryDemos:
    """What a library world's base is taught: how many decoy tasks of each kind, and their seed."""

    tool: int = 96
    """Tool-use episodes in decoy libraries."""
    direct: int = 96
    """Direct answers in decoy libraries."""
    general: int = 96
    """Direct answers to the world's general training tasks."""
    seed: int = 0
    """Seed of the decoy libraries."""


def probe_code(family: str) -> str:
    """The code that shows one function's behaviour: on the first listed items (the second has no weight), or one
    call of ``ship`` with the item first."""
    if family == "ship":
        return "# probe ship\nprint('ship', repr(lib.ship(lib.ITEMS[0], 2)))"
    return f"# probe {family}\nfor i in lib.ITEMS[:2]:\n    print('{family}', i, repr(lib.{family}(i)))"


def read_quirks(feedback: str) -> dict[str, Any]:
    """Each probed function's behaviour as the probes' output shows it (``{family: member of QUIRKS[family]}``).

    price: the digits of a printed price (a whole unit is 1-9, so 4 digits are thousandths); stock: the printed
    value's shape; weight: ``-1`` or ``None`` printed for the unweighted item, else the KeyError it raised; ship: a
    printed cost with the item first, else the KeyError of the count where the item goes.
    """
    read: dict[str, Any] = {}
    if m := re.search(r"^price \w+ (\d+)\b", feedback, re.MULTILINE):
        read["price"] = 10 ** (len(m.group(1)) - 1)
    if m := re.search(r"^stock \w+ (\S)", feedback, re.MULTILINE):
        read["stock"] = {"'": "sentence", "{": "dict"}.get(m.group(1), "int")
    if re.search(r"^weight \w+ ", feedback, re.MULTILINE):
        m = re.search(r"^weight \w+ (-1|None)\b", feedback, re.MULTILINE)
        read["weight"] = m.group(1) if m else "KeyError"
    if "# probe ship" in feedback or re.search(r"^ship ", feedback, re.MULTILINE):
        read["ship"] = "item, n" if re.search(r"^ship \d+\b", feedback, re.MULTILINE) else "n, item"
    return read


def parse_ask(prompt: str) -> tuple[list[str], int]:
    """The families (in the prompt's order) and the twist of the task in ``prompt``."""
    m = _ASK.search(prompt)
    if m is None:
        raise ValueError(f"no library task in prompt: {prompt[-300:]!r}")
    described, _, returns = m.groups()
    families = [f for f in FAMILIES if f"`lib.{f}" in described]
    families.sort(key=lambda f: described.index(f"`lib.{f}"))
    twist = max((i for i, (say, _, _) in enumerate(ALL_TWISTS) if say and returns.startswith(say)),
                key=lambda i: len(ALL_TWISTS[i][0]), default=0)
    return families, twist


class LibraryDemonstrator:
    """A scripted policy for the episode loop: probe each function the task uses, then submit the function the
    feedback calls for. It reads only the rendered conversation, as a model would."""

    def generate(self, prompts: Sequence[str], sampling: SamplingConfig) -> list[list[str]]:
        """One scripted turn per prompt (``sampling`` is ignored: the policy is deterministic)."""
        return [[self.turn(p)] for p in prompts]

    @staticmethod
    def turn(prompt: str) -> str:
        """The next assistant turn: the next probe, or the solution once every function was probed."""
        families, twist = parse_ask(prompt)
        probed = set(_PROBED.findall(prompt))
        for family in families:
            if family not in probed:
                return f"<execute>\n{probe_code(family)}\n</execute>"
        read = read_quirks(prompt)
        missing = [f for f in families if f not in read]
        if missing:
            raise ValueError(f"the probes' output does not show {missing}: {prompt[-400:]!r}")
        fill = {f: QUIRKS[f][0] for f in FAMILIES}
        quirks = Quirks(scale=read.get("price", fill["price"]), stock_shape=read.get("stock", fill["stock"]),
                        missing=read.get("weight", fill["weight"]), ship_order=read.get("ship", fill["ship"]))
        return f"<solution>\n{solution_code(families, twist, quirks)}</solution>"


def decoy_tasks(count: int, seed: int, cfg: LibraryConfig) -> list[Task]:
    """``count`` training tasks, each from a decoy library world of its own (seeds drawn from ``seed``, far from
    the demo's world seeds), spread evenly over the task families and twists."""
    rng = random.Random(seed)
    small = replace(cfg, general_train=0, general_eval=0)
    tasks = []
    for i in range(count):
        world = build_library_world(replace(small, seed=1_000_000 + rng.randrange(10**9)))
        by_family: dict[str, list[Task]] = {}
        for t in world.train:
            by_family.setdefault(t.meta["family"], []).append(t)
        families = sorted(by_family)
        group = by_family[families[i % len(families)]]
        tasks.append(group[(i // len(families)) % len(group)])
    return tasks


def code_answer(code: str) -> str:
    """A direct answer: the function in one ```python block (what evaluation's single-turn instruction asks for)."""
    return f"```python\n{code}```"


def direct_code_traces(tasks: Sequence[Task], code_prompt: str | None = None, kind: str = "general",
                       **_: Any) -> list[Trace]:
    """Single-turn conversations answering code ``tasks`` with their reference solutions, posed as evaluation poses
    them (``code_prompt``, default the single-turn instruction)."""
    from molrl.tasks.prompts import CODE_INSTRUCTION, user_message

    return [Trace(messages=[{"role": "user", "content": user_message(t, code_prompt or CODE_INSTRUCTION)},
                            {"role": "assistant", "content": code_answer(t.reference or "")}],
                  meta={"source": "demo", "kind": kind, "task_id": t.id, "success": True})
            for t in tasks]


def library_demonstrations(tasks: Sequence[Task], tokenizer: Any, episode: Any, pool: Any) -> list[Trace]:
    """``LibraryDemonstrator``'s episodes on ``tasks`` through the real episode loop and sandbox; every one must
    pass its held-back tests."""
    from molrl.demo.collection import run_format

    episodes = run_format(LibraryDemonstrator(), tokenizer, tasks, pool, episode)
    failed = [ep.task.id for ep in episodes if not ep.success]
    if failed:
        raise RuntimeError(f"the library demonstrator failed {len(failed)} of {len(episodes)} episodes (first: "
                           f"{failed[0]}); the sandbox did not run the library, or the episode's turns ran out")
    return [ep.to_trace({"model": "demonstrator"}) for ep in episodes]


def library_base_traces(world: LibraryWorld, tool_demos: int, direct_demos: int, general_direct: int, seed: int,
                        cfg: LibraryConfig, tokenizer: Any, episode: Any, pool: Any,
                        code_prompt: str | None = None) -> list[Trace]:
    """What a library world's base is taught (the module docstring): tool-use episodes and direct answers in decoy
    libraries, direct answers to the world's general training tasks."""
    decoys = decoy_tasks(tool_demos + direct_demos, seed, cfg)
    tools = library_demonstrations(decoys[:tool_demos], tokenizer, episode, pool)
    direct = direct_code_traces(decoys[tool_demos:], code_prompt, kind="domain")
    general = direct_code_traces(world.general_train[:general_direct], code_prompt)
    return [*tools, *direct, *general]


def build_library_base(world: LibraryWorld, preset: Any, base_dir: Path, episode: Any,
                       code_prompt: str | None = None) -> Path:
    """The tiny base of a library world in ``base_dir`` (trained now unless one of the same world and settings is
    there), trained from scratch on ``library_base_traces``."""
    from molrl.demo.base import made_before, train_base, write_making_time
    from molrl.sandbox import SandboxConfig, SandboxPool
    from molrl.tiny import build_tiny_tokenizer

    demos = preset.library_demos
    marker = base_dir / "DONE"
    made_of = {"world": asdict(preset.world), "base": asdict(preset.base), "demos": asdict(demos),
               "episode": episode.key(), "code_prompt": code_prompt}
    if made_before(marker, made_of):
        log.info("%s: base model already trained, reused", base_dir)
        return base_dir
    started = time.time()
    with SandboxPool(SandboxConfig(workers=2)) as pool:
        traces = library_base_traces(world, demos.tool, demos.direct, demos.general, demos.seed, preset.world,
                                     build_tiny_tokenizer("chatml"), episode, pool, code_prompt)
    train_base(traces, preset.base, base_dir)
    write_text(marker, json.dumps(made_of))
    write_making_time(base_dir, time.time() - started)
    return base_dir
