"""One vocabulary across stages: every stage exposes the shared config blocks under the same names and types, and
the old names still load, as one line naming the new ones, and a run saved under them is the same run."""

from __future__ import annotations

import dataclasses
import logging
import typing

import pytest

from molrl.collect.config import CollectConfig
from molrl.config import load_config, to_dict
from molrl.config_blocks import ModelSource
from molrl.config_renames import unoptional
from molrl.eval.config import EvalConfig
from molrl.mol.config import MolConfig
from molrl.rerun import changed_keys
from molrl.rl.config import RlConfig
from molrl.sandbox import SandboxConfig

STAGES = {"mol": MolConfig, "collect": CollectConfig, "rl": RlConfig, "eval": EvalConfig}
"""Every stage's config class, by its command's name."""
SHARED = {"model": {"mol", "collect", "rl", "eval"}, "threads": {"mol", "collect", "rl", "eval"},
          "engine": {"collect", "rl", "eval"}, "sandbox": {"collect", "rl", "eval"}}
"""The shared blocks and the stages that have each (the ones that generate have an engine; the ones that run code a
sandbox)."""
OLD_NAMES = {"mol": ["dtype=bfloat16"], "collect": ["adapter=a", "dtype=bfloat16"],
             "eval": ["adapter=a", "dtype=bfloat16"],
             "rl": ["policy.base=m", "policy.mol_adapter=a", "policy.dtype=bfloat16", "reward.sandbox_workers=3",
                    "reward.timeout_s=5"]}
"""Per stage, old keys that moved into the shared blocks."""
REQUIRED = {"collect": ["tasks=t.jsonl", "out=o.jsonl"]}


def field_type(cls: type, name: str) -> typing.Any:
    return unoptional(typing.get_type_hints(cls)[name])


@pytest.mark.parametrize("block", sorted(SHARED))
def test_every_stage_that_has_a_shared_block_has_it_under_one_name_and_one_type(block):
    have = {stage for stage, cls in STAGES.items() if block in {f.name for f in dataclasses.fields(cls)}}
    assert have == SHARED[block]
    types = {stage: field_type(STAGES[stage], block) for stage in have}
    assert len(set(types.values())) == 1, types
    if block == "model":
        assert set(types.values()) == {ModelSource}
    if block == "sandbox":
        assert set(types.values()) == {SandboxConfig}


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_no_stage_keeps_a_model_key_outside_the_model_block(stage):
    names = {f.name for f in dataclasses.fields(STAGES[stage])}
    assert not names & {"adapter", "dtype", "base", "mol_adapter"}
    for f in dataclasses.fields(STAGES[stage]):
        section = field_type(STAGES[stage], f.name)
        if dataclasses.is_dataclass(section) and section is not ModelSource:
            inner = {g.name for g in dataclasses.fields(section)}
            assert not inner & {"base", "mol_adapter", "dtype", "sandbox_workers"}, (f.name, inner)


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_a_model_given_as_a_path_is_the_model_block(stage):
    cfg = load_config(STAGES[stage], None, [*REQUIRED.get(stage, []), "model=some/model", "model.dtype=bfloat16"])
    assert cfg.model == ModelSource("some/model", dtype="bfloat16")
    assert STAGES[stage](**{**({"tasks": "t", "out": "o"} if stage == "collect" else {}), "model": "p"}).model.path == "p"


@pytest.mark.parametrize("stage", sorted(OLD_NAMES))
def test_old_keys_load_with_one_line_and_a_run_saved_under_them_is_the_same_run(stage, caplog):
    cls, required = STAGES[stage], REQUIRED.get(stage, [])
    caplog.set_level(logging.WARNING)
    old = load_config(cls, None, [*required, *OLD_NAMES[stage]], overrides_from=f"{stage} old keys")
    lines = [r.getMessage() for r in caplog.records if "old key names" in r.getMessage()]
    assert len(lines) == 1 and all(o.split("=")[0] in lines[0] for o in OLD_NAMES[stage])
    saved = to_dict(old)  # the run as it would have been saved before: the old names, and no new blocks
    for item in OLD_NAMES[stage]:
        key, value = item.split("=")
        *sections, name = key.split(".")
        node = saved
        for s in sections:
            node = node.setdefault(s, {})
        node[name] = value if name != "timeout_s" and name != "sandbox_workers" else float(value) if name == "timeout_s" else int(value)
    if stage == "rl":
        del saved["sandbox"]
        saved["model"] = {}
    else:
        saved["model"] = saved["model"]["path"]
    saved = {k: v for k, v in saved.items() if v != {}}
    assert changed_keys(stage, saved, old) == []
    changed = load_config(cls, None, [*required, *OLD_NAMES[stage], "model.dtype=float16"])
    assert [c.key for c in changed_keys(stage, saved, changed)] == ["model.dtype"]


def _declared_sections(cls: type, path: str = "") -> list[tuple[str, typing.Any]]:
    """(dotted key, default) of every section of ``cls`` (nested too) whose field's default_factory makes something
    other than its class's plain default: the sections a partial setting must not reset."""
    found = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = unoptional(hints[f.name])
        if not dataclasses.is_dataclass(tp):
            continue
        key = f"{path}{f.name}"
        if f.default_factory is not dataclasses.MISSING:
            made = f.default_factory()
            try:
                plain = tp()
            except TypeError:
                plain = None
            if made != plain:
                found.append((key, made))
        found += _declared_sections(tp, key + ".")
    return found


def test_the_sections_with_their_own_defaults_are_enumerated():
    keys = {f"{stage}:{key}" for stage, cls in STAGES.items() for key, _ in _declared_sections(cls)}
    assert {"rl:sandbox", "rl:rollout.episode", "rl:model", "mol:model"} <= keys, keys


@pytest.mark.parametrize("stage,key,default", [(stage, key, default) for stage, cls in STAGES.items()
                                               for key, default in _declared_sections(cls)])
def test_a_section_given_in_part_keeps_the_rest_of_its_declared_default(stage, key, default):
    """Setting one key of a section whose declared default differs from its class's (rl's sandbox: 4 workers and 6 s;
    rl's rollout.episode: 2 turns) leaves every other key at the declared default, not at the class's."""
    plain = {f.name: getattr(default, f.name) for f in dataclasses.fields(default)
             if isinstance(getattr(default, f.name), (int, float, str)) and not isinstance(getattr(default, f.name), bool)}
    name, value = next(iter(plain.items()))
    cfg = load_config(STAGES[stage], None, [*REQUIRED.get(stage, []), f"{key}.{name}={value}"])
    section = cfg
    for part in key.split("."):
        section = getattr(section, part)
    assert section == default
