"""The RL stage's shape: small modules, a thin trainer that never names an algorithm or a rollout policy."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from molrl.rl.algorithms import ALGORITHMS
from molrl.rl.rollouts import ROLLOUTS

MOLRL = Path(__file__).resolve().parents[1] / "src" / "molrl"
RL = MOLRL / "rl"


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def test_no_module_class_or_function_is_too_long():
    """Every package, not the RL stage alone: modules up to 400 lines, classes 300, functions 60."""
    too_long = []
    for path in sorted(MOLRL.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > 400:
            too_long.append(f"{path.relative_to(MOLRL)}: {lines} lines")
        for node in ast.walk(_tree(path)):
            if not isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            if isinstance(node, ast.ClassDef) and size > 300:
                too_long.append(f"{path.relative_to(MOLRL)}:{node.lineno} class {node.name}: {size} lines")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and size > 60:
                too_long.append(f"{path.relative_to(MOLRL)}:{node.lineno} {node.name}: {size} lines")
    assert not too_long, too_long


@pytest.mark.parametrize("module", ["trainer.py", "run.py"])
def test_the_trainer_and_the_stage_never_name_an_algorithm_or_a_rollout_policy(module):
    """A branch on a name (``cfg.algorithm == "opd"``) belongs in the algorithm's or the policy's own class."""
    names = set(ALGORITHMS) | set(ROLLOUTS)
    code = _tree(RL / module)
    docstrings = {id(n.body[0].value) for n in ast.walk(code)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
                  and isinstance(n.body[0], ast.Expr)}
    named = [(n.lineno, n.value) for n in ast.walk(code)
             if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
             and n.value in names]
    assert not named, named


def test_the_algorithm_names_are_written_once_and_everything_reads_them():
    """The config's allowed values, ``--describe`` and docs/rl.md's table read ``names.ENTRIES``; the registry
    resolves each to its class; no other module spells the list."""
    import re
    import typing

    from molrl.config import describe
    from molrl.rl.algorithms.names import ENTRIES
    from molrl.rl.config import RlConfig

    assert typing.get_args(typing.get_type_hints(RlConfig)["algorithm"]) == tuple(ENTRIES)
    assert {name: cls.__name__ for name, cls in ALGORITHMS.items()} == {n: e.cls for n, e in ENTRIES.items()}
    from molrl.rl.algorithms.grpo import GroupRelative

    assert {n: issubclass(ALGORITHMS[n], GroupRelative) for n in ENTRIES} == {n: e.from_rewards for n, e in ENTRIES.items()}
    shown = describe(RlConfig)
    line = shown[shown.index(next(x for x in shown if x.startswith("algorithm:"))) + 1]
    assert line == f"    # allowed: one of {', '.join(ENTRIES)}"
    table = (MOLRL.parents[1] / "docs" / "rl.md").read_text().split("## Algorithms")[1].split("\n## ")[0]
    assert re.findall(r"^\| `(\w+)`", table, re.M)[1:] == list(ENTRIES)  # the header's `algorithm`, then each
    spelled = [str(p.relative_to(MOLRL)) for p in MOLRL.rglob("*.py")
               if '"dr_grpo", "dr_grpo_std"' in p.read_text() and p.name != "names.py"]
    assert spelled == []


def test_every_registered_class_lives_in_its_own_module():
    modules = [cls.__module__ for cls in ROLLOUTS.values()]
    assert len(set(modules)) == len(modules)
    assert {cls.__module__.rsplit(".", 1)[-1] for cls in ALGORITHMS.values()} == {"grpo", "opd", "ppo"}


TRL_COPIES = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_completion_length",
              "num_generations", "num_generations_eval", "mask_truncated_completions", "beta", "epsilon_low",
              "epsilon_high", "num_iterations")
"""The run's settings TRL's trainer keeps a copy of (from ``molrl.rl.run.trl_args``): TRL's own code reads them."""


def test_molrl_reads_the_runs_settings_from_its_config_never_back_from_trl():
    """Every file of the RL package: ``trainer.top_p`` (or the trainer's ``self.top_p``) is a copy that can drift
    from ``RlConfig.sampling.top_p``; molrl's code reads the config."""
    import re

    copies = "|".join(TRL_COPIES)
    found = {}
    for path in sorted(RL.rglob("*.py")):
        pattern = rf"\b(trainer|self)\.({copies})\b" if path.name == "trainer.py" else rf"\btrainer\.({copies})\b"
        hits = sorted({m.group(0) for m in re.finditer(pattern, path.read_text())})
        if hits:
            found[str(path.relative_to(RL))] = hits
    assert found == {}
