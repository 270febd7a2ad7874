"""Every molrl module imports cleanly on its own, in any order: no import cycles, and no layer imports one above it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import molrl

ROOT = Path(molrl.__file__).parent
# read from the file tree, not by importing (pkgutil.walk_packages skips a package that fails to import, and
# every module in it with it)
MODULES = sorted(".".join(("molrl", *f.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__")
                 for f in ROOT.rglob("*.py") if "__pycache__" not in f.parts
                 and not f.relative_to(ROOT).parts[:2] == ("sandbox", "runtime"))  # the sandbox's own side

PROBE = """
import importlib, json, sys
names = json.loads(sys.argv[1])
failed = {}
for order in (names, names[::-1]):
    for name in order:
        for loaded in [m for m in sys.modules if m == "molrl" or m.startswith("molrl.")]:
            del sys.modules[loaded]  # each module first, from nothing of molrl, as `python -c "import it"` would
        try:
            importlib.import_module(name)
        except Exception as err:
            failed[name] = f"{type(err).__name__}: {err}"
print(json.dumps(failed))
"""


def test_the_module_list_covers_the_stages():
    for stage in ("molrl.tasks.grade", "molrl.rl.trainer", "molrl.mol", "molrl.eval", "molrl.collect", "molrl.traces"):
        assert any(m == stage or m.startswith(stage + ".") for m in MODULES), stage


def test_each_module_imports_alone():
    # one interpreter keeps third-party imports (torch, transformers) between modules, so this is fast;
    # molrl's own modules are dropped before each import, so a cycle shows as an ImportError
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(MODULES)], capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    failed = json.loads(out.stdout.strip().splitlines()[-1])
    assert not failed, failed


def _imports_of(path, name):
    """molrl modules ``name`` (at ``path``) imports, at the top or inside functions."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m in MODULES and m != name}


def _path_of(name):
    """The source file of the molrl module ``name`` (a package's ``__init__.py``)."""
    relative = ROOT / Path(*name.split(".")[1:])
    return relative / "__init__.py" if relative.is_dir() else relative.with_suffix(".py")


def test_no_two_modules_import_each_other_even_inside_functions():
    # an import inside a function hides a cycle from the test above; the graph of every import shows it
    graph = {}
    for name in MODULES:
        graph[name] = {m for m in _imports_of(_path_of(name), name) if not name.startswith(m + ".")}  # a package's own face
    # strongly connected components (Tarjan), iteratively
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(start):
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    assert not cycles, cycles


def test_the_demo_runs_without_importing_the_study():
    """``molrl.study`` imports the demo; the demo (and ``molrl demo`` without ``--study``) never imports the study."""
    import subprocess
    import sys

    code = ("import sys, molrl.demo.run, molrl.demo.seeds, molrl.demo.chain, molrl.demo.expert; "
            "print([m for m in sys.modules if m.startswith('molrl.study')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


STAGES = ("molrl.collect", "molrl.mol", "molrl.rl", "molrl.eval", "molrl.demo", "molrl.study", "molrl.pipeline")
"""The stage packages: peers above the shared layers, each run by its own command."""

LAYERS = {
    # stages that run episodes take them from the episode layer, never from the collect stage
    "molrl.rl": ("molrl.collect",), "molrl.eval": ("molrl.collect",), "molrl.demo": ("molrl.collect",),
    "molrl.study": ("molrl.collect",),
    # below the stages: the episode loop, the engines (generation, merge, export, the server tier), the config
    # machinery, run records and what a run shows
    "molrl.episode": STAGES, "molrl.engines": STAGES, "molrl.config": STAGES,
    # the bottom: records and logs use neither the engines nor the episode loop
    "molrl.records": STAGES + ("molrl.engines", "molrl.episode"),
    "molrl.logs": STAGES + ("molrl.engines", "molrl.episode"),
}
"""For each package or module, the packages it must not import (at the top or inside a function)."""


def _within(name, package):
    return name == package or name.startswith(package + ".")


@pytest.mark.parametrize("below", sorted(LAYERS))
def test_a_layer_imports_nothing_above_it(below):
    crossings = []
    for name in (m for m in MODULES if _within(m, below)):
        crossings += [f"{name} -> {m}" for m in sorted(_imports_of(_path_of(name), name))
                      if any(_within(m, above) for above in LAYERS[below])]
    assert any(_within(m, below) for m in MODULES), below
    assert not crossings, crossings


def test_the_root_holds_at_most_twenty_loose_modules():
    """The package's root is a lobby: the rest lives in packages that show the layers (config, engines, records,
    logs, the stages)."""
    loose = sorted(p.name for p in ROOT.glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= 20, loose
