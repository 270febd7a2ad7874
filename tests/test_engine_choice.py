"""The one engine choice rule (``molrl.engines.choice``) over every stage, engine and setting that decides it; the
old server-mode keys read as the server tier; a backend added with one registry line, usable by collect and eval."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from molrl.collect.config import CollectConfig
from molrl.config import load_config
from molrl.engines.choice import NEEDS, choose, check_choice
from molrl.engines.registry import AUTO_MIN_TOKENS_CPU, AUTO_MIN_TOKENS_GPU, BACKENDS, EngineEntry, register
from molrl.errors import ConfigError, MolrlError
from molrl.eval.config import EvalConfig
from molrl.rl.config import RlConfig

SERVERS = "engine_servers=[http://127.0.0.1:1]"
MODEL_DIR = "model.path=models/m"
STAGES = {"collect": CollectConfig, "eval": EvalConfig, "rl": RlConfig}
ENGINES = ("auto", "transformers", "vllm", "vllm_server")

# Written out by hand, not read from the registry: (stage, setting) -> the engines that honour it.
HONOURED = {
    ("collect", "model.path=tiny:chatml"): {"auto", "transformers", "vllm_server"},
    ("eval", "model.path=tiny:chatml"): {"auto", "transformers", "vllm_server"},
    ("rl", "model.path=tiny:chatml"): {"auto", "transformers", "vllm_server"},
    ("collect", MODEL_DIR): set(ENGINES),
    ("eval", MODEL_DIR): set(ENGINES),
    ("rl", MODEL_DIR): set(ENGINES),
    ("rl", "rollout.behaviour=props"): {"auto", "transformers"},
    ("rl", "rollout.merged_generation=true"): {"auto", "transformers"},
    ("rl", "rollout.max_staleness=1"): {"vllm_server"},
}
"""Every setting that decides which engine may run a stage."""


def overrides(stage: str, engine: str, setting: str, data: Path) -> list[str]:
    """A config of ``stage`` on ``engine`` with ``setting`` (a model directory unless the setting names the model)."""
    items = [f"engine={engine}", setting]
    if not setting.startswith("model.path"):
        items.append(MODEL_DIR)
    if engine == "vllm_server":
        items.append(SERVERS)
    if stage == "collect":
        items += [f"data.path={data}", "data.format=mbpp"]
    return items


@pytest.fixture(scope="module")
def task_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tasks") / "mbpp.jsonl"
    path.write_text(json.dumps({"task_id": 1, "text": "Return 1.", "code": "def f():\n    return 1",
                               "test_list": ["assert f() == 1"]}) + "\n")
    return path


def test_the_table_covers_every_need_of_the_rule():
    """Each setting of ``NEEDS`` has its row here, for every stage it applies to."""
    shown = {(stage, need.ability) for need in NEEDS for stage in need.stages}
    abilities = {"model.path=tiny:chatml": "model_in_process", "rollout.behaviour=props": "second_adapter",
                 "rollout.merged_generation=true": "merged_generation", "rollout.max_staleness=1": "overlap"}
    assert shown == {(stage, abilities[s]) for (stage, s) in HONOURED if s in abilities}


@pytest.mark.parametrize("stage,setting", sorted(HONOURED))
@pytest.mark.parametrize("engine", ENGINES)
def test_each_stage_engine_and_setting_is_honoured_or_refused_in_one_line(stage, setting, engine, task_file):
    items = overrides(stage, engine, setting, task_file)
    if engine in HONOURED[(stage, setting)]:
        cfg = load_config(STAGES[stage], None, items)
        assert choose(stage, cfg, 10**9, installed=True).name in ({engine} - {"auto"} or {"transformers", "vllm"})
        return
    if setting.startswith("model.path"):  # the model is judged as the stage starts, the rest as the config loads
        with pytest.raises(MolrlError) as err:
            choose(stage, load_config(STAGES[stage], None, items), 0, installed=True)
    else:
        with pytest.raises(ConfigError) as err:
            load_config(STAGES[stage], None, items)
    line = str(err.value)
    assert "\n" not in line and f"engine={engine} with {setting}" in line, line
    able = sorted(HONOURED[(stage, setting)] - {"auto"})
    assert f"set engine={' or '.join(able)}" in line or f"set engine={' or '.join(reversed(able))}" in line, line


@pytest.mark.parametrize("gpu", [False, True])
@pytest.mark.parametrize("installed", [False, True])
@pytest.mark.parametrize("model", ["tiny:chatml", "models/m"])
@pytest.mark.parametrize("stage", ["collect", "eval", "rl"])
def test_auto_takes_vllm_only_where_it_loads_the_model_is_installed_and_its_start_pays(stage, model, installed, gpu,
                                                                                       task_file):
    cfg = load_config(STAGES[stage], None, overrides(stage, "auto", f"model.path={model}", task_file))
    floor = AUTO_MIN_TOKENS_GPU if gpu else AUTO_MIN_TOKENS_CPU
    for tokens in (0, floor - 1, floor, 10 * floor):
        choice = choose(stage, cfg, tokens, installed=installed, gpu=gpu)
        rl_on_cpu = stage == "rl" and not gpu  # measured: an RL step on a CPU is no faster on vLLM
        expect = "vllm" if installed and model == "models/m" and tokens >= floor and not rl_on_cpu else "transformers"
        assert (choice.name, choice.reason.startswith("auto: ")) == (expect, True), choice
        if expect == "transformers" and model.startswith("tiny:"):
            assert "in-process model" in choice.reason
        elif expect == "transformers" and rl_on_cpu:
            assert "on a CPU an RL step" in choice.reason
        elif expect == "transformers" and not installed:
            assert "not installed" in choice.reason
        elif expect == "transformers":
            assert f"{tokens:,} tokens" in choice.reason and f"{floor:,}" in choice.reason


def test_an_engine_asked_for_by_name_is_taken_or_refused_when_it_cannot_run_here(task_file):
    cfg = load_config(EvalConfig, None, ["engine=vllm", MODEL_DIR])
    assert choose("eval", cfg, 0, installed=True).name == "vllm"
    with pytest.raises(MolrlError, match="engine=vllm but it is not installed here: .*engine=transformers"):
        choose("eval", cfg, 0, installed=False)
    servers = load_config(EvalConfig, None, ["engine=vllm_server", SERVERS])
    assert choose("eval", servers, 0, installed=False).reason == "engine=vllm_server: 1 server(s), http://127.0.0.1:1"


# The old keys of TRL's own server mode
def test_old_server_mode_reads_as_the_server_tier_in_one_line(caplog):
    caplog.set_level("WARNING")
    cfg = load_config(RlConfig, None, ["engine=vllm", "engine_mode=server", "engine_server_url=http://node1:8000"])
    assert (cfg.engine, cfg.engine_servers) == ("vllm_server", ["http://node1:8000"])
    lines = [r.getMessage() for r in caplog.records if "engine_mode" in r.getMessage()]
    assert len(lines) == 1 and "engine=vllm_server engine_servers=[http://node1:8000]" in lines[0]
    assert "molrl serve" in lines[0]
    # the URL left at its old default is the server tier at that default
    assert load_config(RlConfig, None, ["engine=vllm", "engine_mode=server"]).engine_servers == \
        ["http://localhost:8000"]


def test_the_older_vllm_mode_names_read_as_the_server_tier_too():
    cfg = load_config(RlConfig, None, ["use_vllm=true", "vllm_mode=server", "vllm_server_url=http://h:2"])
    assert (cfg.engine, cfg.engine_servers) == ("vllm_server", ["http://h:2"])


def test_old_server_mode_in_a_file_reads_as_the_server_tier(tmp_path):
    (tmp_path / "rl.yaml").write_text("engine: vllm\nengine_mode: server\nengine_server_url: http://10.0.0.5:8000\n")
    cfg = load_config(RlConfig, tmp_path / "rl.yaml")
    assert (cfg.engine, cfg.engine_servers) == ("vllm_server", ["http://10.0.0.5:8000"])


def test_old_colocate_mode_is_the_in_process_engine_and_its_default_url_is_dropped():
    cfg = load_config(RlConfig, None, ["engine=vllm", "engine_mode=colocate", "engine_server_url=http://localhost:8000",
                                       MODEL_DIR])
    assert (cfg.engine, cfg.engine_servers) == ("vllm", [])


@pytest.mark.parametrize("items", [
    ["engine_mode=server"],  # engine=auto: it chose transformers on a CPU, never a server tier
    ["engine=transformers", "engine_mode=server"],
    ["engine=vllm_server", SERVERS, "engine_mode=server"],
    ["engine=vllm", "engine_server_url=http://elsewhere:9000"],  # a URL that did nothing
    ["engine=vllm", "engine_mode=server", "engine_server_url=http://a:1", "engine_servers=[http://b:2]"],
])
def test_old_server_mode_without_a_faithful_reading_is_refused_naming_the_server_tier(items):
    with pytest.raises(ConfigError) as err:
        load_config(RlConfig, None, items)
    assert "\n" not in str(err.value) and "engine=vllm_server" in str(err.value)


def test_a_saved_run_under_the_old_keys_is_the_same_run():
    from molrl.config.renames import current_names

    saved = {"engine": "auto", "engine_mode": "colocate", "engine_server_url": "http://localhost:8000"}
    assert current_names(RlConfig, saved) == {"engine": "auto"}
    saved = {"engine": "vllm", "engine_mode": "server", "engine_server_url": "http://h:1"}
    assert current_names(RlConfig, saved) == {"engine": "vllm_server", "engine_servers": ["http://h:1"]}


# A backend added with its module and one registry line
class EchoGenerator:
    """Answers every prompt with the same boxed answer, counting its calls."""

    engine = "echo"
    calls = 0

    def generate(self, prompts, sampling):
        EchoGenerator.calls += 1
        return [["<solution>\ndef f():\n    return 1\n</solution> \\boxed{1}"] * sampling.n for _ in prompts]


def open_echo(spec):
    """The fake engine's opener: what ``EngineEntry.generator`` names."""
    from molrl.models import load_tokenizer

    return EchoGenerator(), load_tokenizer(spec.model)


@pytest.fixture
def echo_backend():
    """The fake engine registered for one test, with its one line."""
    register(EngineEntry("echo", f"{__name__}:open_echo", None, frozenset({"model_in_process"})))
    EchoGenerator.calls = 0
    yield
    BACKENDS.pop("echo")


def test_a_registered_backend_is_chosen_by_name_and_refused_where_it_cannot(echo_backend):
    cfg = load_config(EvalConfig, None, ["engine=echo"])
    assert choose("eval", cfg, 10**9).name == "echo"
    check_choice("eval", cfg)
    with pytest.raises(ConfigError, match="engine=echo with rollout.behaviour=props: .*set engine=transformers"):
        load_config(RlConfig, None, ["engine=echo", "rollout.behaviour=props"])
    assert "echo" not in [choose("eval", load_config(EvalConfig, None, []), 10**9, installed=False).name]


def test_a_registered_backend_runs_collect_and_eval_through_the_shared_builder(echo_backend, task_file, tmp_path):
    from molrl.collect import run_collect
    from molrl.eval import run_eval

    eval_cfg = load_config(EvalConfig, None, [
        "engine=echo", "model=tiny:chatml", "benchmarks=[mine]", f"data.mine.path={task_file}", "data.mine.format=mbpp",
        "data.mine.split=all", f"output_dir={tmp_path / 'eval'}", "sandbox.workers=1"])
    results = json.loads((run_eval(eval_cfg) / "results.json").read_text())
    assert results["benchmarks"]["mine"]["pass@1"] == 1.0  # the echo's answer, graded
    collect_cfg = load_config(CollectConfig, None, [
        "engine=echo", "model=tiny:chatml", f"data.path={task_file}", "data.format=mbpp", "data.split=all",
        f"output_dir={tmp_path / 'collect'}", "progress=false", "episode.max_turns=1", "sandbox.workers=1"])
    traces = Path(run_collect(collect_cfg)).read_text().splitlines()
    (trace,) = [json.loads(line) for line in traces]
    assert "return 1" in trace["messages"][-2]["content"] and "correct" in trace["messages"][-1]["content"]
    assert EchoGenerator.calls >= 2


def test_the_choice_the_builder_and_the_server_tier_s_client_import_neither_torch_nor_vllm():
    """A config is checked, an engine chosen and the server tier's client run before (or without) torch and vLLM."""
    import subprocess
    import sys

    modules = ("molrl.engines.registry", "molrl.engines.choice", "molrl.engines.builder", "molrl.engines.policy",
               "molrl.engines.server.client", "molrl.engines.server.pool", "molrl.engines.server.sync",
               "molrl.engines.server.generator", "molrl.engines.server.policy")
    code = (f"import sys; import {', '.join(modules)}; "
            "print(sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:]
