"""Each added RL method where its mechanism can act: its paper's claim and the control that separates the
code from the world, on the long-chain world, over seeds, in one command.

    python benchmarks/rl_methods.py [--out runs/rl_methods] [--seeds 3] [--first 0] [--steps 80] [--every 10]
                                    [--world long] [--table] [--quick]

For each seed: the world, base and MoL model of ``molrl demo --world long`` (reused when already on disk),
then these RL runs of ``--steps`` steps (the demo's 80 by default) from the same models (``benchmarks/rl_demo.py`` does the running;
every finished run is reused, so a killed comparison continues where it stopped, across sessions):

=====================  ============================================================================
run                    what it measures
=====================  ============================================================================
mol+grpo               the baseline (the demo's GRPO)
mol+dr_grpo            the PPO control's reference
mol+grpo_partial       partial rollouts (APRIL): rollout throughput vs mol+grpo in training
mol+ppo                token-level PPO, separate critic (MA-RLHF's layout)
mol+ppo_fixed5         PPO over macro actions of 5 tokens: steps to mol+ppo's final reward
mol+ppo_group_mean     control: the critic replaced by the group mean, gamma = lam = 1, beta = 0:
                       its advantages are Dr.GRPO's, so it must track mol+dr_grpo
mol+opd                OPD, the feedback-reading teacher (lambda 1): steps to mol+grpo's held-out
mol+exopd              ExOPD (lambda 1.25) against OPD
mol+opd_strong         control: the teacher is mol+grpo's adapter (a strong teacher): OPD must climb
                       towards mol+grpo's accuracy
mol+grpo_buffer2       PROPS' reference: on-policy sampling in rounds with a 2-step buffer
mol+props              PROPS: sampling error and reward per completion vs mol+grpo_buffer2
mol+ppo_parsing        PPO over macro actions cut at the syntax's boundaries (lines, brackets)
mol+ppo_ppl            PPO over macro actions cut where the policy's perplexity jumps
mol+ppo_mean_critic    control: mol+ppo with the group mean for its critic (GAE lam 0.95, the KL
                       penalty kept): what the learned critic adds or costs
mol+opd_self           OPD with the current policy as the feedback-reading teacher (SDPO)
=====================  ============================================================================

Printed per claim: the figures with mean ± standard error over seeds and per-seed values, and a verdict
against the paper's number (partial rollouts +22.5% rollout throughput; macro actions reach token PPO's
final reward in <= 0.6x the steps; OPD reaches mol+grpo's held-out accuracy in <= 0.5x the steps).
Rewards are compared over 5-step windows. ``--first`` starts at a later seed, so that several processes can
split the seeds. ``--table`` prints from the finished runs only, without running anything. ``--quick`` checks the benchmark
itself in minutes (the demo's quick preset, 4 RL steps per run; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from rl_demo import curve, final_accuracy, metric_windows, metrics, reward_windows, run_seed

from molrl.demo.seeds import cell, mean_se
from molrl.records.layout import rl_runs


def runs(out: Path, steps: int = 80) -> dict[str, tuple[str, list[str]]]:
    """The comparison's runs {name: (start, overrides)}; ``out`` is the seed's pipeline directory.

    The controls (``mol+dr_grpo``, ``mol+ppo_group_mean``) and the PROPS pair run a quarter of ``steps``: the
    controls check advantages and rewards step by step, and a PROPS step costs several on-policy steps."""
    strong = rl_runs(out) / "mol+grpo" / "adapter"  # mol+grpo runs first, so its adapter exists by then
    short = f"train.max_steps={max(1, steps // 4)}"
    return {  # the claims' runs first, then the further comparisons
        "mol+grpo": ("mol", ["algorithm=grpo"]),
        "mol+dr_grpo": ("mol", ["algorithm=dr_grpo", short]),
        "mol+grpo_partial": ("mol", ["algorithm=grpo", "rollout.partial=true", "rollout.over_provision=2.0"]),
        "mol+ppo": ("mol", ["algorithm=ppo", "macro.rule=token", "ppo.critic=separate"]),
        "mol+ppo_fixed5": ("mol", ["algorithm=ppo", "macro.rule=fixed:5", "ppo.critic=separate"]),
        "mol+ppo_group_mean": ("mol", ["algorithm=ppo", "macro.rule=token", "ppo.critic=group_mean", "ppo.gamma=1.0",
                                       "ppo.lam=1.0", "beta=0", short]),
        "mol+opd": ("mol", ["algorithm=opd", "beta=0", "opd.teacher=feedback", "opd.lam=1.0"]),
        "mol+exopd": ("mol", ["algorithm=opd", "beta=0", "opd.teacher=feedback", "opd.lam=1.25"]),
        "mol+opd_strong": ("mol", ["algorithm=opd", "beta=0", "opd.teacher=model", f"opd.teacher_model={strong}"]),
        "mol+grpo_buffer2": ("mol", ["algorithm=grpo", "rollout.rounds=2", "rollout.buffer_batches=2",
                                     "rollout.sampling_error_split=0.5", short]),
        "mol+props": ("mol", ["algorithm=grpo", "rollout.behaviour=props", "rollout.sampling_error_split=0.5",
                              short]),
        "mol+ppo_parsing": ("mol", ["algorithm=ppo", "macro.rule=parsing", "ppo.critic=separate"]),
        "mol+ppo_ppl": ("mol", ["algorithm=ppo", "macro.rule=ppl", "ppo.critic=separate"]),
        "mol+ppo_mean_critic": ("mol", ["algorithm=ppo", "macro.rule=token", "ppo.critic=group_mean"]),
        "mol+opd_self": ("mol", ["algorithm=opd", "beta=0", "opd.teacher=feedback", "opd.teacher_weights=current"]),
    }


def rollout_throughput(pipeline: Path, run: str) -> float:
    """Generated tokens per second of generation over the run (the trained tokens for synchronous rollouts)."""
    rows = [r for r in metrics(pipeline, run) if "reward" in r]
    seconds = sum(r["time/generation_s"] for r in rows)
    if any("partial/generated_tokens" in r for r in rows):
        tokens = sum(r["partial/generated_tokens"] for r in rows)
    else:  # every sampled completion was generated in its own step
        lines = (rl_runs(pipeline) / run / "completions.jsonl").read_text().splitlines()
        tokens = sum(json.loads(line)["tokens"] for line in lines)
    return tokens / seconds


WINDOW = 5
"""Steps per reward window."""


def first_window(windows: list[float], target: float, width: int = WINDOW) -> int | None:
    """The last step of the first ``width``-step window whose mean reward reaches ``target``; None if none does."""
    hit = [i for i, value in enumerate(windows) if value >= target]
    return (hit[0] + 1) * width if hit else None


def first_eval(accuracy: dict[int, float], target: float) -> int | None:
    """The first evaluated step whose held-out accuracy reaches ``target``; None if none does."""
    hit = [s for s in sorted(accuracy) if accuracy[s] >= target]
    return hit[0] if hit else None


def ratio_cell(values: list[float | None]) -> str:
    shown = ", ".join("-" if v is None or math.isnan(v) else f"{v:.2f}" for v in values)
    finite = [v for v in values if v is not None and not math.isnan(v)]
    if len(finite) < 2:
        return f"[{shown}]"
    mean, se = mean_se(finite)
    return f"{mean:.2f} ± {se:.2f} [{shown}]"


def mean_of(values: list[float | None]) -> float:
    finite = [v for v in values if v is not None and not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


def run_mean(pipeline: Path, run: str, key: str) -> float:
    """Mean of ``key`` over the steps of ``run`` that logged it (nan if none did)."""
    return (metric_windows(pipeline, run, key, 1000) or [math.nan])[0]


def finished(pipeline: Path, run: str) -> bool:
    """Whether ``run`` finished training (its final evaluation comes when the seed's every run has)."""
    return (rl_runs(pipeline) / run / "DONE").is_file()


def accuracy(pipeline: Path, run: str, benchmark: str) -> float:
    """The final evaluation's pass@1; before the seed's evaluation stage, held-out is the last in-training
    evaluation's (the same greedy decoding of the same problems) and general is nan."""
    if (pipeline / "eval" / run / "results.json").is_file():
        return final_accuracy(pipeline, run, benchmark)
    in_training = curve(pipeline, run)[0]
    return in_training[max(in_training)] if benchmark == "heldout" and in_training else math.nan


def shown(values: list[float], digits: int = 3) -> str:
    return "-" if any(math.isnan(v) for v in values) else cell(values, digits)


def having(pipelines: list[Path], *names: str) -> list[Path]:
    """The seeds whose runs ``names`` have all finished."""
    return [p for p in pipelines if all(finished(p, run) for run in names)]


def seeds_of(pipelines: list[Path]) -> str:
    return "seeds " + ", ".join(p.parent.name.removeprefix("seed-") for p in pipelines)


def report(pipelines: list[Path]) -> list[str]:
    """The comparison's table and one paragraph per claim, with its verdict, as markdown lines. Each row and claim
    uses the seeds whose runs it needs have finished (named where they are not all of them)."""
    out = ["Mean ± standard error over seeds [per seed]; a claim or row lists its seeds when some have not run it.", "",
           "| run | seeds | RL steps | held-out | general | training reward | RL wall s |", "|---|---|---|---|---|---|---|"]
    for run in runs(pipelines[0]):  # the names only: the step counts do not matter here
        ps = having(pipelines, run)
        if not ps:
            out.append(f"| {run} | none yet | | | | | |")
            continue
        steps = len([r for r in metrics(ps[0], run) if "reward" in r])
        out.append(f"| {run} | {seeds_of(ps).removeprefix('seeds ')} | {steps} | "
                   f"{shown([accuracy(p, run, 'heldout') for p in ps])} | "
                   f"{shown([accuracy(p, run, 'general') for p in ps])} | "
                   f"{cell([run_mean(p, run, 'reward') for p in ps])} | {cell([curve(p, run)[1] for p in ps], 0)} |")
    for claim in (partial_claim, macro_claim, opd_claim, props_claim):
        out += ["", *claim(pipelines)]
    return out


def partial_claim(pipelines: list[Path]) -> list[str]:
    ps = having(pipelines, "mol+grpo", "mol+grpo_partial")
    if not ps:
        return ["**Partial rollouts**: not run yet"]
    sync = [rollout_throughput(p, "mol+grpo") for p in ps]
    partial = [rollout_throughput(p, "mol+grpo_partial") for p in ps]
    gain = [b / a for a, b in zip(sync, partial)]
    verdict = "holds" if mean_of(gain) >= 1.225 else "does not reach the paper's figure"
    return [f"**Partial rollouts** (paper: +22.5% rollout throughput; {seeds_of(ps)}): generated tokens per "
            f"generation-second, synchronous {cell(sync, 1)}, partial {cell(partial, 1)}; ratio {ratio_cell(gain)}: "
            f"{verdict}. Reward per completion, synchronous {cell([run_mean(p, 'mol+grpo', 'reward') for p in ps])}, "
            f"partial {cell([run_mean(p, 'mol+grpo_partial', 'reward') for p in ps])}; off-policy token fraction "
            f"{cell([run_mean(p, 'mol+grpo_partial', 'partial/off_policy_token_fraction') for p in ps])}."]


def macro_claim(pipelines: list[Path]) -> list[str]:
    ps = having(pipelines, "mol+ppo", "mol+ppo_fixed5")
    if not ps:
        return ["**PPO over macro actions**: not run yet"]
    windows = {run: [reward_windows(p, run, WINDOW) for p in ps] for run in ("mol+ppo", "mol+ppo_fixed5")}
    steps = {run: [first_window(w, t[-1]) for w, t in zip(windows[run], windows["mol+ppo"])] for run in windows}
    macro = [None if a is None or b is None else a / b for a, b in zip(steps["mol+ppo_fixed5"], steps["mol+ppo"])]
    verdict = "holds" if mean_of(macro) <= 0.6 else "does not hold"
    out = [f"**PPO over macro actions** (paper: token PPO's final reward in 0.5-0.6x the steps; {seeds_of(ps)}): the "
           f"last step of the first {WINDOW}-step window whose mean reward reaches mol+ppo's last window's, token "
           f"{steps['mol+ppo']}, fixed:5 {steps['mol+ppo_fixed5']}; ratio {ratio_cell(macro)}: {verdict}."]
    for run in ("mol+ppo", "mol+ppo_fixed5", "mol+ppo_parsing", "mol+ppo_ppl", "mol+ppo_mean_critic"):
        rs = having(pipelines, "mol+ppo", run)
        if not rs:
            continue
        w = [reward_windows(p, run, WINDOW) for p in rs]
        at = [first_window(x, reward_windows(p, "mol+ppo", WINDOW)[-1]) for x, p in zip(w, rs)]
        out.append(f"- {run} ({seeds_of(rs)}): steps {at}; reward, first and last {WINDOW}-step window "
                   f"{cell([x[0] for x in w])} -> {cell([x[-1] for x in w])}; macro actions per completion "
                   f"{cell([run_mean(p, run, 'critic/macro_actions_per_completion') for p in rs], 1)}; critic explained "
                   f"variance {cell([run_mean(p, run, 'critic/explained_variance') for p in rs])}")
    cs = having(pipelines, "mol+ppo_group_mean", "mol+dr_grpo")
    if cs:
        control = [abs(sum(a) / len(a) - sum(b) / len(b)) for a, b in
                   zip([reward_windows(p, "mol+ppo_group_mean", WINDOW) for p in cs],
                       [reward_windows(p, "mol+dr_grpo", WINDOW) for p in cs])]
        first_steps = []
        for p in cs:
            adv = {}
            for run in ("mol+ppo_group_mean", "mol+dr_grpo"):
                lines = [json.loads(x) for x in (rl_runs(p) / run / "completions.jsonl").read_text().splitlines()]
                adv[run] = [x["advantage"] for x in lines if x["step"] == 1]
            first_steps.append(max(abs(a - b) for a, b in zip(adv["mol+ppo_group_mean"], adv["mol+dr_grpo"])))
        out.append(f"- control, group-mean critic vs dr_grpo ({seeds_of(cs)}): largest step-1 advantage difference "
                   f"{ratio_cell(first_steps)}; mean training reward difference over the run {cell(control)}")
    return out


def opd_claim(pipelines: list[Path]) -> list[str]:
    ps = having(pipelines, "mol+grpo")
    target = [accuracy(p, "mol+grpo", "heldout") for p in ps]
    grpo_at = [first_eval(curve(p, "mol+grpo")[0], t) for p, t in zip(ps, target)]
    teacher = [json.loads((p.parent / "world" / "properties.json").read_text()) for p in ps]
    out = [f"**OPD** (goal: mol+grpo's final held-out accuracy {cell(target)} in <= 0.5x its steps; {seeds_of(ps)}); "
           f"mol+grpo reaches it at step {grpo_at}. The feedback teacher decodes "
           f"{cell([t['teacher_accuracy'] for t in teacher])} with the feedback in its context, the student "
           f"{cell([t['student_accuracy'] for t in teacher])} without."]
    for run in ("mol+opd", "mol+exopd", "mol+opd_self", "mol+opd_strong"):
        rs = having(ps, run)
        if not rs:
            continue
        at = [first_eval(curve(p, run)[0], t) for p, t in zip(ps, target) if p in rs]
        ratio = [None if a is None or g is None else a / g for a, g, p in zip(at, grpo_at, ps) if p in rs]
        by_step = {s: mean_of([curve(p, run)[0].get(s) for p in rs]) for s in sorted(curve(rs[0], run)[0])}
        out.append(f"- {run} ({seeds_of(rs)}): steps {at}, ratio {ratio_cell(ratio)}, final held-out "
                   f"{shown([accuracy(p, run, 'heldout') for p in rs])}; held-out by step (mean) "
                   + ", ".join(f"{s}: {a:.2f}" for s, a in by_step.items())
                   + f"; teacher minus reference log-prob per token "
                   f"{cell([run_mean(p, run, 'opd/teacher_minus_reference') for p in rs])}")
    return out


def props_claim(pipelines: list[Path]) -> list[str]:
    ps = having(pipelines, "mol+grpo_buffer2", "mol+props")
    if not ps:
        return ["**PROPS**: not run yet"]
    out = [f"**PROPS** (paper: lower sampling error than on-policy sampling at small batch; {seeds_of(ps)})"]
    for run in ("mol+grpo_buffer2", "mol+props"):
        figures = {key: [run_mean(p, run, key) for p in ps]
                   for key in ("sampling_error", "sampling_error/low_entropy", "sampling_error/high_entropy", "reward")}
        out.append(f"- {run}: error {cell(figures['sampling_error'])}, at entropy < 0.5 "
                   f"{cell(figures['sampling_error/low_entropy'])}, >= 0.5 {cell(figures['sampling_error/high_entropy'])}, "
                   f"reward per completion {cell(figures['reward'])}")
    ratio = [run_mean(p, "mol+props", "sampling_error") / run_mean(p, "mol+grpo_buffer2", "sampling_error") for p in ps]
    out.append(f"- error ratio PROPS / on-policy {ratio_cell(ratio)}: "
               + ("lower, as the paper reports" if mean_of(ratio) < 1 else "not lower"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/rl_methods")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first", type=int, default=0, help="first seed to run")
    parser.add_argument("--steps", type=int, default=80, help="RL steps per run")
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--world", default="long")
    parser.add_argument("--table", action="store_true", help="print from the finished runs; run nothing")
    parser.add_argument("--quick", action="store_true",
                        help="a check of the benchmark itself: the demo's quick preset and 4 RL steps per run")
    args = parser.parse_args()
    pipelines = []
    for seed in range(args.first, args.seeds):
        out = Path(args.out) / f"seed-{seed}"
        pipeline = out / "pipeline"
        if args.table:
            if finished(pipeline, "mol+grpo"):
                pipelines.append(pipeline)
            continue
        steps = 4 if args.quick else args.steps
        pipelines.append(run_seed(out, seed, args.every, runs(pipeline, steps), args.world,
                                  "quick" if args.quick else "default", [f"rl.train.max_steps={steps}"]))
    if not pipelines:
        print("no finished seed yet")
        return
    lines = report(pipelines)
    print("\n" + "\n".join(lines))
    (Path(args.out) / "rl_methods.md").write_text("# Each RL method where its mechanism can act\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
