"""No two classes of the package share a name: a name says what its class is, in any module it is read from."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "molrl"


def test_no_two_classes_of_the_package_share_a_name():
    where = defaultdict(list)
    for path in sorted(SRC.rglob("*.py")):  # every module, enumerated
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(str(path.relative_to(SRC)))
    assert {name: files for name, files in where.items() if len(files) > 1} == {}
