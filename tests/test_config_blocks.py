"""One vocabulary across stages: every stage exposes the shared config blocks under the same names and types, and
the old names still load, as one line naming the new ones, and a run saved under them is the same run."""

from __future__ import annotations

import dataclasses
import logging
import re
import typing
from pathlib import Path

import pytest
import yaml

from molrl.collect.config import CollectConfig
from molrl.config import load_config, to_dict
from molrl.errors import ConfigError
from molrl.config.blocks import (BENCHMARK_FORMATS, LoraAdapterConfig, ModelSource, ModelWeights, TaskSource,
                                 TrainConfig)
from molrl.config.renames import Retired, unoptional
from molrl.episode.config import EpisodeRules
from molrl.eval.config import EvalConfig
from molrl.mol.config import MolConfig
from molrl.records.rerun import changed_keys
from molrl.rl.config import RlConfig
from molrl.engines.sampling import SamplingConfig
from molrl.sandbox import SandboxConfig
from molrl.task_types import JsonlSpec

STAGES = {"mol": MolConfig, "collect": CollectConfig, "rl": RlConfig, "eval": EvalConfig}
"""Every stage's config class, by its command's name."""
SHARED = {"model": {"mol", "collect", "rl", "eval"}, "threads": {"mol", "collect", "rl", "eval"},
          "engine": {"collect", "rl", "eval"}, "sandbox": {"collect", "rl", "eval"},
          "sampling": {"collect", "rl", "eval"}, "thinking": {"mol", "collect", "rl", "eval"},
          "train": {"mol", "rl"}, "lora": {"mol", "rl"}, "data": {"collect", "rl", "eval"},
          "output_dir": {"mol", "collect", "rl", "eval"}, "episode": {"collect", "rl", "eval"}}
"""The shared blocks and the stages that have each (the ones that generate have an engine and a sampling; the ones
that run code a sandbox)."""
BLOCK_TYPES = {"model": ModelWeights, "sandbox": SandboxConfig, "sampling": SamplingConfig, "train": TrainConfig,
               "lora": LoraAdapterConfig, "data": TaskSource, "episode": EpisodeRules}
"""The type of each shared block that is a section."""
OLD_NAMES = {"mol": ["dtype=bfloat16", "data.enable_thinking=true"],
             "collect": ["adapter=a", "dtype=bfloat16", "episode.sampling.temperature=0.5", "episode.seed=3",
                         "episode.enable_thinking=true", "tasks=t.jsonl", "format=mbpp", "limit=3", "split=test",
                         "jsonl.kind=code", "out=runs/o.jsonl"],
             "eval": ["adapter=a", "dtype=bfloat16", "enable_thinking=true"],
             "rl": ["policy.base=m", "policy.mol_adapter=a", "policy.dtype=bfloat16", "reward.sandbox_workers=3",
                    "reward.timeout_s=5", "num_generations=16", "temperature=0.8", "top_p=0.9",
                    "max_completion_length=64", "enable_thinking=true"]}
"""Per stage, old keys that moved into the shared blocks."""
OWN_MEANING = {"data": {"mol"}}
"""Per block name, the stages where the name holds something else, stated in docs/config.md: mol's ``data`` the
traces it trains on (not tasks)."""
PER_NAME = {"data": {"eval"}}
"""Per block name, the stages that hold one such block per name (eval's ``data``: one task source a benchmark)."""
ADDED_BLOCKS = {"rl": ["sandbox", "sampling", "thinking"], "collect": ["sampling", "thinking", "data", "output_dir"],
                "mol": ["thinking"],
                "eval": ["thinking"]}
"""Per stage, the blocks a run saved under the old names does not have."""
REQUIRED = {"collect": ["model=m", "data.path=t.jsonl"]}


def field_type(cls: type, name: str) -> typing.Any:
    return unoptional(typing.get_type_hints(cls)[name])


@pytest.mark.parametrize("block", sorted(SHARED))
def test_every_stage_that_has_a_shared_block_has_it_under_one_name_and_one_type(block):
    have = {stage for stage, cls in STAGES.items() if block in {f.name for f in dataclasses.fields(cls)}}
    have -= OWN_MEANING.get(block, set())
    assert have == SHARED[block]
    types = {stage: field_type(STAGES[stage], block) for stage in have}
    for stage in PER_NAME.get(block, set()):
        assert typing.get_origin(types[stage]) is dict and typing.get_args(types[stage])[0] is str, types[stage]
        types[stage] = typing.get_args(types[stage])[1]
    if block not in BLOCK_TYPES:
        assert len(set(types.values())) == 1, types
        return
    # a stage's variant of a block narrows ranges to what the stage can take (rl's sampling: n >= 2, never greedy)
    # and adds the keys only that stage reads (mol's train: epochs, grad_accumulation; mol's lora: enabled), the
    # block's keys and their meaning its own
    base = BLOCK_TYPES[block]
    assert all(issubclass(tp, base) for tp in types.values()), types
    keys = {stage: [f.name for f in dataclasses.fields(tp)] for stage, tp in types.items()}
    own = [f.name for f in dataclasses.fields(base)]
    assert all(k[:len(own)] == own for k in keys.values()), keys


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_no_stage_keeps_a_model_key_outside_the_model_block(stage):
    names = {f.name for f in dataclasses.fields(STAGES[stage])}
    assert not names & {"adapter", "dtype", "base", "mol_adapter"}
    for f in dataclasses.fields(STAGES[stage]):
        section = field_type(STAGES[stage], f.name)
        if dataclasses.is_dataclass(section) and not issubclass(section, ModelWeights):
            inner = {g.name for g in dataclasses.fields(section)}
            assert not inner & {"base", "mol_adapter", "dtype", "sandbox_workers"}, (f.name, inner)


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_a_model_given_as_a_path_is_the_model_block(stage):
    cfg = load_config(STAGES[stage], None, [*REQUIRED.get(stage, []), "model=some/model", "model.dtype=bfloat16"])
    assert cfg.model == type(cfg.model)("some/model", dtype="bfloat16")
    needs = {"data": TaskSource(Path("t"))} if stage == "collect" else {}
    assert STAGES[stage](**{**needs, "model": "p"}).model.path == "p"


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
        node[name] = yaml.safe_load(value)
    for block in ADDED_BLOCKS.get(stage, []):
        del saved[block]
    if stage == "rl":
        saved["model"] = {}
    else:
        saved["model"] = saved["model"]["path"]
    saved = {k: v for k, v in saved.items() if v != {}}
    assert changed_keys(stage, saved, old) == []
    changed = load_config(cls, None, [*required, *(o.replace("=bfloat16", "=float16") for o in OLD_NAMES[stage])])
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
    assert {"rl:sandbox", "rl:episode", "rl:model", "mol:model"} <= keys, keys


@pytest.mark.parametrize("stage,key,default", [(stage, key, default) for stage, cls in STAGES.items()
                                               for key, default in _declared_sections(cls)])
def test_a_section_given_in_part_keeps_the_rest_of_its_declared_default(stage, key, default):
    """Setting one key of a section whose declared default differs from its class's (rl's sandbox: 4 workers and 6 s;
    rl's episode: one solution) leaves every other key at the declared default, not at the class's."""
    plain = {f.name: getattr(default, f.name) for f in dataclasses.fields(default)
             if isinstance(getattr(default, f.name), (int, float, str)) and not isinstance(getattr(default, f.name), bool)}
    name, value = next(iter(plain.items()))
    cfg = load_config(STAGES[stage], None, [*REQUIRED.get(stage, []), f"{key}.{name}={value}"])
    section = cfg
    for part in key.split("."):
        section = getattr(section, part)
    assert section == default


RETIRED = [(stage, key) for stage, cls in STAGES.items() for key in getattr(cls, "RETIRED_KEYS", {})]
"""Every key a stage dropped because it never had an effect, enumerated."""


def test_the_retired_keys_are_enumerated():
    assert {"collect:episode.sampling.seed", "eval:interactive.seed", "rl:rollout.episode.seed",
            "eval:interactive.enable_thinking", "rl:rollout.episode.enable_thinking", "rl:lora.enabled",
            "rl:train.epochs", "rl:train.grad_accumulation"} <= {
        f"{stage}:{key}" for stage, key in RETIRED}


def _retired_value(stage: str, key: str) -> typing.Any:
    """A value an old config may hold for a retired key: the one the stage took (``Retired.only``), else any."""
    entry = STAGES[stage].RETIRED_KEYS[key]
    return entry.only[0] if isinstance(entry, Retired) else 1


@pytest.mark.parametrize("stage,key", RETIRED)
def test_a_retired_key_loads_named_in_one_line_and_a_run_saved_with_it_is_the_same_run(stage, key, caplog):
    cls, required = STAGES[stage], REQUIRED.get(stage, [])
    caplog.set_level(logging.WARNING)
    value = _retired_value(stage, key)
    cfg = load_config(cls, None, [*required, f"{key}={yaml.safe_dump(value).splitlines()[0]}"],
                      overrides_from=f"{stage} retired")
    assert cfg == load_config(cls, None, required)
    lines = [r.getMessage() for r in caplog.records if "old key names" in r.getMessage()]
    assert len(lines) == 1 and f"{key} dropped (" in lines[0]
    saved = to_dict(cfg)
    *sections, name = key.split(".")
    node = saved
    for part in sections:
        node = node.setdefault(part, {})
    node[name] = value
    assert changed_keys(stage, saved, cfg) == []


OLD_FILES = {
    "collect": ("tasks: t.jsonl\nout: o.jsonl\nmodel: m\nepisode:\n  max_turns: 3\n  seed: 2\n"
                "  sampling: {temperature: 0.7, top_k: 20, max_new_tokens: 64, seed: 9, stop: [END]}\n",
                "tasks: t.jsonl\nout: o.jsonl\nmodel: m\nepisode: {max_turns: 3}\n"
                "sampling: {temperature: 0.7, top_k: 20, max_new_tokens: 64, seed: 2, stop: [END]}\n"),
    "rl": ("num_generations: 16\ntemperature: 1.0\ntop_p: 0.95\nmax_completion_length: 96\n"
           "rollout:\n  turns: 2\n  episode:\n    max_solutions: 1\n    seed: 5\n"
           "    sampling: {max_new_tokens: 48, stop: [END], temperature: 0.3}\n",
           "sampling: {n: 16, temperature: 1.0, top_p: 0.95, max_new_tokens: 96, stop: [END]}\n"
           "episode: {max_turns: 2, turn_tokens: 48, max_solutions: 1}\n"),
    "eval": ("mode: interactive\nsampling: {n: 2}\ninteractive:\n  max_turns: 3\n  seed: 4\n"
             "  sampling: {temperature: 0.1, stop: [END]}\n",
             "mode: interactive\nsampling: {n: 2, stop: [END]}\nepisode: {max_turns: 3}\n"),
}
"""Per stage, a config file under the names before the shared sampling block, and the same config now."""


@pytest.mark.parametrize("stage", sorted(OLD_FILES))
def test_a_config_file_under_the_old_sampling_names_is_the_same_config(stage, tmp_path):
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text(OLD_FILES[stage][0])
    new.write_text(OLD_FILES[stage][1])
    assert load_config(STAGES[stage], old) == load_config(STAGES[stage], new)


def test_a_key_given_under_its_old_and_new_name_with_one_value_is_read_once_and_two_values_are_refused(tmp_path):
    """A saved config held both names (eval's interactive.sampling.stop beside sampling.stop, both empty)."""
    both = tmp_path / "both.yaml"
    both.write_text("interactive: {sampling: {stop: [X]}}\nsampling: {stop: [X]}\n")
    assert load_config(EvalConfig, both).sampling.stop == ["X"]
    both.write_text("interactive: {sampling: {stop: [X]}}\nsampling: {stop: [Y]}\n")
    with pytest.raises(ConfigError, match="interactive.sampling.stop is the old name of sampling.stop and both are"):
        load_config(EvalConfig, both)


@pytest.mark.parametrize("overrides,says", [
    (["sampling.n=1"], "sampling.n=1 is out of range; allowed: an integer in [2, 1000000000]"),
    (["sampling.temperature=0"], "sampling.temperature=0.0 is out of range; allowed: a number in [0.01, 100]"),
    (["sampling.seed=3"], "sampling.seed=3 is out of range; allowed: an integer in [0, 0]"),
    (["sampling.stop=[END]"], "sampling.stop=['END'] does nothing with episode.max_turns=1: it is read only with "
                              "episode.max_turns > 1"),
])
def test_the_sampling_keys_rl_cannot_honour_are_refused(overrides, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_config(RlConfig, None, overrides)


@pytest.mark.parametrize("stage,key,allowed", [
    ("rl", "sampling.n", "an integer in [2, 1000000000]"), ("rl", "sampling.temperature", "a number in [0.01, 100]"),
    ("rl", "sampling.seed", "an integer in [0, 0]"),
])
def test_describe_shows_the_range_a_stage_takes(stage, key, allowed):
    from molrl.config import describe

    lines = describe(STAGES[stage])
    at = next(i for i, line in enumerate(lines) if line.startswith(f"{key}: "))
    assert f"    # allowed: {allowed}" in lines[at + 1:at + 4]


def test_collect_runs_sampling_n_episodes_a_task():
    assert load_config(CollectConfig, None, [*REQUIRED["collect"], "sampling.n=3"]).sampling.n == 3


@pytest.mark.parametrize("stage,key", [("rl", "rollout.episode.max_turns"), ("rl", "rollout.episode.max_total_tokens"),
                                       ("rl", "rollout.episode.batch_size"), ("eval", "interactive.batch_size")])
def test_an_episode_key_the_stage_does_not_read_is_not_shown_and_an_old_config_holding_it_loads(stage, key, caplog):
    from molrl.config import describe

    assert not any(line.startswith(f"{key}: ") for line in describe(STAGES[stage]))
    with caplog.at_level(logging.WARNING):
        load_config(STAGES[stage], None, [*REQUIRED.get(stage, []), f"{key}=3"])
    assert f"{key} dropped (" in caplog.text


def test_rl_top_k_reaches_trl():
    from molrl.rl.run import trl_args

    cfg = load_config(RlConfig, None, ["sampling.top_k=20", "sampling.top_p=0.8"])
    args = trl_args(cfg, Path("/tmp/unused"), cuda=False)
    assert (args.top_k, args.top_p, args.num_generations, args.max_completion_length, args.temperature) == (
        20, 0.8, 8, 1024, 0.9)


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_thinking_is_one_top_level_key_off_by_default_in_every_stage(stage):
    cfg = load_config(STAGES[stage], None, REQUIRED.get(stage, []))
    assert cfg.thinking is False
    for f in dataclasses.fields(STAGES[stage]):
        section = field_type(STAGES[stage], f.name)
        if dataclasses.is_dataclass(section):
            assert "enable_thinking" not in {g.name for g in dataclasses.fields(section)}, f.name


BEFORE_ONE_TRAIN = {"mol": {"train": ["warmup_steps"], "lora": []},
                    "rl": {"train": ["optim", "warmup_ratio", "bf16"], "lora": []}}
"""Per training stage, the keys its train and lora sections did not have before they became one type each."""


@pytest.mark.parametrize("stage", sorted(BEFORE_ONE_TRAIN))
def test_a_run_saved_before_train_and_lora_were_one_type_is_the_same_run(stage):
    cfg = load_config(STAGES[stage], None, [])
    saved = to_dict(cfg)
    for section, keys in BEFORE_ONE_TRAIN[stage].items():
        for key in keys:
            del saved[section][key]
    assert changed_keys(stage, saved, cfg) == []


@pytest.mark.parametrize("key", ["train.epochs", "train.grad_accumulation", "lora.enabled"])
def test_rl_does_not_show_mol_s_train_and_lora_keys(key):
    from molrl.config import describe

    assert any(line.startswith(f"{key}: ") for line in describe(MolConfig))
    assert not any(line.startswith(f"{key}: ") for line in describe(RlConfig))


@pytest.mark.parametrize("override,says", [
    ("train.grad_accumulation=4", "train.grad_accumulation=4: the RL stage accumulates"),
    ("train.epochs=2", "epochs are MoL's; remove it"),
    ("train.max_steps=-1", "train.max_steps=-1 is out of range; allowed: an integer in [1, 1000000000]"),
    ("lora.enabled=false", "lora.enabled=False: the RL stage trains a LoRA adapter"),
])
def test_the_train_and_lora_values_rl_cannot_honour_are_refused(override, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_config(RlConfig, None, [override])


@pytest.mark.parametrize("held", ["train: {epochs: 1.0, grad_accumulation: null}\nlora: {enabled: true}\n",
                                  "train: {epochs: 2}\n", "lora: {enabled: false}\n"])
def test_a_file_holding_mol_s_keys_loads_in_rl_at_the_value_rl_took_and_is_refused_at_any_other(held, tmp_path):
    path = tmp_path / "rl.yaml"
    path.write_text(held)
    if "2" in held or "false" in held:
        with pytest.raises(ConfigError, match=re.escape(f"{path}: ")):
            load_config(RlConfig, path)
    else:
        assert load_config(RlConfig, path) == load_config(RlConfig, None)


def test_mol_needs_a_count_of_accumulated_micro_batches_and_one_warm_up():
    with pytest.raises(ConfigError, match="train.grad_accumulation must be an integer, got None"):
        load_config(MolConfig, None, ["train.grad_accumulation=null"])
    with pytest.raises(ConfigError, match="set one of them"):
        load_config(MolConfig, None, ["train.warmup_steps=5"])
    assert load_config(MolConfig, None, ["train.warmup_steps=5", "train.warmup_ratio=0"]).train.warmup() == 5


def test_rl_train_keys_reach_trl_and_its_defaults_are_trl_s():
    from molrl.rl.run import trl_args

    args = trl_args(load_config(RlConfig, None, []), Path("/tmp/unused"), cuda=False)
    assert (args.optim, args.warmup_steps, args.bf16, args.gradient_accumulation_steps) == (
        "adamw_torch_fused", 0, False, 1)
    cfg = load_config(RlConfig, None, ["train.optim=sgd", "train.warmup_ratio=0.1", "train.bf16=true"])
    args = trl_args(cfg, Path("/tmp/unused"), cuda=False)
    assert (args.optim, args.warmup_steps, args.bf16) == ("sgd", 0.1, True)
    unset = load_config(RlConfig, None, []).train  # bf16 unset: a bfloat16 model on a GPU, as before
    assert unset.mixed_bf16("bfloat16", cuda=True) and not unset.mixed_bf16("bfloat16", cuda=False)
    assert not unset.mixed_bf16("float32", cuda=True)


@pytest.mark.parametrize("out,output_dir", [("runs/t/mbpp.jsonl", "runs/t/mbpp"), ("runs/p/collect/traces.jsonl",
                                                                                  "runs/p/collect"),
                                            ("traces.jsonl", ".")])
def test_collect_s_old_trace_file_reads_as_its_output_dir(out, output_dir):
    cfg = load_config(CollectConfig, None, [*REQUIRED["collect"], f"out={out}"])
    assert cfg.output_dir == Path(output_dir)


def test_collect_s_old_trace_file_that_is_not_jsonl_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="'t.txt' cannot be read as output_dir; set output_dir"):
        load_config(CollectConfig, None, [*REQUIRED["collect"], "out=t.txt"])


@pytest.mark.parametrize("name", sorted(BENCHMARK_FORMATS))
def test_an_eval_benchmark_given_as_a_file_is_a_task_source_in_its_own_format(name):
    cfg = load_config(EvalConfig, None, [f"data.{name}=f.jsonl", "data.mine=g.jsonl"])
    assert cfg.data[name] == TaskSource(Path("f.jsonl"), format=BENCHMARK_FORMATS[name])
    assert cfg.data["mine"] == TaskSource(Path("g.jsonl"), format="jsonl")  # a name of the user's own: molrl JSONL
    spec = load_config(EvalConfig, None, [f"data.{name}=f.jsonl", f"data.{name}.spec.kind=code"]).data[name]
    assert spec.format == "jsonl" and spec.spec.kind == "code"  # fields named: the file is molrl JSONL
    given = load_config(EvalConfig, None, [f"data.{name}=f.jsonl", f"data.{name}.format=jsonl"]).data[name]
    assert given.format == "jsonl"


def test_a_file_given_over_a_written_out_task_source_keeps_its_other_keys(tmp_path):
    path = tmp_path / "eval.yaml"
    path.write_text("data:\n  mbpp: {path: a.jsonl, split: validation, limit: 5}\n")
    cfg = load_config(EvalConfig, path, ["data.mbpp=b.jsonl"])
    assert cfg.data["mbpp"] == TaskSource(Path("b.jsonl"), format="mbpp", split="validation", limit=5)
    rl = load_config(RlConfig, None, ["data=t.jsonl", "data.format=mbpp"])
    assert rl.data == TaskSource(Path("t.jsonl"), format="mbpp")  # collect's and rl's data take the same shorthand


@pytest.mark.parametrize("how", ["overrides", "yaml"])
def test_evals_old_custom_key_is_the_benchmarks_spec(how, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    if how == "overrides":
        cfg = load_config(EvalConfig, None, ["data.qa=q.jsonl", "custom.qa.kind=code", "custom.qa.prompt_field=q"])
    else:
        path = tmp_path / "eval.yaml"
        path.write_text("data: {qa: q.jsonl}\ncustom:\n  qa: {kind: code, prompt_field: q}\n")
        cfg = load_config(EvalConfig, path)
    assert cfg.data["qa"] == TaskSource(Path("q.jsonl"), format="jsonl", spec=JsonlSpec(kind="code", prompt_field="q"))
    lines = [r.getMessage() for r in caplog.records if "old key names" in r.getMessage()]
    assert len(lines) == 1 and "data.qa.spec" in lines[0]


def test_an_eval_run_saved_before_its_data_was_a_task_source_is_the_same_run():
    cfg = load_config(EvalConfig, None, ["model=m", "benchmarks=[mbpp,qa]", "data.mbpp=m.jsonl", "data.qa=q.jsonl",
                                         "data.qa.spec.kind=code"])
    saved = to_dict(cfg)  # as an eval run saved it before: each file a string, a JSONL's fields under custom
    saved["data"] = {"mbpp": "m.jsonl", "qa": "q.jsonl"}
    saved["custom"] = {"qa": to_dict(JsonlSpec(kind="code"))}
    assert changed_keys("eval", saved, cfg) == []
    saved["custom"]["qa"]["kind"] = "math"
    assert [c.key for c in changed_keys("eval", saved, cfg)] == ["data.qa.spec.kind"]
    del saved["custom"]  # read as mbpp and a molrl JSONL of maths: the format of neither changed
    assert [c.key for c in changed_keys("eval", saved, cfg)] == ["data.qa.spec.kind"]
    saved["custom"] = {}  # every eval run saved before held its default, an empty mapping
    assert [c.key for c in changed_keys("eval", saved, cfg)] == ["data.qa.spec.kind"]
    saved["data"]["qa"] = {"path": "q.jsonl", "spec": {"kind": "code"}}
    assert changed_keys("eval", saved, cfg) == []


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_a_model_path_given_over_a_written_out_model_block_keeps_its_other_keys(stage, tmp_path):
    adapter = None if stage == "mol" else Path("ad")  # mol trains its own adapter on a plain base
    path = tmp_path / "stage.yaml"
    path.write_text(f"model: {{path: a, adapter: {adapter or 'null'}, dtype: bfloat16}}\n")
    cfg = load_config(STAGES[stage], path, [*REQUIRED.get(stage, []), "model=b"])
    assert cfg.model == (ModelWeights("b", dtype="bfloat16") if stage == "mol"
                         else type(cfg.model)("b", adapter=adapter, dtype="bfloat16"))
    assert isinstance(cfg.model, ModelSource if stage != "mol" else ModelWeights)


def test_mol_shows_no_model_adapter_and_a_saved_run_holding_none_loads():
    from molrl.config import describe

    assert not any(line.startswith("model.adapter: ") for line in describe(MolConfig))
    assert load_config(MolConfig, None, ["model.adapter=null"]) == load_config(MolConfig, None, [])
    with pytest.raises(ConfigError, match=re.escape("model.adapter='ad': MoL trains a new adapter on the base")):
        load_config(MolConfig, None, ["model.adapter=ad"])


def test_a_multi_turn_run_whose_first_turn_can_take_every_token_is_named(caplog):
    with caplog.at_level(logging.WARNING):
        load_config(RlConfig, None, ["episode.max_turns=2", "episode.turn_tokens=128", "sampling.max_new_tokens=128"])
    assert "episode.turn_tokens never cuts a turn" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        load_config(RlConfig, None, ["episode.max_turns=2", "episode.turn_tokens=64", "sampling.max_new_tokens=128"])
    assert "never cuts a turn" not in caplog.text
