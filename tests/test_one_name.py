"""One name for one thing: each key renamed so that every stage spells it alike still loads under its old name, with
one line naming the new one; a run saved under the old name is the same run; the old and the new name given
together with different values are refused (every renamed key: ``tests/test_config.py``)."""

from __future__ import annotations

import logging

import pytest
import yaml

from molrl.collect.config import CollectConfig
from molrl.config import load_config, to_dict
from molrl.errors import ConfigError
from molrl.eval.config import EvalConfig
from molrl.mol.config import MolConfig
from molrl.records.rerun import changed_keys
from molrl.rl.config import RlConfig

STAGES = {"mol": MolConfig, "collect": CollectConfig, "rl": RlConfig, "eval": EvalConfig}
REQUIRED = {"collect": ["model=m", "data.path=t.jsonl"]}
"""The keys a stage cannot load without."""

RENAMES = [
    ("rl", "terms.feedback_ce=0.05", "loss.ce_weight", ["episode.max_turns=2", "episode.turn_tokens=64"]),
    ("rl", "terms.decision_kl=0.3", "loss.kl_weight", []),
    ("rl", "eval.tasks=held_out.jsonl", "eval.data", ["eval.every_steps=1"]),
    ("rl", "eval.max_new_tokens=64", "eval.sampling.max_new_tokens", ["eval.every_steps=1"]),
    ("rl", "rollout.turns=2", "episode.max_turns", []),
    ("rl", "rollout.turn_tokens=64", "episode.turn_tokens", ["episode.max_turns=2"]),
    ("rl", "rollout.episode.max_solutions=2", "episode.max_solutions", ["episode.max_turns=2"]),
    ("eval", "interactive.max_turns=3", "episode.max_turns", ["mode=interactive"]),
    ("collect", "episode.code_task=Solve {prompt} now", "episode.code_prompt", []),
    ("rl", "episode.math_task=Solve {prompt} now", "episode.math_prompt", ["episode.max_turns=2"]),
    ("collect", "samples=3", "sampling.n", []),
    ("rl", "policy.seed=3", "model.seed", []),
    ("rl", "policy.adapter_mode=merge_new", "model.adapter_mode", ["model.adapter=ad"]),
    ("rl", "policy.reference=mol", "model.reference", ["model.adapter=ad", "beta=0.1"]),
]
"""(stage, old key=a value other than the default, the key's one name now, what else the value needs)."""


def _set(data: dict, dotted: str, value) -> None:
    *sections, name = dotted.split(".")
    for s in sections:
        data = data.setdefault(s, {})
    data[name] = value


def _pop(data: dict, dotted: str):
    *sections, name = dotted.split(".")
    for s in sections:
        data = data[s]
    return data.pop(name)


@pytest.mark.parametrize("stage,old,new,extra", RENAMES)
def test_an_old_name_loads_as_the_new_one_with_one_line(stage, old, new, extra, caplog):
    caplog.set_level(logging.WARNING)
    key, value = old.split("=", 1)
    cfg = load_config(STAGES[stage], None, [*REQUIRED.get(stage, []), *extra, old], overrides_from=f"{stage} {key}")
    assert cfg == load_config(STAGES[stage], None, [*REQUIRED.get(stage, []), *extra, f"{new}={value}"])
    lines = [r.getMessage() for r in caplog.records if "old key names" in r.getMessage()]
    assert len(lines) == 1 and f"{key}" in lines[0] and new in lines[0], lines


@pytest.mark.parametrize("stage,old,new,extra", RENAMES)
def test_a_run_saved_under_an_old_name_is_the_same_run(stage, old, new, extra):
    key, value = old.split("=", 1)
    cfg = load_config(STAGES[stage], None, [*REQUIRED.get(stage, []), *extra, old])
    saved = to_dict(cfg)
    _set(saved, key, _pop(saved, new))  # saved before the rename: the old name holds the value
    assert changed_keys(None, saved, cfg) == []
    default = load_config(STAGES[stage], None, [*REQUIRED.get(stage, []), *extra])
    changed = [c.key for c in changed_keys(None, saved, default)]  # and a run with another value is another run
    assert changed and all(k == new or k.startswith(f"{new}.") for k in changed), changed


@pytest.mark.parametrize("stage,old,new,extra", RENAMES)
def test_an_old_and_a_new_name_with_different_values_are_refused_in_a_file(stage, old, new, extra, tmp_path):
    key, value = old.split("=", 1)
    data: dict = {}
    _set(data, key, yaml.safe_load(value))
    _set(data, new, "x-other")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=f"{key} is the old name of {new} and both are set; keep {new}"):
        load_config(STAGES[stage], path, REQUIRED.get(stage, []))


def test_a_key_that_moved_twice_reads_as_its_name_now_in_an_override_and_a_file(caplog, tmp_path):
    """rl's rollout.episode.sampling.max_new_tokens was rollout.turn_tokens, and is episode.turn_tokens."""
    caplog.set_level(logging.WARNING)
    old = load_config(RlConfig, None, ["episode.max_turns=2", "rollout.episode.sampling.max_new_tokens=64"],
                      overrides_from="rl")
    assert old == load_config(RlConfig, None, ["episode.max_turns=2", "episode.turn_tokens=64"])
    lines = [r.getMessage() for r in caplog.records if "old key names" in r.getMessage()]
    assert len(lines) == 1 and "rollout.episode.sampling.max_new_tokens -> episode.turn_tokens" in lines[0], lines
    path = tmp_path / "c.yaml"
    path.write_text("episode: {max_turns: 2}\nrollout: {episode: {sampling: {max_new_tokens: 64}}}\n")
    assert load_config(RlConfig, path) == old


def test_a_block_given_under_its_old_and_new_name_merges_key_by_key(tmp_path):
    """rl's rollout.episode beside episode: different keys are one block, one key given twice is refused by name."""
    path = tmp_path / "c.yaml"
    path.write_text("rollout: {episode: {max_solutions: 2}}\nepisode: {max_turns: 2, feedback: [tests]}\n")
    cfg = load_config(RlConfig, path)
    assert (cfg.episode.max_solutions, cfg.episode.feedback) == (2, ["tests"])
    path.write_text("rollout: {episode: {max_solutions: 2}}\nepisode: {max_solutions: 3}\n")
    with pytest.raises(ConfigError, match="rollout.episode.max_solutions is the old name of episode.max_solutions and "
                                          "both are set; keep episode.max_solutions"):
        load_config(RlConfig, path)


def test_a_code_task_is_worded_once():
    """The episode's code prompt is the single-turn one's wording without the answer's format (the instructions say
    how an episode answers)."""
    from molrl.episode.config import EpisodeRules
    from molrl.tasks.prompts import CODE_INSTRUCTION, CODE_TASK

    assert CODE_INSTRUCTION.startswith(CODE_TASK + " ") and EpisodeRules().code_prompt == CODE_TASK + "\n\n{prompt}"


def test_a_demo_base_made_before_the_prompt_rename_keeps_its_key():
    """A demo base's DONE marker keeps the collection format under the names it was written with."""
    from molrl.demo.collection import CollectionFormat

    key = CollectionFormat(code_prompt="Solve {prompt}").key()
    assert (key["code_task"], key["math_task"]) == ("Solve {prompt}", "{prompt}") and "code_prompt" not in key


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_one_seed_key_seeds_a_tiny_models_weights_in_every_stage(stage):
    """``model.seed`` in every stage's model block, refused beside a checkpoint, whose weights are its own."""
    from molrl.config.blocks import ModelWeights

    cfg = load_config(STAGES[stage], None, [*REQUIRED.get(stage, []), "model=tiny:chatml", "model.seed=3"])
    assert isinstance(cfg.model, ModelWeights) and cfg.model.seed == 3
    with pytest.raises(ConfigError, match="model.seed=3 seeds a tiny: model's random weights, and "
                                          "model.path='ckpt' is a checkpoint with its own; remove model.seed"):
        load_config(STAGES[stage], None, [*REQUIRED.get(stage, []), "model=ckpt", "model.seed=3"])


@pytest.mark.parametrize("stage", ["collect", "eval"])
def test_a_tiny_models_weights_follow_model_seed_not_sampling_seed(stage, monkeypatch):
    """collect and eval load a tiny model with ``model.seed``; ``sampling.seed`` seeds their sampling only."""
    import molrl.models

    seeds = []

    def load_model(*args, seed=0, **kwargs):
        seeds.append(seed)
        raise _Stop

    monkeypatch.setattr(molrl.models, "load_model", load_model)
    cfg = load_config(STAGES[stage], None, [*REQUIRED.get(stage, []), "model=tiny:chatml", "model.seed=3",
                                            "sampling.seed=5", "engine=transformers"])
    with pytest.raises(_Stop):
        from molrl.engines.builder import open_generator

        open_generator(stage, cfg, 1, batch_size=1)
    assert seeds == [3]


class _Stop(Exception):
    """Raised in place of a model: the load is all the test watches."""
