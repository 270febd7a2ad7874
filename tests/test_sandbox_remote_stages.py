"""Every stage that executes code runs with ``sandbox.backend=remote`` against two ``molrl sandbox serve`` on
localhost: RL (single- and multi-turn), collect, graded eval and eval's interactive mode; each run's code reaches
the tier and no row is a sandbox error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_helpers import save_tiny_model, toy_config
from molrl.sandbox import SandboxConfig
from molrl.sandbox.remote.server import SandboxServer, ServeConfig


@pytest.fixture(scope="module")
def tier():
    servers = [SandboxServer(ServeConfig(sandbox=SandboxConfig(workers=1, timeout_s=30.0, cache_size=0), port=0)).start()
               for _ in range(2)]
    yield servers
    for server in servers:
        server.close()


def remote(tier, **kw) -> SandboxConfig:
    return SandboxConfig(backend="remote", servers=[s.url for s in tier], timeout_s=5.0, **kw)


def served(tier) -> list[int]:
    return [s.counts["jobs"] for s in tier]


def _grew(tier, before) -> None:
    after = served(tier)
    assert sum(after) > sum(before), (before, after)  # (test_sandbox_remote: a batch spreads over both)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("base") / "base", eos_logit=2.0)


def test_rl_single_turn_rewards_come_from_the_tier(tmp_path, tier, base):
    from molrl.rl import run_rl

    cfg = toy_config(tmp_path / "run", base, max_steps=2)
    cfg.sandbox = remote(tier)
    before = served(tier)
    out = run_rl(cfg)
    _grew(tier, before)
    rows = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 8 and all(r["reward_stage"] != "scoring_error" and not r["reward_error"] for r in rows)


def test_rl_multi_turn_feedback_and_rewards_come_from_the_tier(tmp_path, tier):
    from molrl.demo.run import task_record
    from molrl.demo.world import WorldConfig, build_world
    from molrl.rl import run_rl
    from molrl.rl.config import TaskSource

    world = build_world(WorldConfig(train_problems=8, heldout_problems=2, general_train=2, general_eval=2))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(json.dumps(task_record(t)) for t in world.rule_train) + "\n")
    base = save_tiny_model(tmp_path / "base", eos_logit=2.0)
    cfg = toy_config(tmp_path / "run", base, data=TaskSource(path=tasks, format="jsonl"), max_new_tokens=64, n=4,
                     micro_batch_size=4, max_steps=1)
    cfg.data.spec.kind = "math"
    cfg.episode.max_turns = 2
    cfg.episode.system_prompt = "Run code in <execute></execute>. Answer in \\boxed{}."
    cfg.episode.feedback = ["execution", "verdict"]
    cfg.episode.turn_tokens = 8
    cfg.sandbox = remote(tier)
    out = run_rl(cfg)
    rows = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert rows and all(not r["reward_error"] for r in rows)
    assert any("<|im_start|>" in r["episode"] for r in rows)  # a later turn, after feedback the tier ran


class _Solver:
    """Runs a line of code first, then submits the task's reference solution (or, for single mode, writes it)."""

    def __init__(self, tasks):
        self.tasks = tasks

    def generate(self, prompts, sampling):
        out = []
        for prompt in prompts:
            task = max((t for t in self.tasks if t.entry_point and t.entry_point in prompt), key=lambda t: len(t.entry_point))
            if "<execute>" not in prompt and "<solution>" not in prompt:  # single mode: one fenced answer
                out.append([f"```python\n{task.reference}\n```"])
            elif prompt.count("<|im_start|>assistant") == 1:
                out.append(["<execute>\nprint(6 * 7)\n</execute>"])
            else:
                out.append([f"<solution>\n{task.reference}\n</solution>"])
        return out


def test_collect_and_eval_run_their_code_on_the_tier(tmp_path, tier, shared_data, monkeypatch):
    import molrl.eval.sources as sources
    from molrl.collect import CollectConfig, run_collect
    from molrl.config.blocks import TaskSource
    from molrl.engines.generation import SamplingConfig
    from molrl.episode import EpisodeConfig
    from molrl.eval import EvalConfig, run_eval
    from molrl.models import load_tokenizer
    from molrl.tasks import load_tasks
    from molrl.traces.schema import read_traces

    mbpp = shared_data / "mbpp/mbpp.jsonl"
    tasks = load_tasks(mbpp, "mbpp", split="all")
    before = served(tier)
    cfg = CollectConfig(model="tiny:chatml", output_dir=tmp_path / "collect",
                        data=TaskSource(path=mbpp, format="mbpp", split="all", limit=2),
                        episode=EpisodeConfig(max_turns=3), sampling=SamplingConfig(temperature=1.0, max_new_tokens=24),
                        sandbox=remote(tier), progress=False)
    traces = [t for _, t in read_traces(run_collect(cfg, generator=_Solver(tasks),
                                                    tokenizer=load_tokenizer("tiny:chatml")))]
    assert len(traces) == 2 and all(t.meta["verdict"] for t in traces)
    assert all(any(o["observation"].get("exec", {}).get("stdout") == "42\n" for o in t.meta["observations"].values())
               for t in traces)
    _grew(tier, before)
    monkeypatch.setattr(sources, "open_generator", lambda *a, **k: (_Solver(tasks), load_tokenizer("tiny:chatml")))
    for mode in ("single", "interactive"):
        before = served(tier)
        ecfg = EvalConfig(model="tiny:chatml", benchmarks=["mbpp"], data={"mbpp": str(mbpp)}, ks=[1], limit=2,
                          output_dir=tmp_path / f"eval-{mode}", mode=mode, sandbox=remote(tier),
                          sampling=SamplingConfig(n=1, temperature=0.7, max_new_tokens=24))
        if mode == "interactive":
            ecfg.episode.max_turns = 3
        out = run_eval(ecfg)
        results = json.loads((out / "results.json").read_text())["benchmarks"]["mbpp"]
        assert (results["samples"], results["pass@1"]) == (2, 1.0), (mode, results)
        _grew(tier, before)
