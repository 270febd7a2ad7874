"""The library world: code tasks against a library that exists only inside the sandbox.

The tasks ask for a short Python function ``solve`` that uses ``lib``, a module the sandbox defines before the
solution runs (the task's ``preamble``; never shown to the model). The tasks' text says what each of ``lib``'s
functions is for, never how it behaves; each function's behaviour is one of a few, drawn from the world's seed, and
only running code reveals which:

- ``lib.price(item)``: the price **in tenths, hundredths or thousandths** of a unit (units); a whole-unit price is
  1-9, so the printed value's digit count tells the unit;
- ``lib.stock(item)``: how many the store has, **as an int, a sentence such as ``'7 in stock'`` or a dict
  ``{'count': 7}``** (the shape of a value);
- ``lib.weight(item)``: the weight, and for an item without one **-1, None or a KeyError** (errors);
- ``lib.ship``: the cost of shipping a number of an item, **``ship(item, n)`` or ``ship(n, item)``** (argument
  order); the other order raises ``KeyError: 2``.

``lib.ITEMS`` lists the training items (the prompt says so), so an agent has something to probe with. What running
code shows is unlike the answer: printed values (``2503``, ``'7 in stock'``) and tracebacks (``KeyError: 2``),
against an answer that is code (``return lib.price(item) // 1000``). A task asks for one function's use with a
small twist (``3 times the price of item in whole units``), or for two functions together. Held-out tasks use pairs
of functions no training task combines, on items no training task's tests call and ``lib.ITEMS`` does not list;
general tasks are plain Python without ``lib`` and measure forgetting. Every task is graded by held-back call tests
in the sandbox (``molrl.graders.code``); the prompt shows no test input.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from itertools import combinations
from typing import Sequence

from molrl.tasks import Task, TestCase

FAMILIES = ("price", "stock", "weight", "ship")
"""The functions of ``lib``, one quirk each."""
SCALES = (10, 100, 1000)
"""What ``lib.price`` may count in: tenths, hundredths or thousandths of a unit."""
STOCK_SHAPES = ("int", "sentence", "dict")
"""How ``lib.stock`` may give a count: ``7``, ``'7 in stock'`` or ``{'count': 7}``."""
MISSING = ("-1", "None", "KeyError")
"""What ``lib.weight`` may do for an item without a weight."""
SHIP_ORDERS = ("item, n", "n, item")
"""The order of ``lib.ship``'s arguments."""
QUIRKS = {"price": SCALES, "stock": STOCK_SHAPES, "weight": MISSING, "ship": SHIP_ORDERS}
"""Each function's possible behaviours (one is drawn per world)."""
FIELDS = {"price": "scale", "stock": "stock_shape", "weight": "missing", "ship": "ship_order"}
"""The ``Quirks`` field that holds each function's behaviour."""
ITEMS = ("bolt", "cog", "vane", "dial", "gear", "pin", "rod", "nut", "cam", "hub", "lug", "rim", "tab", "peg",
         "cap", "jig", "keg", "lid", "mast", "nib", "orb", "pod", "reel", "sash", "tine", "urn", "vial", "wick",
         "yoke", "zinc", "arc", "bead", "coil", "disc", "fin", "gimp", "hasp", "iris", "jamb", "knob")
"""The store's items (short nouns, so a name is a few tokens)."""
PAIRS = tuple(combinations(FAMILIES, 2))
"""Every pair of functions a task may combine."""
ENTRY = "solve"


@dataclass
class LibraryConfig:
    """The size and seed of a library world."""

    seed: int = 0
    """Seed of the library's behaviour, its data and every split."""
    train_items: int = 24
    """Items the training tasks' tests call (the rest are held out)."""
    heldout_items: int = 12
    """Items only the held-out tasks' tests call."""
    tests_per_task: int = 4
    """Held-back call tests a task has."""
    train_twists: int = 12
    """Tasks a function (and a training pair) has in training, each with its own twist."""
    heldout_pairs: int = 2
    """Pairs of functions no training task combines, for the held-out tasks."""
    heldout_twists: int = 10
    """Held-out tasks a held-out pair has."""
    general_train: int = 200
    """Plain-Python training tasks (no ``lib``)."""
    general_eval: int = 50
    """Plain-Python tasks held out to measure forgetting."""


@dataclass(frozen=True)
class Quirks:
    """How this world's ``lib`` behaves where the tasks' text is silent."""

    scale: int
    stock_shape: str
    missing: str
    ship_order: str

    def of(self, family: str):
        """The behaviour of one function (a member of ``QUIRKS[family]``)."""
        return getattr(self, FIELDS[family])

    def with_(self, family: str, member) -> "Quirks":
        """These quirks with ``family``'s behaviour set to ``member``."""
        from dataclasses import replace

        return replace(self, **{FIELDS[family]: member})

    def truth_first(self, family: str) -> list:
        """``family``'s behaviours, this library's first (the order every probe's candidates take)."""
        return [self.of(family)] + [m for m in QUIRKS[family] if m != self.of(family)]

    def key(self) -> str:
        """The quirks in one line (the world's secret, as ``world.json`` keeps it)."""
        return (f"price/{self.scale} stock/{self.stock_shape} weight/{self.missing} "
                f"ship({self.ship_order})")


@dataclass
class LibraryWorld:
    """A generated library world: the library, its data, and the task splits."""

    quirks: Quirks
    preamble: str
    """The library's source, run in the sandbox before every solution and every executed snippet."""
    prices: dict[str, int]
    """Each item's price in the library's own unit (``quirks.scale`` a whole unit)."""
    stock: dict[str, int]
    weights: dict[str, int]
    """Items with a weight; the others have none."""
    ship_rates: dict[str, int]
    train_pairs: list[tuple[str, str]] = field(default_factory=list)
    heldout_pairs: list[tuple[str, str]] = field(default_factory=list)
    train: list[Task] = field(default_factory=list)
    """Single-function and training-pair tasks on the training items."""
    heldout: list[Task] = field(default_factory=list)
    """Held-out-pair tasks on the held-out items."""
    general_train: list[Task] = field(default_factory=list)
    general_eval: list[Task] = field(default_factory=list)

    items: list[str] = field(default_factory=list)
    """``lib.ITEMS``: the training items, in the order the library lists them."""

    def probe(self, family: str, item: str) -> str:
        """A snippet that shows one function's behaviour on ``item`` (what an agent might run)."""
        call = {"price": f"lib.price({item!r})", "stock": f"lib.stock({item!r})", "weight": f"lib.weight({item!r})",
                "ship": f"lib.ship({item!r}, 2)"}[family]
        return f"print(repr({call}))"

    def as_world(self) -> "World":  # noqa: F821
        """The world as the demo's pipeline takes one: library tasks as its domain ("rule") splits."""
        from molrl.demo.world import World

        return World(key=self.quirks.key(), rule_train=self.train, rule_heldout=self.heldout,
                     general_train=self.general_train, general_eval=self.general_eval)


def library_source(q: Quirks, prices: dict, stock: dict, weights: dict, ship_rates: dict, items: list[str]) -> str:
    """The ``lib`` module's source: plain functions over hidden tables, as the sandbox defines it."""
    missing = {"-1": "return -1", "None": "return None", "KeyError": "raise KeyError(item)"}[q.missing]
    count = {"int": "_STOCK[item]", "sentence": "f'{_STOCK[item]} in stock'", "dict": "{'count': _STOCK[item]}"}
    ship = f"def ship({q.ship_order}):\n    return n * _SHIP[item]\n"
    body = (f"ITEMS = {items!r}\n_PRICE = {prices!r}\n_STOCK = {stock!r}\n_WEIGHT = {weights!r}\n"
            f"_SHIP = {ship_rates!r}\n\n"
            "def price(item):\n    return _PRICE[item]\n\n"
            f"def stock(item):\n    return {count[q.stock_shape]}\n\n"
            f"def weight(item):\n    if item not in _WEIGHT:\n        {missing}\n    return _WEIGHT[item]\n\n{ship}")
    return ("import types as _types\nlib = _types.ModuleType('lib')\n"
            f"exec(compile({body!r}, 'lib.py', 'exec'), lib.__dict__)\ndel _types\n")


def describe(families: tuple[str, ...]) -> str:
    """What the prompt says of the functions a task uses: what each is for, never how it behaves."""
    text = {"price": "`lib.price(item)` gives the price of an item",
            "stock": "`lib.stock(item)` tells how many of an item the store has",
            "weight": "`lib.weight(item)` gives the weight of an item, where one is known",
            "ship": "`lib.ship` gives the cost of shipping a number of an item"}
    return "; ".join(text[f] for f in families) + "; `lib.ITEMS` lists some of the store's items"


def quirk_text(q: Quirks, families: tuple[str, ...]) -> str:
    """What running code would show of the functions a task uses, said outright (the pilot's control: the room the
    library leaves once its behaviour is known, which is what absorbing the feedback could fill)."""
    unit = {10: "tenths", 100: "hundredths", 1000: "thousandths"}[q.scale]
    missing = {"-1": "returns -1", "None": "returns None", "KeyError": "raises KeyError"}[q.missing]
    shape = {"int": "an int such as 7", "sentence": "a sentence such as '7 in stock'",
             "dict": "a dict such as {'count': 7}"}[q.stock_shape]
    text = {"price": f"`lib.price` counts in {unit} of a unit",
            "stock": f"`lib.stock` returns {shape}",
            "weight": f"for an item without a weight `lib.weight` {missing}",
            "ship": f"`lib.ship` takes its arguments as `lib.ship({q.ship_order})`"}
    return "; ".join(text[f] for f in families)


def told(world: LibraryWorld, task: Task) -> Task:
    """``task`` with its functions' behaviour stated in the prompt (the pilot's control; never trained on)."""
    from dataclasses import replace

    families = tuple(task.meta["family"].split("+"))
    prompt = task.prompt.replace(". Write a Python", f". Note: {quirk_text(world.quirks, families)}. Write a Python", 1)
    return replace(task, id=task.id.replace("library/", "library-told/", 1), prompt=prompt)


TARGETS = {
    "price": "the price of {item} in whole units (rounded down)",
    "stock": "how many of {item} the store has, as an int",
    "weight": "the weight of {item}, or 0 when it has none",
    "ship": "the cost of shipping {n} of {item}",
}
"""What a function's use asks for, in the prompt's words."""


def value(world: LibraryWorld, family: str, item: str, n: int) -> int:
    """What one function's use is worth for ``item`` (the caller's truth, computed from the hidden tables)."""
    if family == "price":
        return world.prices[item] // world.quirks.scale
    if family == "stock":
        return world.stock[item]
    if family == "weight":
        return world.weights.get(item, 0)
    return n * world.ship_rates[item]


def reference_use(q: Quirks, family: str, item: str = "item", n: str = "n") -> str:
    """The expression that uses one function rightly (what the model has to learn to write)."""
    if family == "price":
        return f"lib.price({item}) // {q.scale}"
    if family == "stock":
        return {"int": f"lib.stock({item})", "sentence": f"int(lib.stock({item}).split()[0])",
                "dict": f"lib.stock({item})['count']"}[q.stock_shape]
    if family == "weight":
        return f"_weight({item})"
    return f"lib.ship({item}, {n})" if q.ship_order == "item, n" else f"lib.ship({n}, {item})"


def reference_helpers(q: Quirks, families: tuple[str, ...]) -> str:
    """Helper functions a reference solution needs (the missing-weight check)."""
    if "weight" not in families:
        return ""
    if q.missing == "KeyError":
        return "def _weight(item):\n    try:\n        return lib.weight(item)\n    except KeyError:\n        return 0\n\n"
    check = "== -1" if q.missing == "-1" else "is None"
    return f"def _weight(item):\n    w = lib.weight(item)\n    return 0 if w {check} else w\n\n"


def signature(families) -> str:
    """The arguments of ``solve`` for a task using ``families``."""
    return "item, n" if "ship" in families else "item"


def solution_code(families, twist: int, quirks: Quirks) -> str:
    """The function a task using ``families`` with twist ``twist`` asks for, written for ``quirks``."""
    body = " + ".join(reference_use(quirks, f) for f in families)
    return (f"{reference_helpers(quirks, tuple(families))}def {ENTRY}({signature(families)}):\n"
            f"    return {twisted(twist, body)}\n")


def naive_use(family: str, item: str = "item", n: str = "n") -> str:
    """The expression a reader of the prompt alone would write (right for one behaviour of ``stock`` and of
    ``ship``, wrong for every other)."""
    return {"price": f"lib.price({item})", "stock": f"lib.stock({item})", "weight": f"lib.weight({item})",
            "ship": f"lib.ship({n}, {item})"}[family]


TWISTS = (("", "+", 0), ("3 times ", "*", 3), ("2 plus ", "+", 2), ("10 times ", "*", 10), ("5 plus ", "+", 5),
          ("twice ", "*", 2), ("4 times ", "*", 4), ("1 plus ", "+", 1), ("7 plus ", "+", 7), ("6 times ", "*", 6),
          ("9 plus ", "+", 9), ("8 times ", "*", 8))
"""(what the prompt says, the operation, its constant): the small change that makes each training task its own."""
HELDOUT_TWISTS = (("11 plus ", "+", 11), ("3 plus ", "+", 3), ("5 times ", "*", 5), ("12 plus ", "+", 12),
                  ("7 times ", "*", 7), ("4 plus ", "+", 4), ("9 times ", "*", 9), ("6 plus ", "+", 6),
                  ("12 times ", "*", 12), ("8 plus ", "+", 8))
"""The held-out tasks' twists, which no training task (and no decoy task a base is taught on) has: a held-out
task's text is never one a model trained on, in this world or another."""
ALL_TWISTS = TWISTS + HELDOUT_TWISTS
"""Every twist by its index: training twists first."""


def twisted(twist: int, x):
    """Twist ``twist`` applied: to a value (an int), or to an expression's text (the reference's code)."""
    _, op, k = ALL_TWISTS[twist]
    if isinstance(x, str):
        return x if not k else f"{k} {op} ({x})"
    return x + k if op == "+" else x * k


def task_id(split: str, families: Sequence[str], twist: int) -> str:
    """A library task's id: ``library/SPLIT/FAMILIES/TWIST``, its functions joined by ``+``."""
    return f"library/{split}/{'+'.join(families)}/{twist}"


def task_functions(identifier: str) -> str:
    """The functions a library task combines, read back from its id (``task_id``'s FAMILIES).

    >>> task_functions(task_id("heldout", ("stock", "ship"), 7))
    'stock+ship'
    """
    return identifier.split("/")[2]


def library_task(world: LibraryWorld, families: tuple[str, ...], twist: int, items: list[str], tests: int,
                 rng: random.Random, split: str) -> Task:
    """A task using ``families`` (one function, or two summed) with twist ``twist``, tested on ``items``."""
    q = world.quirks
    say = ALL_TWISTS[twist][0]
    ships = "ship" in families
    args = signature(families)
    parts = [TARGETS[f].format(item="item", n="n") for f in families]
    target = parts[0] if len(parts) == 1 else f"the sum of {parts[0]} and {parts[1]}"
    prompt = (f"The module `lib` is available: {describe(families)}. Write a Python function `{ENTRY}({args})` that "
              f"returns {say}{target}.")
    chosen = rng.sample(items, tests)
    if "weight" in families and all(i in world.weights for i in chosen):  # the missing weight's quirk must bite
        chosen[-1] = rng.choice([i for i in items if i not in world.weights])
    cases = []
    for item in chosen:
        n = rng.randrange(2, 10)
        truth = sum(value(world, f, item, n) for f in families)
        cases.append(TestCase("call", args=[item, n] if ships else [item], expected=twisted(twist, truth)))
    reference = solution_code(families, twist, q)
    naive = " + ".join(naive_use(f) for f in families)
    return Task(id=task_id(split, families, twist), prompt=prompt, kind="code", entry_point=ENTRY,
                tests=cases, preamble=world.preamble, reference=reference,
                meta={"family": "+".join(families), "twist": twist, "split": split, "library": q.key(),
                      "naive": f"def {ENTRY}({args}):\n    return {twisted(twist, naive)}\n"})


GENERAL = (
    ("the largest number in xs", "xs", lambda r: [r.randrange(-50, 50) for _ in range(r.randrange(2, 7))],
     lambda xs: max(xs), "max(xs)"),
    ("the sum of the digits of n", "n", lambda r: r.randrange(10, 100000), lambda n: sum(map(int, str(n))),
     "sum(int(c) for c in str(n))"),
    ("the position in the alphabet of the first letter of s", "s",
     lambda r: "".join(r.choice("abcdefgh") for _ in range(r.randrange(2, 8))), lambda s: ord(s[0]) - 96,
     "ord(s[0]) - 96"),
    ("how many even numbers xs has", "xs", lambda r: [r.randrange(0, 30) for _ in range(r.randrange(1, 8))],
     lambda xs: sum(x % 2 == 0 for x in xs), "sum(x % 2 == 0 for x in xs)"),
    ("the number of vowels in s", "s", lambda r: "".join(r.choice("aeioubcdfg") for _ in range(r.randrange(2, 9))),
     lambda s: sum(c in "aeiou" for c in s), "sum(c in 'aeiou' for c in s)"),
)
"""Plain-Python task families, each answer an int: (what it returns, its argument, an input, the answer, a reference
expression)."""


def general_task(i: int, rng: random.Random, tests: int, split: str) -> Task:
    """Plain-Python task ``i`` (no ``lib``): one of ``GENERAL`` plus a constant of its own, so no two prompts match."""
    what, arg, make, answer, expr = GENERAL[i % len(GENERAL)]
    k = i // len(GENERAL)
    say = f"{k} plus " if k else ""
    cases = []
    for _ in range(tests):
        x = make(rng)
        cases.append(TestCase("call", args=[x], expected=int(answer(x)) + k))
    return Task(id=f"library/general-{split}/{i}", prompt=f"Write a Python function `{ENTRY}({arg})` that returns "
                f"{say}{what}.", kind="code", entry_point=ENTRY, tests=cases,
                reference=f"def {ENTRY}({arg}):\n    return {k} + {expr}\n" if k else
                f"def {ENTRY}({arg}):\n    return {expr}\n",
                meta={"family": f"general/{i % len(GENERAL)}", "split": split})


def build_library_world(cfg: LibraryConfig) -> LibraryWorld:
    """Generate the library world of ``cfg.seed``: its quirks, data and splits."""
    rng = random.Random(cfg.seed)
    if cfg.train_items + cfg.heldout_items > len(ITEMS):
        raise ValueError(f"library world: {cfg.train_items} + {cfg.heldout_items} items asked for, {len(ITEMS)} exist")
    if cfg.tests_per_task > min(cfg.train_items, cfg.heldout_items):
        raise ValueError(f"library world: tests_per_task={cfg.tests_per_task} exceeds the items of a split")
    if not 0 < cfg.heldout_pairs < len(PAIRS) or cfg.train_twists > len(TWISTS) or \
            cfg.heldout_twists > len(HELDOUT_TWISTS):
        raise ValueError(f"library world: heldout_pairs is 1-{len(PAIRS) - 1}, train_twists at most {len(TWISTS)}, "
                         f"heldout_twists at most {len(HELDOUT_TWISTS)}")
    q = Quirks(scale=rng.choice(SCALES), stock_shape=rng.choice(STOCK_SHAPES), missing=rng.choice(MISSING),
               ship_order=rng.choice(SHIP_ORDERS))
    items = list(ITEMS)
    rng.shuffle(items)
    train_items, heldout_items = items[: cfg.train_items], items[cfg.train_items: cfg.train_items + cfg.heldout_items]
    used = train_items + heldout_items
    prices = {i: rng.randrange(1, 10) * q.scale + rng.randrange(1, q.scale) for i in used}  # digits tell the unit
    stock = {i: rng.randrange(1, 40) for i in used}
    weights = {i: rng.randrange(1, 90) for i in used if rng.random() < 0.6}
    for split in (train_items, heldout_items):  # every split has items with a weight and items without one
        weights.setdefault(split[0], rng.randrange(1, 90))
        weights.pop(split[1], None)
    ship_rates = {i: rng.randrange(2, 20) for i in used}
    preamble = library_source(q, prices, stock, weights, ship_rates, train_items)
    world = LibraryWorld(q, preamble, prices, stock, weights, ship_rates, items=train_items)
    pairs = list(PAIRS)
    rng.shuffle(pairs)
    world.heldout_pairs, world.train_pairs = pairs[: cfg.heldout_pairs], pairs[cfg.heldout_pairs:]
    for families in [(f,) for f in FAMILIES] + world.train_pairs:
        world.train += [library_task(world, families, t, train_items, cfg.tests_per_task, rng, "train")
                        for t in range(cfg.train_twists)]
    for families in world.heldout_pairs:
        world.heldout += [library_task(world, families, len(TWISTS) + t, heldout_items, cfg.tests_per_task, rng,
                                       "heldout") for t in range(cfg.heldout_twists)]
    world.general_train = [general_task(i, rng, cfg.tests_per_task, "train") for i in range(cfg.general_train)]
    world.general_eval = [general_task(cfg.general_train + i, rng, cfg.tests_per_task, "eval")
                          for i in range(cfg.general_eval)]
    return world
