"""Every molrl module imports cleanly on its own, in any order: no import cycles between modules."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import molrl

MODULES = sorted(m.name for m in pkgutil.walk_packages(molrl.__path__, "molrl.")
                 if not m.name.startswith("molrl.sandbox.runtime"))  # the sandbox's own side: run in its processes

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
