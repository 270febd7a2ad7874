"""The ``gpu`` extra resolves against PyPI together with the pinned core, at the versions the README names.

Slow and networked: ``pip install --dry-run`` resolves ``molrl[gpu]`` from PyPI alone (``--isolated``:
no local index, constraint file or find-links), so a new vLLM, DeepSpeed or torch release that breaks
the pins shows up here before a GPU machine meets it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib

import pytest

from conftest import REPO


def pins(group: list[str]) -> dict[str, str]:
    """``name==version`` requirements as {name: version}."""
    out = {}
    for req in group:
        name, _, version = req.partition("==")
        out[name.strip().lower()] = version.strip()
    return out


@pytest.mark.slow
def test_gpu_extra_resolves_with_the_core_pins_from_pypi(tmp_path):
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core, gpu = pins(project["dependencies"]), pins(project["optional-dependencies"]["gpu"])
    assert set(gpu) == {"vllm", "deepspeed"} and all(gpu.values())  # exact pins, nothing floating
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--ignore-installed", "--quiet",
           "--report", str(report), f"{REPO}[gpu]"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 and re.search(r"Connection|NewConnectionError|Temporary failure|Network is unreachable",
                                          proc.stderr):
        pytest.skip(f"PyPI not reachable: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}"
    chosen = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    for name in ("torch", "transformers", "trl", "peft", "accelerate", "vllm", "deepspeed"):
        want = {**core, **gpu}[name]
        assert chosen[name].split("+")[0] == want, f"{name}: resolved {chosen[name]}, pinned {want}"
    readme = (REPO / "README.md").read_text()
    for name, version in gpu.items():  # the README's "On a GPU" section names the same versions
        assert f"{name}=={version}" in readme or f"{name} {version}" in readme, f"README does not name {name} {version}"
