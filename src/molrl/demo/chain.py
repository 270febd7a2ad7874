"""The chain world: variable-length solutions whose every step needs a hidden rule.

``molrl demo`` builds it with chains of 1-6 steps (the demo's default world), ``molrl demo --world
long`` with chains of 1-24 steps (long solutions with a long tail, for telling RL methods apart);
everything is generated from one seed, nothing is downloaded.

- Rule problems ("What is f^12(472)?"): apply the hidden rule ``f`` k times, starting from n.
  ``f`` maps the last digit of a number through a secret permutation of 0-9 (no digit maps to
  itself), as in the digit world, and lives only in the task's sandbox ``preamble``. A solution
  writes every step out, counting down to 1, then boxes the last value::

      Output:
      12: f(472) = 3
      11: f(3) = 9
      ...
      1: f(5) = 8
      \\boxed{8}

  so one wrong early step decides the outcome, and the reward (the boxed value) comes at the end.
  k is drawn with P(k) proportional to 1/k^tail over 1..max_steps, so lengths have a long tail.
- The environment's feedback is the same text: the probe ``walk(f, 472, 12)`` prints every step's
  true value. A model that reads it can answer; the base is trained to (``molrl.demo.chain_base``).
- General problems ("What is s^5(381)?"): the same chains over public rules the base is taught,
  ``s`` (the next digit) and ``m`` (the mirror digit, 9 - d); scoring them after training measures
  forgetting.
- Held-out rule problems start from numbers that no training problem starts from.

Problems are ordinary math ``Task`` objects graded by the shared math grader, as in the digit
world, so collection, MoL, RL and evaluation run on them unchanged.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from molrl.demo.world import World, secret_key
from molrl.tasks import Task

PUBLIC_RULES = {"s": lambda d: (d + 1) % 10, "m": lambda d: 9 - d}
"""The general problems' rules by name, as functions of the last digit."""

QUESTION = re.compile(r"What is (\w)\^(\d+)\((\d+)\)\?")
"""A chain problem's question: name, steps, start."""


@dataclass
class ChainWorldConfig:
    """The size and seed of a chain world."""

    seed: int = 0
    """Seed of the secret permutation and of every split."""
    digits: int = 3
    """Digits of the start numbers."""
    max_steps: int = 24
    """Most steps of a chain (caps the length of a solution at about 13 tokens a step)."""
    tail: float = 0.85
    """Steps k are drawn with probability proportional to 1/k^tail over 1..max_steps."""
    train_problems: int = 400
    """Rule problems in the training split (collection and RL prompts)."""
    heldout_problems: int = 100
    """Rule problems in the held-out split (start numbers never seen in training)."""
    general_train: int = 2000
    """General problems the base model is trained on."""
    general_eval: int = 100
    """General problems held out to measure forgetting."""


def step_value(name: str, key: str, n: int) -> int:
    """One step of rule ``name`` on ``n``: ``f`` through ``key``, or a public rule (``s``, ``m``) of the last digit."""
    digit = n % 10
    return int(key[digit]) if name == "f" else PUBLIC_RULES[name](digit)


def chain_lines(name: str, key: str, start: int, steps: int) -> list[tuple[int, int, int]]:
    """The chain's steps as (countdown, input, value).

    >>> chain_lines('f', '1032547698', 472, 2)
    [(2, 472, 3), (1, 3, 2)]
    """
    out, n = [], start
    for i in range(steps, 0, -1):
        value = step_value(name, key, n)
        out.append((i, n, value))
        n = value
    return out


def walk_output(name: str, key: str, start: int, steps: int) -> str:
    """What the sandbox's ``walk(name, start, steps)`` prints: one ``i: name(n) = v`` line per step."""
    return "".join(f"{i}: {name}({n}) = {v}\n" for i, n, v in chain_lines(name, key, start, steps))


def solution_text(output: str) -> str:
    """A solution in the world's answer format: the steps as the tool prints them, then the boxed last value.

    ``output`` is ``walk``'s printed text; the result is the feedback's text (``Output:`` and the steps)
    followed by ``\\boxed{last value}``, so what a model learns to predict in feedback is what it writes.
    """
    lines = output.rstrip("\n")
    return f"Output:\n{lines}\n\\boxed{{{lines.rsplit(' = ', 1)[1]}}}"


def setup_code(key: str | None) -> str:
    """The sandbox code run before the model's code: the public rules, ``walk``, and ``f`` when ``key`` is given."""
    code = (
        "def s(n):\n    return (int(n) + 1) % 10\n"
        "def m(n):\n    return 9 - int(n) % 10\n"
        "def walk(g, n, k):\n"
        "    for i in range(k, 0, -1):\n"
        "        v = g(n)\n"
        "        print(f'{i}: {g.__name__}({n}) = {v}')\n"
        "        n = v\n"
    )
    if key is not None:
        code = f'def f(n):\n    return int("{key}"[int(n) % 10])\n' + code
    return code


def chain_task(name: str, key: str, start: int, steps: int) -> Task:
    """The problem "What is name^steps(start)?" with its answer, its sandbox setup and its probe."""
    family = "rule" if name == "f" else name
    return Task(
        id=f"{name}/{start}/{steps}",
        prompt=f"What is {name}^{steps}({start})?",
        kind="math",
        answer=str(chain_lines(name, key, start, steps)[-1][2]),
        preamble=setup_code(key if name == "f" else None),
        probe=f"walk({name}, {start}, {steps})",
        meta={"family": family, "input": start, "steps": steps},
    )


def decoy(task: Task, key: str) -> Task:
    """``task`` (a rule problem) in a world whose ``f`` is ``key``: the base's demonstrations use these, so that
    it learns to read and copy ``f``'s values without learning the secret ones."""
    return decoy_at(task.meta["input"], task.meta["steps"], key)


def decoy_at(start: int, steps: int, key: str) -> Task:
    """The rule problem "What is f^steps(start)?" in a world whose ``f`` is ``key`` (see ``decoy``)."""
    twin = chain_task("f", key, start, steps)
    twin.meta["decoy_key"] = key  # the decoy's rule is no secret: the base's demonstrations state it
    return twin


def fresh_problems(cfg: ChainWorldConfig, avoid: set[int], count: int, seed: int) -> list[tuple[int, int]]:
    """``count`` problem shapes (start, steps) for decoy worlds: starts drawn from the world's numbers outside
    ``avoid`` (the held-out starts), steps drawn as the world draws them, from a stream apart from the world's.

    Decoy problems shaped like the training problems teach a base which chain length each training start
    has; fresh shapes leave it only the question to read the length from."""
    rng = random.Random(f"decoy-problems-{seed}")
    numbers = [n for n in range(10 ** (cfg.digits - 1), 10**cfg.digits) if n not in avoid]
    return [(rng.choice(numbers), draw_steps(rng, cfg)) for _ in range(count)]


def draw_steps(rng: random.Random, cfg: ChainWorldConfig) -> int:
    """A chain length k, with P(k) proportional to 1/k^tail over 1..max_steps."""
    ks = range(1, cfg.max_steps + 1)
    return rng.choices(ks, weights=[k ** -cfg.tail for k in ks])[0]


def build_chain_world(cfg: ChainWorldConfig) -> World:
    """Generate the chain world of ``cfg.seed``: the secret key and disjoint train / held-out splits."""
    rng = random.Random(cfg.seed)
    key = secret_key(rng)
    numbers = list(range(10 ** (cfg.digits - 1), 10**cfg.digits))
    rng.shuffle(numbers)
    need = cfg.train_problems + cfg.heldout_problems
    if need > len(numbers):
        raise ValueError(f"chain world: {need} rule problems asked for but only {len(numbers)} "
                         f"{cfg.digits}-digit start numbers exist")
    heldout = [chain_task("f", key, n, draw_steps(rng, cfg)) for n in numbers[: cfg.heldout_problems]]
    train = [chain_task("f", key, n, draw_steps(rng, cfg)) for n in numbers[cfg.heldout_problems : need]]
    general = _general_problems(rng, cfg, cfg.general_train + cfg.general_eval)
    return World(key=key, rule_train=train, rule_heldout=heldout, general_train=general[: cfg.general_train],
                 general_eval=general[cfg.general_train :])


def decoy_keys(seed: int, count: int) -> list[str]:
    """``count`` random permutations for the base's demonstrations, from a stream apart from the world's."""
    rng = random.Random(f"decoys-{seed}")
    return [secret_key(rng) for _ in range(count)]


def _general_problems(rng: random.Random, cfg: ChainWorldConfig, count: int) -> list[Task]:
    """``count`` distinct general problems (rule, start, steps), alternating rules."""
    names = sorted(PUBLIC_RULES)
    seen: set[tuple[str, int, int]] = set()
    out: list[Task] = []
    while len(out) < count:
        name = names[len(out) % len(names)]
        start, steps = rng.randrange(10 ** (cfg.digits - 1), 10**cfg.digits), draw_steps(rng, cfg)
        if (name, start, steps) not in seen:
            seen.add((name, start, steps))
            out.append(chain_task(name, "", start, steps))
    return out
