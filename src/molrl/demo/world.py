"""The demo world: a hidden digit rule that only running code reveals, plus general tasks.

Everything is generated from one seed, so a world is reproducible and nothing is downloaded.

- Rule problems ("What is f(472)?"): ``f`` maps the last digit of a number through a secret
  permutation of 0-9 (no digit maps to itself), so an answer is one digit. The permutation
  lives only in the task's ``preamble``, which the sandbox runs before the model's code; the
  model never sees it. A
  model can learn ``f`` only from the environment's feedback (the printed results of its code).
  The numbers are split into a training split (collection and RL) and a held-out split whose
  numbers never appear in training, so a single-step score on them measures whether the rule was
  internalised rather than memorised.
- General problems ("What is reverse(472)?", rotate, copy ``g``, swap ``h``): digit-string
  tasks the base model is taught, both by running them in the sandbox (``GENERAL_SETUP``
  defines them there) and by answering directly; scoring them after training measures
  forgetting.
- Code-answer problems ("Write solve() returning f(472)."), built only when ``code_problems``
  or ``code_heldout`` asks for them (the study's reward ablation; the default demo has none):
  the answer is a function ``solve()`` that the sandbox calls and compares with the value. The
  sandbox defines nothing before the solution (no ``f``, no ``reverse``), so a solution must
  return the value itself: ``return f(472)`` fails with a NameError instead of passing. Their
  numbers come from the rule splits (held-out ones from the held-out split), so no held-out
  number reaches training through them; general ones reuse the general training strings.

Rule and general problems are ordinary math ``Task`` objects with a numeric ``answer``, graded
by the shared math grader; code-answer problems are code ``Task`` objects with one call test,
graded by the shared code grader. Collection, GRPO and evaluation run on them unchanged.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from molrl.tasks import Task, TestCase

CODE_TOKENS = 64
"""Most tokens of a code answer (the statement, then ``def solve(): return 274`` in a fence: up to 59)."""

GENERAL_OPS = {
    "reverse": lambda s: s[::-1],
    "rotate": lambda s: s[1:] + s[:1],
    "g": lambda s: s,
    "h": lambda s: s[1] + s[0] + s[2:],
}
"""General task families by function name: the answer as a function of the digit string. Several
names, two of them single letters, so the base learns to restate whichever call it is asked about."""


@dataclass
class WorldConfig:
    """The size and seed of a demo world."""

    seed: int = 0
    """Seed of the secret permutation and of every split."""
    digits: int = 3
    """Digits of the rule's input numbers."""
    train_problems: int = 400
    """Rule problems in the training split (collection and RL prompts)."""
    heldout_problems: int = 100
    """Rule problems in the held-out split (numbers never seen in training)."""
    general_train: int = 2000
    """General problems the base model is trained on (many, so it learns the functions, not the examples)."""
    general_eval: int = 100
    """General problems held out to measure forgetting."""
    general_digits: int = 3
    """Digits of the general problems' strings (digits 1-9, so answers have no leading zero)."""
    code_problems: int = 0
    """Code-answer rule problems for training, on the first training-split numbers, and as many general
    ones on the general training strings (0: no code-answer family, as in the default demo)."""
    code_heldout: int = 0
    """Code-answer rule problems on the first held-out numbers (for evaluation only)."""


@dataclass
class World:
    """A generated world: the secret rule and the task splits."""

    key: str
    """The secret permutation: digit d maps to key[d]."""
    rule_train: list[Task] = field(default_factory=list)
    """Rule problems whose numbers may be used in training."""
    rule_heldout: list[Task] = field(default_factory=list)
    """Rule problems on numbers that never appear in training."""
    general_train: list[Task] = field(default_factory=list)
    """General problems used to train the base model."""
    general_eval: list[Task] = field(default_factory=list)
    """General problems held out for the forgetting measurement."""
    code_train: list[Task] = field(default_factory=list)
    """Code-answer rule problems on training numbers."""
    code_general: list[Task] = field(default_factory=list)
    """Code-answer general problems on general training strings."""
    code_heldout: list[Task] = field(default_factory=list)
    """Code-answer rule problems on held-out numbers."""

    def apply(self, number: int) -> str:
        """The rule's output for ``number`` (a digit string)."""
        return apply_rule(self.key, number)


def apply_rule(key: str, number: int) -> str:
    """Map the last digit of ``number`` through ``key``: apply_rule('1032547698', 42) == '3'."""
    return key[number % 10]


def rule_setup_code(key: str) -> str:
    """The code that defines ``f`` in the sandbox before the model's code runs."""
    return f'def f(n):\n    return int("{key}"[int(n) % 10])\n'


def secret_key(rng: random.Random) -> str:
    """A permutation of the ten digits with no fixed point (copying a digit is never right)."""
    digits = list(range(10))
    while True:
        rng.shuffle(digits)
        if all(d != i for i, d in enumerate(digits)):
            return "".join(map(str, digits))


def probe_code(call: str) -> str:
    """The environment's probe of a problem about ``call``: the code the tool-use demonstrations run."""
    return f"print('{call} =', {call})"


def rule_task(key: str, number: int) -> Task:
    """The problem "What is f(number)?" with its answer, the rule as sandbox setup code, and its probe."""
    return Task(
        id=f"rule/{number}",
        prompt=f"What is f({number})?",
        kind="math",
        answer=apply_rule(key, number),
        preamble=rule_setup_code(key),
        probe=probe_code(f"f({number})"),
        meta={"family": "rule", "input": number},
    )


GENERAL_SETUP = (
    "def reverse(n):\n    return int(str(n)[::-1])\n"
    "def rotate(n):\n    s = str(n)\n    return int(s[1:] + s[:1])\n"
    "def g(n):\n    return int(n)\n"
    "def h(n):\n    s = str(n)\n    return int(s[1] + s[0] + s[2:])\n"
)
"""The code that defines the general functions in the sandbox (their rules are no secret)."""


def general_task(op: str, text: str) -> Task:
    """A general digit-string problem (``reverse``, ``rotate``, ``g``, ``h``) with its answer."""
    return Task(id=f"{op}/{text}", prompt=f"What is {op}({text})?", kind="math", answer=GENERAL_OPS[op](text),
                preamble=GENERAL_SETUP, probe=probe_code(f"{op}({text})"), meta={"family": op, "input": text})


CODE_ENTRY = "solve"
"""The function a code-answer solution defines."""


def code_solution(value: str) -> str:
    """A correct solution of a code-answer problem whose value is ``value``: ``def solve(): return 3``."""
    return f"def {CODE_ENTRY}(): return {int(value)}"


def code_task(call: str, value: str, family: str, given: int | str) -> Task:
    """The problem "Write solve() returning ``call``." with a call test expecting ``value`` as an int.

    No preamble: the sandbox defines nothing the solution could call instead of stating the value.
    """
    return Task(
        id=f"code/{call}",
        prompt=f"Write {CODE_ENTRY}() returning {call}.",
        kind="code",
        entry_point=CODE_ENTRY,
        tests=[TestCase("call", args=[], expected=int(value))],
        reference=code_solution(value),
        meta={"family": f"code/{family}", "input": given, "call": call, "value": value},
    )


def code_twin(task: Task) -> Task:
    """The code-answer problem asking for the same call as the rule or general problem ``task``."""
    family = task.meta["family"]
    name = "f" if family == "rule" else family
    return code_task(f"{name}({task.meta['input']})", task.answer or "", family, task.meta["input"])


def build_world(cfg: WorldConfig) -> World:
    """Generate the world of ``cfg.seed``: the secret key and disjoint train / held-out splits."""
    rng = random.Random(cfg.seed)
    key = secret_key(rng)
    low, high = 10 ** (cfg.digits - 1), 10**cfg.digits
    numbers = list(range(low, high))
    rng.shuffle(numbers)
    need = cfg.train_problems + cfg.heldout_problems
    if need > len(numbers):
        raise ValueError(f"world: {need} rule problems asked for but only {len(numbers)} {cfg.digits}-digit inputs exist")
    heldout = numbers[: cfg.heldout_problems]
    train = numbers[cfg.heldout_problems : need]
    general = _general_problems(rng, cfg.general_train + cfg.general_eval, cfg.general_digits)
    world = World(
        key=key,
        rule_train=[rule_task(key, n) for n in train],
        rule_heldout=[rule_task(key, n) for n in heldout],
        general_train=general[: cfg.general_train],
        general_eval=general[cfg.general_train :],
    )
    if cfg.code_problems > min(cfg.train_problems, cfg.general_train) or cfg.code_heldout > cfg.heldout_problems:
        raise ValueError(f"world: code_problems={cfg.code_problems} / code_heldout={cfg.code_heldout} exceed the rule "
                         f"or general splits they are drawn from ({cfg.train_problems}, {cfg.general_train}, "
                         f"{cfg.heldout_problems}); lower them or raise the splits")
    # drawn from the splits above without touching rng, so a world without them is the same world
    world.code_train = [code_twin(t) for t in world.rule_train[: cfg.code_problems]]
    world.code_general = [code_twin(t) for t in world.general_train[: cfg.code_problems]]
    world.code_heldout = [code_twin(t) for t in world.rule_heldout[: cfg.code_heldout]]
    return world


def _general_problems(rng: random.Random, count: int, digits: int) -> list[Task]:
    """``count`` distinct general problems, alternating families."""
    seen: set[tuple[str, str]] = set()
    out: list[Task] = []
    ops = sorted(GENERAL_OPS)
    while len(out) < count:
        op = ops[len(out) % len(ops)]
        text = "".join(rng.choice("123456789") for _ in range(digits))
        if (op, text) not in seen:
            seen.add((op, text))
            out.append(general_task(op, text))
    return out
