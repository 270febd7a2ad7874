"""One-step-off overlap against the synchronous step on the demo world: the reward curve at staleness 1 and 0, over
seeds.

    python benchmarks/staleness.py [--out runs/staleness] [--seeds 3] [--steps 80] [--port 8311] [--arms ...]

For each seed: the demo's chain world, base and MoL model (``molrl demo``'s default preset, reused when already on
disk), then GRPO from MoL as the demo runs it (80 steps, 8 prompts x 8 completions), three times:

- ``sync_local``: the demo's own run, on the in-process engine (the reference);
- ``server_s0``: ``engine=vllm_server``, ``rollout.max_staleness=0``: the synchronous step through the server client;
- ``server_s1``: ``rollout.max_staleness=1``: each step trains on rows sampled under the previous adapter while
  that adapter's step trained, with truncated importance sampling (``rollout.tis_cap``, its default).

The server is a reference engine speaking vLLM's protocol (``tests/fake_engine_server.py``: the run's base and each
adapter the run loads, in transformers, sampling with the request's seed and returning the sampling distribution's
log-probs). vLLM's CPU attention refuses the demo model's head size (16), and a reference engine whose log-probs
are the trainer's own leaves staleness as the one difference between ``server_s0`` and ``server_s1``
(``rollout/mismatch_kl`` is printed to show it).

Printed per run (mean ± standard error over seeds [per seed]): training reward over steps 1-10, 11-20, ...; the
final held-out and general accuracy (the pipeline's greedy evaluation); ``rollout/staleness``, ``mismatch_kl``,
``is_ess``; training wall time. And the paired difference ``server_s1 - server_s0`` per seed, and which adapter
sampled each training row (the rows' ``engine_adapter_step`` against their step).

``--control`` (another ``--port`` while the main runs hold theirs) runs both server arms again at a quarter of the
learning rate (``CONTROL``) and reports every arm: whether the gap between staleness 1 and 0 follows the size of a
step, as a one-step lag's cost does, or not, as a fault in the overlap's code would not.

Resumable: each seed is a pipeline under OUT/seed-N whose finished stages are reused (the server's port is fixed so
a run's config is the same when it resumes). Results: OUT/staleness.json and OUT/staleness.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the reference engine server

from molrl.demo.seeds import cell, mean_se  # noqa: E402
from molrl.records.layout import rl_runs  # noqa: E402

ARMS = {"sync_local": [], "server_s0": ["rollout.max_staleness=0"], "server_s1": ["rollout.max_staleness=1"]}
"""RL runs from MoL per seed: overrides on the demo's GRPO (the server arms add the engine)."""
CONTROL_LR = 2.5e-4
"""The control's learning rate: a quarter of the demo's GRPO's 1e-3, so each step moves the policy less."""
CONTROL = {"server_s0_lr": ["rollout.max_staleness=0", f"train.learning_rate={CONTROL_LR}"],
           "server_s1_lr": ["rollout.max_staleness=1", f"train.learning_rate={CONTROL_LR}"]}
"""``--control``: both server arms at a quarter of the learning rate. A one-step lag costs more the further each step
moves the policy, so if staleness 1 trails staleness 0 because of the lag, the gap shrinks here; a gap of a code
fault would not care about the step's size."""


def arm_overrides(name: str, url: str) -> list[str]:
    server = ["engine=vllm_server", f"engine_servers=[{url}]"] if name.startswith("server") else []
    return ["algorithm=grpo", *server, *{**ARMS, **CONTROL}[name]]


def run_seed(out: Path, seed: int, steps: int, port: int, preset: str = "default", arms: tuple = tuple(ARMS)) -> Path:
    """Seed ``seed``'s pipeline with the RL runs ``arms`` (finished stages reused); its output directory."""
    from fake_engine_server import FakeEngineServer, ModelAnswer
    from molrl.demo.run import prepare_seed
    from molrl.pipeline import run_pipeline
    from molrl.pipeline.config import RlRun

    url = f"http://127.0.0.1:{port}"
    cfg, world, threads = prepare_seed(out, preset, [f"rl.train.max_steps={steps}"], seed)
    cfg.rl_runs = [RlRun(name, "mol", arm_overrides(name, url)) for name in arms]
    base = str(Path(cfg.model).resolve())
    server = FakeEngineServer(base=base, answer=ModelAnswer(base), port=port)
    try:
        run_pipeline(cfg, collect_tasks=world.rule_train, most_threads=threads)
    finally:
        server.stop()
    return Path(cfg.output_dir)


def metrics(pipeline: Path, run: str) -> list[dict]:
    return [json.loads(line) for line in (rl_runs(pipeline) / run / "metrics.jsonl").read_text().splitlines()]


def windows(rows: list[dict], key: str, width: int = 10) -> list[float]:
    """Mean of ``key`` over steps 1-10, 11-20, ... (the training steps' lines)."""
    values = [r[key] for r in rows if key in r and "reward" in r]
    return [sum(values[i:i + width]) / len(values[i:i + width]) for i in range(0, len(values), width)]


def mean_of(rows: list[dict], key: str) -> float:
    values = [r[key] for r in rows if key in r and "reward" in r]
    return sum(values) / len(values) if values else float("nan")


def logged(values: list[float], digits: int = 3, scientific: bool = False) -> str:
    """``cell`` of per-seed values (``scientific``: a mismatch of 1e-10 is a finding, not 0.00000), or "-" where the
    run logs no such metric (the in-process transformers engine has no separate engine to compare; a synchronous run
    logs no staleness)."""
    if all(v != v for v in values):
        return "-"
    if scientific:
        mean, se = mean_se(values)
        return f"{mean:.1e} ± {se:.1e} [{', '.join(f'{v:.1e}' for v in values)}]"
    return cell(values, digits)


def sampled_under(pipeline: Path, run: str) -> dict[str, int] | None:
    """Which adapter sampled each training row of ``run`` (its ``completions.jsonl``: ``engine_adapter_step``, the
    optimiser step whose weights the adapter held, against the row's ``step``): rows on the weights their step
    started from (lag 0), on the step before's (lag 1), on any other; None where no row names one (an in-process
    run on transformers, or a run from before rows named their adapter)."""
    lags: dict[str, int] = {"rows": 0, "lag 0": 0, "lag 1": 0, "other": 0}
    path = rl_runs(pipeline) / run / "completions.jsonl"
    if not path.is_file():
        return None
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row.get("engine_adapter_step") is None:
            return None
        lag = row["step"] - 1 - row["engine_adapter_step"]
        lags["rows"] += 1
        lags[f"lag {lag}" if lag in (0, 1) else "other"] += 1
    return lags if lags["rows"] else None


def adapter_lines(pipelines: list[Path], arms: tuple) -> tuple[list[str], dict]:
    """The table of which adapter sampled each row, per run and seed (runs whose rows name none left out)."""
    found = {name: [sampled_under(p, name) for p in pipelines] for name in arms}
    found = {name: per_seed for name, per_seed in found.items() if all(x is not None for x in per_seed)}
    if not found:
        return [], {}
    lines = ["", "Which adapter sampled each training row (`completions.jsonl`: the optimiser step whose weights the "
             "row's adapter held, against the row's step; lag 0: the weights the step trains from; per seed):", "",
             "| run | rows | lag 0 | lag 1 | other |", "|---|---|---|---|---|"]
    for name, per_seed in found.items():
        lines.append(f"| {name} | " + " | ".join(", ".join(str(x[k]) for x in per_seed)
                                                for k in ("rows", "lag 0", "lag 1", "other")) + " |")
    return lines, found


def accuracy(pipeline: Path, run: str, benchmark: str) -> float:
    results = json.loads((pipeline / "eval" / run / "results.json").read_text())
    return float(results["benchmarks"][benchmark]["pass@1"])


def report(pipelines: list[Path], steps: int, seconds: float, arms: tuple = tuple(ARMS)) -> tuple[str, dict]:
    rows = {name: [metrics(p, name) for p in pipelines] for name in arms}
    data: dict = {"seeds": len(pipelines), "steps": steps, "arms": {}}
    lines = [f"{len(pipelines)} seeds (0-{len(pipelines) - 1}), {steps} GRPO steps from MoL a run, 8 prompts x 8 "
             "completions a step; mean ± s.e. over seeds [per seed]", "",
             "| run | held-out | general | staleness | mismatch_kl | is_ess | training wall s |",
             "|---|---|---|---|---|---|---|"]
    for name in arms:
        arm = {"heldout": [accuracy(p, name, "heldout") for p in pipelines],
               "general": [accuracy(p, name, "general") for p in pipelines],
               "reward_windows": [windows(r, "reward") for r in rows[name]],
               "staleness": [mean_of(r, "rollout/staleness") for r in rows[name]],
               "mismatch_kl": [mean_of(r, "rollout/mismatch_kl") for r in rows[name]],
               "is_ess": [mean_of(r, "rollout/is_ess") for r in rows[name]],
               "seconds": [sum(x.get("step_time", 0.0) for x in r) for r in rows[name]]}
        data["arms"][name] = arm
        lines.append(f"| {name} | {cell(arm['heldout'])} | {cell(arm['general'])} | {logged(arm['staleness'], 2)} | "
                     f"{logged(arm['mismatch_kl'], scientific=True)} | {logged(arm['is_ess'], 3)} | {cell(arm['seconds'], 0)} |")
    width = min(len(w) for arm in data["arms"].values() for w in arm["reward_windows"])
    lines += ["", "Training reward, mean over steps 1-10, 11-20, ... (mean ± s.e. over seeds)", "",
              "| run | " + " | ".join(f"{10 * i + 1}-{10 * i + 10}" for i in range(width)) + " |",
              "|---|" + "---|" * width]
    for name, arm in data["arms"].items():
        cells = []
        for i in range(width):
            mean, se = mean_se([w[i] for w in arm["reward_windows"]])
            cells.append(f"{mean:.3f} ± {se:.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for suffix in ("", "_lr"):
        if f"server_s1{suffix}" not in data["arms"]:
            continue
        s0, s1 = data["arms"][f"server_s0{suffix}"], data["arms"][f"server_s1{suffix}"]
        paired = {"reward, whole run": ([sum(w) / len(w) for w in s1["reward_windows"]],
                                        [sum(w) / len(w) for w in s0["reward_windows"]]),
                  "reward, last window": ([w[width - 1] for w in s1["reward_windows"]],
                                          [w[width - 1] for w in s0["reward_windows"]]),
                  "held-out": (s1["heldout"], s0["heldout"]), "general": (s1["general"], s0["general"])}
        lines += ["", f"Paired difference server_s1{suffix} - server_s0{suffix} (mean ± s.e. over seeds [per seed])",
                  ""]
        for what, (a, b) in paired.items():
            diffs = [x - y for x, y in zip(a, b)]
            data.setdefault(f"paired{suffix}", {})[what] = diffs
            lines.append(f"- {what}: {cell(diffs)}")
    adapters, data["sampled_under"] = adapter_lines(pipelines, arms)
    lines += [*adapters, "", f"Machine time of this invocation: {seconds / 60:.1f} min (finished stages reused count "
              "nothing)."]
    return "\n".join(lines) + "\n", data


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/staleness")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--port", type=int, default=8311, help="the reference server's port (fixed, so runs resume)")
    p.add_argument("--preset", default="default", help="the demo preset (quick: a check of this script)")
    p.add_argument("--control", action="store_true",
                   help=f"run the control arms alone (both server arms at learning rate {CONTROL_LR}) on the seeds, "
                        "then report every arm; give another --port while the main runs hold theirs")
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS),
                   help="the runs of each seed (default all three)")
    args = p.parse_args()
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    started, out = time.time(), Path(args.out)
    run_arms = tuple(CONTROL) if args.control else tuple(args.arms)
    pipelines = [run_seed(out / f"seed-{seed}", seed, args.steps, args.port, args.preset, run_arms)
                 for seed in range(args.seeds)]
    name = "staleness_control" if args.control else "staleness"
    arms = (*args.arms, *CONTROL) if args.control else tuple(args.arms)
    text, data = report(pipelines, args.steps, time.time() - started, arms)
    (out / f"{name}.md").write_text(text)
    (out / f"{name}.json").write_text(json.dumps(data, indent=1))
    print(text)


if __name__ == "__main__":
    main()
