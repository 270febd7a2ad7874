"""Turn assert-style tests into call tests (inputs in, return value out, compared by the caller).

``assert f(1, [2]) == 3`` becomes a call test with args ``[1, [2]]`` and expected ``3`` when both
sides parse as literals (``ast.literal_eval``). Anything else stays an assert test, which a
separate judge process runs against a proxy of the function (see ``molrl.sandbox.runtime.task``).
"""

from __future__ import annotations

import ast
from typing import Any

from molrl.task_types import TestCase


_UNPARSABLE = (ValueError, TypeError, SyntaxError, MemoryError, RecursionError)
"""What parsing or reading a literal can raise, deep nesting included."""


def _literal(node: ast.expr) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except _UNPARSABLE:
        return False, None


def _calls_any(node: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in names for n in ast.walk(node))


def assert_node_to_call(node: ast.stmt, names: set[str], allow_source_args: bool = False) -> TestCase | None:
    """A call test for ``assert NAME(args) == literal`` (either side), else None.

    With ``allow_source_args``, arguments that are not literals (e.g. names made by setup code)
    are kept as a source expression evaluated next to the solution; they are inputs, never answers.
    """
    if not isinstance(node, ast.Assert) or not isinstance(node.test, ast.Compare):
        return None
    cmp = node.test
    if len(cmp.ops) != 1 or not isinstance(cmp.ops[0], ast.Eq):
        return None
    for call, other in ((cmp.left, cmp.comparators[0]), (cmp.comparators[0], cmp.left)):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in names):
            continue
        if call.keywords or any(isinstance(a, ast.Starred) for a in call.args):
            return None
        ok, expected = _literal(other)
        if not ok:
            return None
        parsed = [_literal(a) for a in call.args]
        if all(ok for ok, _ in parsed):
            return TestCase("call", args=[v for _, v in parsed], expected=expected)
        if allow_source_args and not any(_calls_any(a, names) for a in call.args):
            source = "(" + "".join(ast.unparse(a) + ", " for a in call.args) + ")"
            return TestCase("call", expected=expected, args_source=source)
        return None
    return None


def assert_to_call(source: str, names: set[str], allow_source_args: bool = False) -> TestCase | None:
    """``assert_node_to_call`` for a one-statement source string (None when it does not parse)."""
    try:
        tree = ast.parse(source.strip())
    except _UNPARSABLE:
        return None
    if len(tree.body) != 1:
        return None
    return assert_node_to_call(tree.body[0], names, allow_source_args)


def _trivial(node: ast.stmt) -> bool:
    """Statements a check function may hold that test nothing: docstrings, pass, ``assert True``."""
    if isinstance(node, ast.Pass):
        return True
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return True
    return isinstance(node, ast.Assert) and isinstance(node.test, ast.Constant) and node.test.value is True


def check_function_to_calls(test_source: str, check_name: str = "check", arg_name: str = "candidate") -> list[TestCase] | None:
    """Call tests for every assert of ``def check(candidate): ...``, or None if any will not convert."""
    try:
        tree = ast.parse(test_source)
    except _UNPARSABLE:
        return None
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == check_name]
    if len(checks) != 1:
        return None
    tests = []
    for stmt in checks[0].body:
        if _trivial(stmt):
            continue
        test = assert_node_to_call(stmt, {arg_name})
        if test is None:
            return None
        tests.append(test)
    return tests or None


def without_function(source: str, name: str) -> str:
    """``source`` minus the top-level definition of ``name`` (a prompt's stub of the entry point)."""
    tree = ast.parse(source)
    tree.body = [n for n in tree.body if not (isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name)]
    return ast.unparse(tree)
