"""RL on engine servers (``engine: vllm_server``) against fake vLLM servers that sample from the tiny model and the
adapters loaded on them: the choice, the adapter-only sync, the engine log-probs the mismatch gate reads, and every
rollout kind behind the engine seam."""

from __future__ import annotations

import json

import pytest

from fake_engine_server import FakeEngineServer, ModelAnswer
from grpo_helpers import save_tiny_model, toy_config
from molrl.config import load_config
from molrl.errors import MolrlError
from molrl.rl.config import RlConfig
from molrl.rl.engine import rl_engine


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "base", eos_logit=2.0)


@pytest.fixture
def servers(base):
    made = [FakeEngineServer(base=str(base), answer=ModelAnswer(str(base))) for _ in range(2)]
    yield made
    for server in made:
        if not server.dead:
            server.stop()


def metrics(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_vllm_server_is_chosen_only_with_servers_and_refused_where_a_rollout_cannot_use_it():
    cfg = load_config(RlConfig, None, ["engine=vllm_server", "engine_servers=[http://127.0.0.1:8001]"])
    assert rl_engine(cfg, installed=False, gpu=False).name == "vllm_server"  # vLLM need not be installed here
    with pytest.raises(MolrlError, match="engine=vllm_server needs engine_servers"):
        load_config(RlConfig, None, ["engine=vllm_server"])
    with pytest.raises(MolrlError, match="read only with engine=vllm_server"):
        load_config(RlConfig, None, ["engine_servers=[http://127.0.0.1:8001]"])
    with pytest.raises(MolrlError, match="not a server URL"):
        load_config(RlConfig, None, ["engine=vllm_server", "engine_servers=[127.0.0.1:8001]"])
    with pytest.raises(ValueError, match="props"):
        load_config(RlConfig, None, ["engine=vllm_server", "engine_servers=[http://h:1]", "rollout.behaviour=props"])


def test_a_run_samples_each_step_from_the_adapter_just_trained(servers, base, tmp_path):
    out = tmp_path / "run"
    cfg = toy_config(out, base, max_steps=3, engine="vllm_server", engine_servers=[s.url for s in servers])
    from molrl.rl.run import run_rl

    run_rl(cfg)
    rows = metrics(out)
    gaps = [r["rollout/engine_logp_gap"] for r in rows if "rollout/engine_logp_gap" in r]
    assert len(gaps) == 3 and max(gaps) < 1e-4  # the servers sample from the trainer's adapter at every step
    requests = servers[0].requests + servers[1].requests
    assert len(requests) == 3 * 8 and min(len(s.requests) for s in servers) > 0  # spread over both
    models = [r["model"] for r in requests]
    assert len(set(models)) == 3 and all(m.startswith("molrl-") for m in models)  # one adapter per optimiser step
    assert len({r["seed"] for r in requests}) == len(requests)  # a seed per row
    for server in servers:
        assert [op for op, _ in server.adapter_log] == ["load", "load", "unload", "load", "unload", "unload"]
        assert server.adapters == {}  # the run leaves the servers as it found them
    assert not any((out / "engine_sync").iterdir())


def test_a_server_on_the_base_alone_shows_in_the_engine_gap(base, tmp_path):
    stale = [FakeEngineServer(base=str(base), answer=ModelAnswer(str(base), stale=True))]
    try:
        out = tmp_path / "run"
        cfg = toy_config(out, base, max_steps=3, engine="vllm_server", engine_servers=[stale[0].url])
        cfg.rollout.max_mismatch_kl = 1000.0
        from molrl.rl.run import run_rl

        run_rl(cfg)
        gaps = [r["rollout/engine_logp_gap"] for r in metrics(out) if "rollout/engine_logp_gap" in r]
        assert gaps[0] < 1e-4 and min(gaps[1:]) > 1e-3  # step 1 is on the base anyway; then the adapter moved
    finally:
        stale[0].stop()
