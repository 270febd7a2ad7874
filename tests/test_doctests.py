"""Every example in the library's docstrings runs, and says what it shows: a docstring example is a closed-form
test, so each one is one here (modules found by walking the package, none listed by hand). The walk imports every
module, so it runs in a process of its own: no import's side effect reaches the other tests."""

from __future__ import annotations

import json
import subprocess
import sys

WALK = """
import doctest, importlib, json, pkgutil, molrl
found = {}
for m in sorted(pkgutil.walk_packages(molrl.__path__, "molrl."), key=lambda m: m.name):
    r = doctest.testmod(importlib.import_module(m.name), report=False, optionflags=doctest.ELLIPSIS)
    found[m.name] = [r.attempted, r.failed]
print(json.dumps(found))
"""


def test_every_docstring_example_of_every_module_passes():
    done = subprocess.run([sys.executable, "-c", WALK], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(found) > 100 and found["molrl.study.verdict"][0] > 0 and found["molrl.demo.library_measure"][0] > 0
    failing = {name: counts for name, counts in found.items() if counts[1]}
    assert not failing, f"docstring examples fail (module: [run, failed]): {failing}; details: {done.stdout[-3000:]}"
