"""Keys exist only where they act (``molrl.config.idle``): every key of the rule table, set where it cannot act, is
refused in one line naming it, its value, the setting that leaves it idle and the fix; set where it acts, it loads."""

from __future__ import annotations

import logging
import typing
from pathlib import Path

import pytest

from molrl.config import ConfigError, load_config
from molrl.config.idle import RULES, declared_default, idle_keys, rule_keys
from molrl.config.ranges import Range, _markers

REPO = Path(__file__).resolve().parents[1]
SERVERS = ["engine=vllm_server", "engine_servers=[http://127.0.0.1:8001]"]
REQUIRED = {"collect": ["model=tiny:chatml", "data.path=tasks.jsonl"], "mol": [], "rl": [], "eval": []}
"""What a stage's config needs to load at all."""


def stage_class(stage: str) -> type:
    from molrl.collect.config import CollectConfig
    from molrl.eval.config import EvalConfig
    from molrl.mol.config import MolConfig
    from molrl.rl.config import RlConfig

    return {"collect": CollectConfig, "mol": MolConfig, "rl": RlConfig, "eval": EvalConfig}[stage]


REMOTE = ["sandbox.backend=remote", "sandbox.servers=[http://127.0.0.1:8300]"]
"""A remote sandbox tier (its servers need not answer for a config to load)."""

SETTINGS: dict[tuple[str, str], tuple[list[str], list[str]]] = {
    # (stage, the rule's first key): (a setting where the keys act, one where they are idle)
    **{(stage, "engine_servers"): (SERVERS[:1], ["engine=transformers"]) for stage in ("collect", "rl", "eval")},
    ("rl", "engine_sync_dir"): (SERVERS, ["engine=transformers"]),
    ("rl", "engine_gpu_memory_utilization"): (["engine=vllm"], SERVERS),
    ("rl", "rollout.max_mismatch_kl"): (["engine=vllm"], ["engine=transformers"]),
    **{(stage, "device"): (["engine=transformers"], ["engine=vllm"]) for stage in ("collect", "eval")},
    ("eval", "static_cache"): (["engine=transformers"], ["engine=vllm"]),
    ("rl", "rollout.merged_generation"): (["engine=transformers"], ["rollout.behaviour=props"]),
    ("rl", "rollout.tis_cap"): ([*SERVERS, "rollout.max_staleness=1"], SERVERS),
    ("rl", "rollout.over_provision"): (["rollout.partial=true"], []),
    ("rl", "rollout.importance_cap"): (["rollout.partial=true"], ["rollout.partial=true", "rollout.off_policy=mask"]),
    ("rl", "rollout.sampling_error_split"): ([], ["rollout.sampling_error=false"]),
    ("rl", "props"): (["rollout.behaviour=props"], []),
    ("rl", "episode.max_solutions"): (["episode.max_turns=2"], []),
    ("rl", "ppo.gamma"): (["algorithm=ppo"], ["algorithm=grpo"]),
    ("rl", "ppo.value_clip"): (["algorithm=ppo"], ["algorithm=ppo", "ppo.critic=group_mean"]),
    ("rl", "ppo.value_coef"): (["algorithm=ppo", "ppo.critic=shared"], ["algorithm=ppo"]),
    ("rl", "ppo.critic_init"): (["algorithm=ppo"], ["algorithm=ppo", "ppo.critic=shared"]),
    ("rl", "opd.lam"): (["algorithm=opd"], ["algorithm=dr_grpo"]),
    ("rl", "opd.teacher_model"): (["algorithm=opd"], ["algorithm=opd", "opd.teacher_weights=current"]),
    ("rl", "macro.rule"): (["algorithm=ppo"], ["algorithm=grpo"]),
    ("rl", "model.reference"): (["beta=0.1", "model.adapter=runs/mol"], ["model.adapter=runs/mol"]),
    ("rl", "model.adapter_mode"): (["model.adapter=runs/mol"], []),
    ("rl", "eval.data"): (["eval.every_steps=1"], []),
    ("eval", "episode.max_solutions"): (["mode=interactive"], []),
    ("eval", "code_prompt"): ([], ["mode=interactive"]),
    ("collect", "episode.critique"): (["episode.feedback=[critique]"], []),
    ("rl", "episode.critique"): (["episode.max_turns=2", "episode.feedback=[critique]"], ["episode.max_turns=2"]),
    ("eval", "episode.critique"): (["mode=interactive", "episode.feedback=[critique]"], ["mode=interactive"]),
    **{(stage, "sandbox.servers"): (REMOTE, []) for stage in ("collect", "rl", "eval")},
    **{(stage, "sandbox.tmpfs_mb"): ([], REMOTE) for stage in ("collect", "rl", "eval")},
    ("mol", "loss.kl_weight"): ([], ["loss.mode=ce"]),
    ("mol", "loss.monitor_kl"): (["loss.mode=ce"], []),
    ("mol", "loss.kl_direction"): (["loss.mode=ce"], ["loss.mode=ce", "loss.monitor_kl=false"]),
    ("mol", "loss.base_targets_dir"): (["loss.base_targets=hidden"], []),
    ("mol", "loss.base_topk"): (["loss.base_targets=topk"], ["loss.base_targets=hidden"]),
}
"""A setting under which each row of ``RULES`` acts, and one under which it is idle, per stage."""

VALUES: dict[str, str] = {
    "engine_servers": "[http://127.0.0.1:8002]", "sandbox.servers": "[http://127.0.0.1:8301]", "macro.rule": "fixed:5", "opd.reference": "student_initial",
    "ppo.critic_init": "fresh", "episode.feedback": "[execution]", "sampling.stop": "[END]",
    "model.reference": "mol", "episode.critique.base_url": "http://127.0.0.1:8000",
}
"""A value other than the default for the keys whose type alone does not say a valid one."""


def other_value(stage: str, key: str) -> str | None:
    """A valid value other than the stage's default for ``key``, as an override's text; None where the key's range
    admits its default alone (nothing else can be set)."""
    if key in VALUES:
        return VALUES[key]
    cls = stage_class(stage)
    *sections, name = key.split(".")
    for part in sections:
        cls = typing.get_type_hints(cls)[part]
    tp = typing.get_type_hints(cls, include_extras=True)[name]
    base, markers = _markers(tp)
    default = declared_default(stage_class(stage), key)
    span = next((m for m in markers if isinstance(m, Range)), None)
    if typing.get_origin(base) is typing.Literal:
        return next(str(v) for v in typing.get_args(base) if v != default)
    if base is bool:
        return str(not default).lower()
    if base in (int, float):
        candidates = [v for v in (default + 1 if default is not None else 1, 0.5, 2, 1) if v != default]
        fits = [v for v in candidates if span is None or span.allows(v)]
        return str(int(fits[0]) if base is int else float(fits[0])) if fits else None
    if base is Path or base is str:
        return "/tmp/x" if key.endswith(("dir", "path", "model")) else "x"
    if typing.get_origin(base) is list:
        return "[x]"
    raise AssertionError(f"no other value for {stage}:{key} ({base}); add one to VALUES")


def row_cases() -> list[tuple[str, str, str]]:
    """(stage, the rule's first key, a key of the rule) for every key of every rule."""
    cases = []
    for rule in RULES:
        for stage in rule.stages:
            for key in rule_keys(rule, stage_class(stage)):
                cases.append((stage, rule.keys[0], key))
    return cases


CASES = [c for c in row_cases() if other_value(c[0], c[2]) is not None]


def test_every_rule_has_a_setting_where_it_acts_and_one_where_it_is_idle():
    assert {(stage, rule.keys[0]) for rule in RULES for stage in rule.stages} == set(SETTINGS)


@pytest.mark.parametrize("stage,row,key", CASES, ids=[f"{s}:{k}" for s, _, k in CASES])
def test_a_key_set_where_it_is_idle_is_refused_naming_it_and_loads_where_it_acts(stage, row, key):
    acts, idle = SETTINGS[(stage, row)]
    value = other_value(stage, key)
    cfg = load_config(stage_class(stage), None, [*REQUIRED[stage], *acts, f"{key}={value}"])
    assert idle_keys(cfg, stage) == []
    with pytest.raises(ConfigError) as err:
        load_config(stage_class(stage), None, [*REQUIRED[stage], *idle, f"{key}={value}"])
    line = str(err.value)
    assert "\n" not in line and f"{key}=" in line and " does nothing with " in line
    assert f"or leave {key} out" in line  # the fix


def test_a_key_at_its_default_is_never_idle():
    for stage in REQUIRED:
        assert idle_keys(load_config(stage_class(stage), None, REQUIRED[stage]), stage) == []


LISTED = [
    ("rl", ["engine=transformers", "engine_sync_dir=/x"],
     "engine_sync_dir='/x' does nothing with engine=transformers: it is read only with engine=vllm_server; set "
     "engine=vllm_server (with engine_servers), or leave engine_sync_dir out"),
    ("rl", ["engine=transformers", "rollout.tis_cap=5"],
     "rollout.tis_cap=5.0 does nothing with rollout.max_staleness=0: it is read only with rollout.max_staleness=1 "
     "(engine=vllm_server); set rollout.max_staleness=1 (with engine=vllm_server), or leave rollout.tis_cap out"),
    ("rl", ["rollout.importance_cap=3"],
     "rollout.importance_cap=3.0 does nothing with rollout.partial=false: it is read only with rollout.partial=true "
     "rollout.off_policy=importance"),
    ("rl", ["rollout.over_provision=3"],
     "rollout.over_provision=3.0 does nothing with rollout.partial=false: it is read only with rollout.partial=true; "
     "set rollout.partial=true, or leave rollout.over_provision out"),
    ("rl", ["algorithm=grpo", "ppo.value_coef=9", "opd.lam=3"],
     "ppo.value_coef=9.0 does nothing with algorithm=grpo: it is read only with algorithm=ppo ppo.critic=shared"),
    ("rl", ["algorithm=grpo", "ppo.value_coef=9", "opd.lam=3"],
     "opd.lam=3.0 does nothing with algorithm=grpo: it is read only with algorithm=opd; set algorithm=opd, or leave "
     "opd.lam out"),
    ("rl", [*SERVERS, "engine_gpu_memory_utilization=0.9"],
     "engine_gpu_memory_utilization=0.9 does nothing with engine=vllm_server: it is read only with engine=vllm; "
     "set engine=vllm, or leave engine_gpu_memory_utilization out (a server takes its share when it starts: molrl "
     "serve --memory)"),
    ("eval", ["engine=vllm", "static_cache=true", "mode=single", "episode.max_turns=9"],
     "static_cache=True does nothing with engine=vllm: it is read only with engine=transformers"),
    ("eval", ["engine=vllm", "static_cache=true", "mode=single", "episode.max_turns=9"],
     "episode.max_turns=9 does nothing with mode=single: it is read only with mode=interactive"),
    ("collect", ["engine=vllm", "device=cuda:1"],
     "device='cuda:1' does nothing with engine=vllm: it is read only with engine=transformers"),
    ("rl", ["engine=auto", "engine_gpu_memory_utilization=0.5", "rollout.behaviour=props"],
     "engine=auto may choose transformers or vllm, and none takes this config: with engine=transformers: "
     "engine_gpu_memory_utilization=0.5 does nothing with engine=transformers"),
    ("rl", ["engine=auto", "engine_gpu_memory_utilization=0.5", "rollout.behaviour=props"],
     "with engine=vllm: engine=vllm with rollout.behaviour=props: it samples from a second adapter"),
]
"""The combinations that loaded with no line at all, and what each is refused with now."""


@pytest.mark.parametrize("stage,overrides,says", LISTED, ids=[" ".join(o) for _, o, _ in LISTED])
def test_each_listed_combination_is_refused_in_one_line(stage, overrides, says):
    with pytest.raises(ConfigError) as err:
        load_config(stage_class(stage), None, [*REQUIRED[stage], *overrides])
    assert says in str(err.value) and "\n" not in str(err.value)


def test_engine_auto_takes_what_one_engine_it_may_choose_takes():
    """auto may choose vLLM, where engine_gpu_memory_utilization acts; vLLM cannot run props, and transformers
    reads no engine_gpu_memory_utilization, so only the two together are refused."""
    rl = stage_class("rl")
    assert load_config(rl, None, ["engine=auto", "engine_gpu_memory_utilization=0.5"]).engine == "auto"
    assert load_config(rl, None, ["engine=auto", "rollout.behaviour=props"]).rollout.behaviour == "props"
    with pytest.raises(ConfigError, match="engine=auto may choose transformers or vllm, and none"):
        load_config(rl, None, ["engine=auto", "engine_gpu_memory_utilization=0.5", "rollout.behaviour=props"])


def test_what_auto_chose_is_named_with_the_keys_it_leaves_idle(caplog):
    from molrl.rl.engine import rl_engine

    cfg = load_config(stage_class("rl"), None, ["engine_gpu_memory_utilization=0.5"])
    choice = rl_engine(cfg, installed=True, gpu=False)  # a CPU keeps rl on transformers
    caplog.set_level(logging.WARNING)
    choice.log("rl", cfg)
    choice.log("rl", cfg)
    lines = [r.getMessage() for r in caplog.records if "engine=auto chose" in r.getMessage()]
    assert lines == [f"rl: engine=auto chose transformers ({choice.reason}), where engine_gpu_memory_utilization=0.5 "
                     "does nothing with engine=transformers: it is read only with engine=vllm; set engine=vllm, or "
                     "leave engine_gpu_memory_utilization out (a server takes its share when it starts: molrl serve "
                     "--memory)"]


# a pipeline's rl section is shared by its runs
def pipeline(tmp_path, *overrides):
    from molrl.pipeline import check_stages
    from molrl.pipeline.config import load_pipeline_config

    cfg = load_pipeline_config(REPO / "configs" / "pipeline_tiny.yaml", ["model=m", *overrides])
    check_stages(cfg, tmp_path, in_memory=True)
    return cfg


def test_a_shared_rl_key_idle_in_one_run_is_named_once_and_loads(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    pipeline(tmp_path, "rl.ppo.critic=shared", "rl_runs=[{name: a, start: base, overrides: [algorithm=ppo]}, "
                                               "{name: b, start: base, overrides: [algorithm=grpo]}]")
    pipeline(tmp_path, "rl.ppo.critic=shared", "rl_runs=[{name: a, start: base, overrides: [algorithm=ppo]}, "
                                               "{name: b, start: base, overrides: [algorithm=grpo]}]")
    lines = [r.getMessage() for r in caplog.records if "ppo.critic" in r.getMessage()]
    assert lines == ["pipeline section rl_runs.b: the shared section sets keys this run leaves idle (named, not "
                     "refused: another run may read them): ppo.critic='shared' does nothing with algorithm=grpo: it is "
                     "read only with algorithm=ppo; set algorithm=ppo, or leave ppo.critic out"]


def test_a_shared_rl_key_idle_in_every_run_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"pipeline section rl, in every RL run \(mol\+grpo, base\+grpo\): "
                                          r"ppo.critic='shared' does nothing with algorithm=grpo"):
        pipeline(tmp_path, "rl.ppo.critic=shared")


def test_a_runs_own_idle_override_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"pipeline section rl_runs.b: .*opd.lam=2.0 does nothing with "
                                          r"algorithm=grpo"):
        pipeline(tmp_path, "rl_runs=[{name: a, start: base, overrides: [algorithm=opd, beta=0]}, "
                           "{name: b, start: base, overrides: [algorithm=grpo, opd.lam=2]}]")


def test_the_pipelines_collect_and_eval_sections_refuse_an_idle_key(tmp_path):
    with pytest.raises(ConfigError, match=r"pipeline section eval: .*static_cache=True does nothing with engine=vllm"):
        pipeline(tmp_path, "eval.engine=vllm", "eval.static_cache=true")


def test_a_shared_mol_key_idle_in_one_run_is_named_and_in_every_run_refused(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    runs = "mol_runs=[{name: mol, overrides: [loss.mode=mol]}, {name: ce, overrides: [loss.mode=ce]}]"
    pipeline(tmp_path, "mol.loss.kl_weight=2", runs)
    assert [r.getMessage() for r in caplog.records if "kl_weight" in r.getMessage()] == [
        "pipeline section mol_runs.ce: the shared section sets keys this run leaves idle (named, not refused: another "
        "run may read them): loss.kl_weight=2.0 does nothing with loss.mode=ce: it is read only with loss.mode=mol (the "
        "ce modes train on CE alone; their KL is only measured); set loss.mode=mol, or leave loss.kl_weight out"]
    with pytest.raises(ConfigError, match=r"pipeline section mol, in every MoL run \(ce\): loss.kl_weight=2.0 does "):
        pipeline(tmp_path, "mol.loss.kl_weight=2", "mol_runs=[{name: ce, overrides: [loss.mode=ce]}]",
                 "rl_runs=[{name: ce+grpo, start: ce}]")


def test_a_pipelines_mol_runs_share_one_store_of_base_targets(tmp_path):
    from molrl.pipeline.config import mol_config

    cfg = pipeline(tmp_path, "mol.loss.base_targets=hidden", "mol_runs=[{name: mol, overrides: []}, "
                   "{name: ce, overrides: [loss.mode=ce]}, {name: ce_live, overrides: [loss.base_targets=live]}]")
    dirs = [mol_config(cfg, run, ["t.jsonl"], tmp_path).loss.base_targets_dir for run in cfg.mol_runs]
    assert dirs == [tmp_path / "base_targets", tmp_path / "base_targets", None]


@pytest.mark.parametrize("stage", sorted(REQUIRED))
def test_describe_groups_each_key_that_acts_only_under_a_setting_under_it(stage):
    from molrl.config import describe
    from molrl.config.variants import describe_stage, key_blocks

    cls = stage_class(stage)
    grouped = describe_stage(cls, stage)
    assert sorted(grouped) == sorted([*describe(cls), *[x for x in grouped if x.startswith("# only with ") or x == ""]])
    under, header = {}, None
    for line in grouped:
        if line.startswith("# only with "):
            header = line.removeprefix("# only with ").removesuffix(":")
        elif line and not line.startswith(" "):
            under[line.split(":", 1)[0]] = header
    for rule in RULES:
        if stage in rule.stages:
            for key in rule_keys(rule, cls):
                assert under[key] is not None, key  # under a group, the first rule's that covers it
    assert len(under) == len(key_blocks(describe(cls)))  # each key once
