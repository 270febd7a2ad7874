"""One-step-off overlap (``rollout.max_staleness: 1``): its TIS weight in closed form, its config, the loop read one
batch ahead, and runs against fake engine servers that sample from the tiny model and the adapters loaded on them."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
import torch

from fake_engine_server import FakeEngineServer, ModelAnswer
from grpo_helpers import save_tiny_model, toy_config
from molrl.config import load_config
from molrl.rl.config import RlConfig
from molrl.rl.loss import truncated_importance_weights
from molrl.rl.rollouts.overlap import Lookahead

SERVER = ["engine=vllm_server", "engine_servers=[http://127.0.0.1:8001]"]


def test_tis_weight_is_the_ratio_to_the_sampler_capped_and_one_where_the_sampler_is_unknown():
    trainer = torch.tensor([[-1.0, -2.0, -0.5, -0.1]])  # [B=1, T=4]
    engine = torch.tensor([[-1.5, -1.0, math.nan, -2.1]])
    weights = truncated_importance_weights(trainer, engine, cap=2.0)
    # exp(-1.0 + 1.5) = e^0.5; exp(-2.0 + 1.0) = e^-1; unknown: 1; exp(-0.1 + 2.1) = e^2 = 7.39 capped at 2
    assert weights[0].tolist() == pytest.approx([math.exp(0.5), math.exp(-1.0), 1.0, 2.0])


def test_max_staleness_is_one_range_entry_and_only_on_engine_servers():
    assert load_config(RlConfig, None, []).rollout.max_staleness == 0
    cfg = load_config(RlConfig, None, [*SERVER, "rollout.max_staleness=1"])
    assert cfg.rollout.policy(cfg.episode.max_turns) == "overlap"
    with pytest.raises(Exception, match=r"rollout.max_staleness.*\[0, 1\]"):
        load_config(RlConfig, None, [*SERVER, "rollout.max_staleness=2"])
    with pytest.raises(Exception, match=r"rollout.tis_cap"):
        load_config(RlConfig, None, [*SERVER, "rollout.max_staleness=1", "rollout.tis_cap=0.5"])
    for engine in ("vllm", "transformers", "auto"):
        with pytest.raises(ValueError, match=f"engine={engine} with rollout.max_staleness=1: .*nothing overlaps; set engine=vllm_server"):
            load_config(RlConfig, None, [f"engine={engine}", "rollout.max_staleness=1"])
    with pytest.raises(ValueError, match=r"rollout.max_staleness=1 with episode.max_turns > 1"):
        load_config(RlConfig, None, [*SERVER, "rollout.max_staleness=1", "episode.max_turns=2",
                                     "episode.turn_tokens=64"])
    with pytest.raises(ValueError, match=r"rollout.max_staleness=1 with rollout.partial=true"):
        load_config(RlConfig, None, [*SERVER, "rollout.max_staleness=1", "rollout.partial=true"])


def test_the_lookahead_shows_the_next_batch_without_taking_it():
    ahead = Lookahead()
    first = ahead.wrap(iter([1, 2]))
    assert next(first) == 1 and ahead.peek() == 2 and ahead.peek() == 2
    assert next(ahead.wrap(first)) == 2 and ahead.peek() is None  # the same epoch: the peeked batch comes next
    assert next(ahead.wrap(iter([7]))) == 7  # a new epoch's iterator


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "base", eos_logit=2.0)


def run(base, out, staleness: int) -> tuple[list[dict], list[dict], list[FakeEngineServer]]:
    """A 3-step run on two fake servers: (metrics lines, completions rows, the servers)."""
    from molrl.rl.run import run_rl

    servers = [FakeEngineServer(base=str(base), answer=ModelAnswer(str(base))) for _ in range(2)]
    try:
        cfg = toy_config(out, base, max_steps=3, engine="vllm_server", engine_servers=[s.url for s in servers],
                         completion_logps=True)
        cfg.rollout.max_staleness = staleness
        run_rl(cfg)
    finally:
        for server in servers:
            server.stop()
    rows = [json.loads(x) for x in (out / "completions.jsonl").read_text().splitlines()]
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()], rows, servers


def by_step(rows: list[dict], key: str) -> list[list]:
    steps = sorted({r["step"] for r in rows})
    return [[r[key] for r in rows if r["step"] == s] for s in steps]


def test_staleness_one_trains_on_the_previous_adapters_rows_with_tis(base, tmp_path):
    sync_metrics, sync_rows, sync_servers = run(base, tmp_path / "sync", 0)
    metrics, rows, servers = run(base, tmp_path / "overlap", 1)
    # every row names the adapter that sampled it and the optimiser step whose weights it holds: synchronously the
    # weights its step starts from, one step off the step before's (step 2 samples ahead from step 1's start)
    assert [set(s) for s in by_step(sync_rows, "engine_adapter_step")] == [{0}, {1}, {2}]
    assert [set(s) for s in by_step(rows, "engine_adapter_step")] == [{0}, {0}, {1}]
    sync_names = [set(names) for names in by_step(sync_rows, "engine_adapter")]
    assert all(len(a) == 1 for a in sync_names) and len(set.union(*sync_names)) == 3
    # ... and the servers were asked for that adapter once a row (the canary's one request aside)
    asked = Counter(body["model"] for server in sync_servers for body in server.requests)
    rows_on = Counter(r["engine_adapter"] for r in sync_rows)
    assert set(rows_on) == set(asked) and all(rows_on[a] <= asked[a] <= rows_on[a] + 1 for a in asked)
    assert sum(asked.values()) == 3 * 8 + 1
    steps = [m for m in metrics if "rollout/staleness" in m]
    assert [m["rollout/staleness"] for m in steps] == [0.0, 1.0, 1.0]
    # step 1 has nothing pending: the synchronous path, token for token, with the same loss
    assert by_step(rows, "token_ids")[0] == by_step(sync_rows, "token_ids")[0]
    first = lambda ms: next(m for m in ms if "loss" in m)  # noqa: E731
    assert first(metrics)["loss"] == first(sync_metrics)["loss"]
    # each later step's rows were sampled under the adapter the step before it held, not the one it trains
    adapters = [set(names) for names in by_step(rows, "engine_adapter")]
    assert all(len(a) == 1 for a in adapters)
    names = [a.pop() for a in adapters]
    assert names[0] == names[1] != names[2]  # step 2: step 1's adapter; step 3: step 2's (the first sync after it)
    assert [set(s) for s in by_step(rows, "staleness")] == [{0}, {1}, {1}]
    # the engine sampled from that adapter (its log-probs match it, so the gate sees no mismatch) ...
    assert max(m["rollout/mismatch_kl"] for m in steps) < 1e-4
    # ... and the loss's TIS weights against the moved adapter differ from 1, capped at rollout.tis_cap
    stale = [m for m in steps if m["rollout/staleness"] == 1.0]
    assert all(abs(m["rollout/tis_weight_mean"] - 1.0) > 1e-3 for m in stale)
    assert all(m["rollout/tis_weight_max"] <= 2.0 and m["rollout/tis_capped_fraction"] > 0 for m in stale)
    # the last step submitted nothing: every row requested was trained on (and one request was the canary's)
    assert sum(len(s.requests) for s in servers) == 3 * 8 + 1
