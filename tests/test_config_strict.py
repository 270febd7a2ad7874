"""Every config object refuses an attribute it does not have (``molrl.config.strict``), enumerated over every section
class of every stage, frozen or not."""

from __future__ import annotations

import dataclasses

import pytest

from molrl.config import load_config
from molrl.config.strict import sections


def roots() -> dict[str, type]:
    from molrl.collect.config import CollectConfig
    from molrl.eval.config import EvalConfig
    from molrl.mol.config import MolConfig
    from molrl.pipeline.config import PipelineConfig
    from molrl.rl.config import RlConfig

    return {"collect": CollectConfig, "mol": MolConfig, "rl": RlConfig, "eval": EvalConfig,
            "pipeline": PipelineConfig}


REQUIRED = {"collect": ["model=tiny:chatml", "data.path=tasks.jsonl"], "pipeline": ["model=m"]}
"""What a stage's config needs to be built at all."""


def instances() -> list[tuple[str, object]]:
    """(dotted path, object) for every section object a default config of each stage holds."""
    found = []
    for stage, root in roots().items():
        todo = [(stage, load_config(root, None, REQUIRED.get(stage, [])))]
        while todo:
            path, obj = todo.pop()
            found.append((path, obj))
            for f in dataclasses.fields(obj):
                value = getattr(obj, f.name)
                for item in value if isinstance(value, list) else [value]:
                    if dataclasses.is_dataclass(item) and not isinstance(item, type):
                        todo.append((f"{path}.{f.name}", item))
    return found


INSTANCES = instances()


def test_the_enumeration_reaches_every_section_class():
    reached = {type(obj) for _, obj in INSTANCES}
    declared = {cls for root in roots().values() for cls, _ in sections(root)}
    missing = {c.__name__ for c in declared - reached}
    # sections a default config leaves empty (an optional block, a union's other arm) are checked by class below
    assert reached <= declared and len(reached) >= 25, missing


@pytest.mark.parametrize("path,obj", INSTANCES, ids=[p for p, _ in INSTANCES])
def test_an_attribute_a_config_object_does_not_have_is_refused(path, obj):
    with pytest.raises(AttributeError) as err:
        obj.no_such_key = 3
    assert "\n" not in str(err.value)
    assert not hasattr(obj, "no_such_key")


@pytest.mark.parametrize("cls", sorted({c for r in roots().values() for c, _ in sections(r)}, key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_every_section_class_refuses_or_is_frozen(cls):
    assert cls.__dataclass_params__.frozen or cls.__setattr__.__name__ == "_refuse_unknown"


def test_an_old_name_set_in_python_is_refused_naming_the_new_one():
    from molrl.rl.config import RlConfig

    cfg = RlConfig()
    with pytest.raises(AttributeError, match=r"RolloutSettings has no key 'turns' \(RlConfig's rollout.turns is now "
                                             r"episode.max_turns\); its keys: partial, "):
        cfg.rollout.turns = 3
    assert cfg.episode.max_turns == 1
    cfg.episode.max_turns = 3  # a key it has is set as before
    assert cfg.episode.max_turns == 3
