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
    # each step's 8 rows, spread over both, and the canary's one request at the first sync after step 1 (it decides)
    assert len(requests) == 3 * 8 + 1 and min(len(s.requests) for s in servers) > 0
    assert len([r for r in requests if not r.get("stop_token_ids")]) == 1  # the canary's: its tokens run to the end
    models = [r["model"] for r in requests]
    assert len(set(models)) == 3 and all(m.startswith("molrl-") for m in models)  # one adapter per optimiser step
    assert len({r["seed"] for r in requests}) == len(requests)  # a seed per row
    for server in servers:
        assert [op for op, _ in server.adapter_log] == ["load", "load", "unload", "load", "unload", "unload"]
        assert server.adapters == {}  # the run leaves the servers as it found them
    assert not any((out / "engine_sync").iterdir())


def test_the_canary_stops_a_run_whose_server_ignores_adapter_loads(base, tmp_path):
    """A server that lists each adapter it is sent but keeps sampling from the base: at the first sync after an
    optimiser step the canary, sampling through the engine's ``sample_ids``, names it (before the gate can)."""
    from molrl.rl.run import run_rl

    stale = FakeEngineServer(base=str(base), answer=ModelAnswer(str(base), stale=True))
    try:
        cfg = toy_config(tmp_path / "run", base, max_steps=3, engine="vllm_server", engine_servers=[stale.url])
        with pytest.raises(MolrlError, match="step 1: engine on the base"):
            run_rl(cfg)
        assert len(stale.requests) == 8 + 1  # step 1's rows, then the canary's one request
    finally:
        stale.stop()


def test_the_gate_stops_a_run_whose_servers_are_not_sent_the_new_adapter(servers, base, tmp_path, monkeypatch):
    """The sync switched off after the first load (the servers keep step 1's adapter): the gate stops the run after
    step 2, whose metrics line is written, naming the likely causes."""
    from molrl.rl.run import run_rl
    from molrl.engines.server.policy import ServerPolicyEngine

    real = ServerPolicyEngine.sync
    monkeypatch.setattr(ServerPolicyEngine, "sync", lambda self, trainer: None if self.lora else real(self, trainer))
    out = tmp_path / "run"
    cfg = toy_config(out, base, max_steps=3, engine="vllm_server", engine_servers=[s.url for s in servers])
    with pytest.raises(MolrlError, match=r"step 2: rollout/mismatch_kl=\S+ passed rollout.max_mismatch_kl=0.05.*"
                                         "stale adapter"):
        run_rl(cfg)
    kls = [r["rollout/mismatch_kl"] for r in metrics(out) if "rollout/mismatch_kl" in r]
    assert len(kls) == 2 and kls[0] < 1e-6 < 0.05 < kls[1]


def test_multi_turn_episodes_run_on_the_servers(servers, base, tmp_path):
    """Two multi-turn steps through engine=vllm_server: each turn is sampled on the servers under the step's adapter,
    the sandbox's feedback between turns, and the engine's log-probs match the trainer's on the sampled tokens."""
    from molrl.rl.run import run_rl

    out = tmp_path / "run"
    cfg = toy_config(out, base, max_steps=2, max_new_tokens=48, engine="vllm_server",
                     engine_servers=[s.url for s in servers])
    cfg.episode.max_turns, cfg.episode.turn_tokens = 2, 8
    run_rl(cfg)
    steps = [r for r in metrics(out) if "rollout/mismatch_kl" in r]
    assert len(steps) == 2 and max(r["rollout/mismatch_kl"] for r in steps) < 1e-6
    requests = servers[0].requests + servers[1].requests
    assert len(requests) > 2 * 8 and max(r["max_tokens"] for r in requests) <= 8  # later turns: more requests
    assert all(r["model"].startswith("molrl-") for r in requests)


def test_partial_rollouts_run_on_the_servers(servers, base, tmp_path):
    """Two steps of partial rollouts through engine=vllm_server: twice the groups are started, the step trains on
    those that finish first and the rest are cancelled, keeping their tokens for the next step."""
    from molrl.rl.run import run_rl

    for server in servers:
        server.token_delay_s = 0.002
    out = tmp_path / "run"
    cfg = toy_config(out, base, max_steps=2, engine="vllm_server", engine_servers=[s.url for s in servers])
    cfg.rollout.partial = True
    run_rl(cfg)
    steps = [r for r in metrics(out) if "partial/started_groups" in r]
    assert len(steps) == 2 and steps[0]["partial/started_groups"] >= 2
    assert max(r["rollout/mismatch_kl"] for r in steps) < 1e-6
