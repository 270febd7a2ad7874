"""What a block's top level defines, read by tokens (``molrl.graders.toplevel``), checked against Python's own reading.

On valid programs the token reading must agree with ``ast`` (here, in the tests, on trusted text) for every statement
shape a definition can take or be mistaken for, alone and in combination; text that does not tokenize to its end
reads as None, whatever it holds.
"""

from __future__ import annotations

import ast
import itertools

import pytest

from molrl.graders.toplevel import MAX_NESTING, top_level_defines

STATEMENTS = [
    # definitions
    "def f(x): return x", "async def f(x): return x", "@dec\ndef f(): pass", "@dec(f=1)\ndef f(): pass",
    "f = 1", "g = f = 2", "f = g = h = 0", "f, g = 1, 2", "g, f = 1, 2", "(g, f) = 1, 2", "[g, f] = 1, 2",
    "[g, (h, f)] = 1, (2, 3)", "*f, g = [1, 2]", "g, *f = [1]", "[*f] = [1]", "(*f,) = [1]", "f, = [1]", "(f,) = [1]",
    "((f)) = 1", "x, (y, [f, *z]) = 1, (2, [3])", "g = (f) = 1", "g = [f] = [1]", "f: int = 1", "(f): int = 1",
    "((f)): int = 1", "f: 'T' = 3", "f: Callable[[int], int] = lambda x: x", "x = 1; f = 2", "import os; f = 2",
    "f = lambda x=1: x", "f = \\\n 1", "f \\\n = 1", "f = 1  # a comment", "x = {'a': 1}; f = 2", "ｆ = 1",
    "f = [\n]", "x = [1,\n  2]\nf = x", "f = yield", "def f(): return '''\n```\n'''",
    # the name without a top-level definition
    "f: int", "x.f: int = 1", "x[f]: int = 1", "d[f] = 1", "x.f = 1", "f.x = 1", "f[0] = 1", "f.g.h = 1", "f().g = 1",
    "(f, g)[0] = 1", "f == f", "print(f == f)", "x = f == f", "g(f=1)", "f += 1", "(f := 1)", "g = (lambda: (f := 1))",
    "g = lambda f=1: f", "def g(f=1): return f", "class f: pass", "class T:\n    def f(self): return 0",
    "def g():\n    def f(): return 0\n    return f", "async def g():\n    f = 1", "if True: f = 1",
    "if True:\n    f = 1", "if x: pass; f = 1", "if x:\n    pass\nelse: f = 1", "while False: f = 1",
    "for f in []: pass", "try:\n    f = 1\nexcept E:\n    pass", "with open(f) as g: pass",
    "match x:\n    case 1:\n        f = 1", "import f", "from x import f", "global f", "del f", "assert f(3) == 4",
    "f(3)", "not f", "x = f if g else h",
    "x = [f for f in y]", "print(f'{f=}')", "(yield f)", "x = {f: 1}", "f = '''\ndef g\n'''", "s = '''\nf = 1\n'''",
    "s = '''\ndef f(): pass\n'''", "x = (\nf)", "# f = 1", "match = 1", "type = 1", "x = 1",
]


def _ast_defines(code: str, name: str) -> bool:
    """Python's own reading: a top-level def/async def of ``name``, or an (annotated, valued) assignment binding it."""
    def bound(target: ast.expr) -> set[str]:
        if isinstance(target, ast.Name):
            return {target.id}
        if isinstance(target, ast.Starred):
            return bound(target.value)
        if isinstance(target, (ast.Tuple, ast.List)):
            return set().union(*(bound(e) for e in target.elts))
        return set()

    for node in ast.parse(code).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return True
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else []
        if any(name in bound(t) for t in targets):
            return True
    return False


@pytest.mark.parametrize("code", STATEMENTS)
def test_each_statement_shape_reads_as_python_reads_it(code):
    assert top_level_defines(code, "f") is _ast_defines(code, "f")


def test_every_pair_of_statement_shapes_reads_as_python_reads_it():
    disagree = [(a, b) for a, b in itertools.permutations(STATEMENTS, 2)
                if top_level_defines(f"{a}\n{b}", "f") is not _ast_defines(f"{a}\n{b}", "f")]
    assert disagree == []


def test_the_table_holds_both_readings():  # so that agreement is not agreement on always-False
    readings = [_ast_defines(code, "f") for code in STATEMENTS]
    assert readings.count(True) >= 35 and readings.count(False) >= 45


@pytest.mark.parametrize("code", [
    "f = '''\ndef g(): pass", "f = 'abc", "f = (1,\n", "def f(x):\n    return [x", "f = 1)", "f = (1]", "f = $",
    "f = `1`", "f = 1 ?", "f = 1\0", "if x:\n        f = 1\n    g = 2", "f = \\",
    "f = " + "(" * (MAX_NESTING + 1) + ")" * (MAX_NESTING + 1),
])
def test_text_that_does_not_tokenize_to_its_end_reads_as_none(code):
    assert top_level_defines(code, "f") is None


@pytest.mark.parametrize("code, defined", [
    ("def f(x)\n    return x", True), ("f = " + "(" * MAX_NESTING + ")" * MAX_NESTING, True),
    ("(" * MAX_NESTING + "f" + ")" * MAX_NESTING + " = 1", True),
    ("[" * MAX_NESTING + "f" + "]" * MAX_NESTING + " = 1", True),
    ("g, f = 1, 2\nthis is prose", True), ("    f = 1", False), ("f = 1\rg = 2", True), ("", False),
])
def test_text_that_tokenizes_is_read_whether_or_not_it_compiles(code, defined):
    assert top_level_defines(code, "f") is defined
