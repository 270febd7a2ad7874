"""Costs side by side in one run, on a real pretrained model (SmolLM2-135M-Instruct) and real MINT traces.

Every figure is a ratio of variants timed in the same process, interleaved (A, B, A, B, ...), so a
machine shared with other work slows them alike; each reports the median ratio and the ratio of every round,
never a speed on its own.

  mol_vs_ce     molrl's MoL step (``MolTrainer.compute_loss`` + backward, as benchmarks/mol_step.py times it) over
                a plain CE step (the model's own forward with labels on decision and feedback tokens, + backward),
                on MINT traces (``--strip-example``) tokenised with the model's chat template and cut or packed
                end to end into rows of ``--seq-len`` tokens, LoRA on all linear layers with the MoL config's
                settings (rank 64, alpha 128, dropout 0.05). Goal <= 1.0x. Hooks on the decoder split both steps
                into policy blocks forward, the frozen base's forward (adapter disabled), the head and loss forward,
                the backward down to the final hidden states, and the backward through the blocks.
  mol_profile   one MoL and one CE step under ``torch.profiler``: the operators that take the most time.
  loss_memory   loss-path peak memory of molrl's chunked MoL loss against a naive MoL loss on full logits
                (``mol_step.loss_path``) on the model's own head and hidden states. Goal >= 4x below naive.
  rl_vs_trl     molrl's RL step (the ``RlTrainer`` ``molrl.rl.run.build_trainer`` builds) over TRL's own
                ``GRPOTrainer`` step: the same model loading, LoRA, prompt, GRPOConfig (``trl_args``), G
                completions sampled at the same seed, and the same reward (molrl's math grading, a TRL reward
                function as it stands). The learning rate is 0 so the policies stay the base and sample the same
                tokens; the optimiser still steps. The trainers are driven one step at a time by the same code
                (``training_step``, clipping, optimiser step), so TRL's outer loop is left out of all. A third
                variant, molrl with ``rollout.sampling_error`` off (the metric, read from the loss's own log-probs
                since it stopped running a forward pass of its own), is the control that says where a
                difference comes from. Goal <= 1.1x.
  generation_bN molrl's ``TransformersGenerator`` against plain ``model.generate`` on the same chat prompts
                (``render_prompts``), greedy, batch N: the ratio of their tokens per second.

    python benchmarks/real_model_costs.py --model DIR --traces ../shared/data/traces/mint \\
        --math500 ../shared/data/math500/test.jsonl
    python benchmarks/real_model_costs.py --gguf PATH/SmolLM2-135M-Instruct.Q4_1.gguf --traces DIR --quick

Results go to ``--out`` (default runs/real_model_costs, with ``--quick`` runs/real_model_costs_quick):
costs.json and costs.md. A measurement already in costs.json with the same settings is reused, so an
interrupted run continues where it stopped (``--redo NAME`` measures one again).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import random
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

import mol_step  # benchmarks/mol_step.py: its MoL trainer, masks and loss paths

MATH_TASKS = [  # short problems with exact answers, used when no --math500 file is given
    ("What is 17 * 23?", "391"), ("Compute the sum of the first 20 positive integers.", "210"),
    ("Solve for x: 3x + 7 = 22.", "5"), ("What is the remainder when 2^10 is divided by 7?", "2"),
    ("How many positive divisors does 36 have?", "9"), ("What is the greatest common divisor of 84 and 126?", "42"),
    ("Evaluate 5!/3!.", "20"), ("A rectangle has perimeter 30 and length 9. What is its area?", "54"),
]
QUICK = {"pairs": 2, "seq_len": 512, "memory_seq_lens": [512], "new_tokens": 32, "gen_tokens": 32}
"""--quick's settings (a few minutes on 2 cores)."""
GOALS = {"mol_vs_ce": "<= 1.0x", "loss_memory": ">= 4x below naive", "rl_vs_trl": "<= 1.1x",
         "generation_b1": "~1.0x", "generation_b8": "~1.0x"}


def now() -> float:
    return time.perf_counter()


def interleaved(runs: dict[str, Callable[[int], dict]], rounds: int, warmup: int) -> dict:
    """Runs the variants in turn, A, B, A, B, ... (``warmup`` untimed rounds first); a run returns a dict with its
    seconds under "s" and takes the round's index (negative in warm-up).

    Returns every run's dict by variant (``runs``), and for each variant but the last its per-round time ratios
    to the last (``ratios_to_last``); ``ratios`` and ``median_ratio`` are the first variant's.
    """
    names = list(runs)
    for i in range(warmup):
        for name in names:
            runs[name](-1 - i)
    out: dict[str, list[dict]] = {name: [] for name in names}
    for i in range(rounds):
        for name in names:
            out[name].append(runs[name](i))
        print(f"  round {i + 1}/{rounds}: " + " / ".join(f"{name} {out[name][-1]['s']:.2f} s" for name in names),
              flush=True)
    ratios = {name: [x["s"] / y["s"] for x, y in zip(out[name], out[names[-1]])] for name in names[:-1]}
    return {"runs": out, "ratios_to_last": ratios, "ratios": ratios[names[0]],
            "median_ratio": statistics.median(ratios[names[0]])}


# ---- the model and the data -----------------------------------------------------------------------------------

def model_dir(args: argparse.Namespace) -> str:
    """``--model``, or ``--gguf`` converted once into runs/real_model_costs/models/<name> and reused."""
    if not args.gguf:
        return args.model
    from molrl.engines.export import convert_gguf

    target = Path("runs/real_model_costs/models") / Path(args.gguf).stem
    if not (target / "config.json").is_file():
        print(f"converting {args.gguf} into {target}", flush=True)
        convert_gguf(args.gguf, target)
    return str(target)


def load_lora_model(path: str) -> Any:
    """The model with a fresh LoRA adapter on all linear layers, as the MoL stage's config makes it."""
    from peft import LoraConfig, get_peft_model

    from molrl.models import load_model
    from molrl.config.blocks import LoraAdapterConfig

    lora = LoraAdapterConfig()
    model = load_model(path, dtype="float32")
    model.config.use_cache = False
    torch.manual_seed(0)
    return get_peft_model(model, LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                            target_modules="all-linear", task_type="CAUSAL_LM"))


def trace_rows(args: argparse.Namespace, tokenizer: Any, seq_len: int, count: int) -> list[dict[str, torch.Tensor]]:
    """``count`` rows of ``seq_len`` tokens from the MINT traces: shuffled (seed 0), each trace cut at ``seq_len``,
    shorter ones joined end to end (attention then crosses the join, which changes no cost)."""
    from molrl.mol.data import load_examples
    from molrl.traces.importers import import_file
    from molrl.traces.schema import write_traces

    converted = Path(args.out) / "traces"
    if not converted.is_dir():  # molrl traces convert --from mint --strip-example, once
        converted.mkdir(parents=True)
        for path in sorted(Path(args.traces).glob("*.jsonl")):
            write_traces(converted / path.name, (t for _, t in import_file(path, "mint", strip_example=True).traces))
    examples, _ = load_examples(sorted(str(p) for p in converted.glob("*.jsonl")), tokenizer, max_length=1 << 20,
                                enable_thinking=False)
    random.Random(0).shuffle(examples)
    keys = ("input_ids", "feedback_mask", "decision_mask")
    rows, current = [], {k: [] for k in keys}
    for ex in examples:
        for k in keys:
            current[k] += ex[k]
        if len(current["input_ids"]) >= seq_len:
            rows.append({k: torch.tensor([v[:seq_len]]) for k, v in current.items()})  # [1, L]
            current = {k: [] for k in keys}
            if len(rows) == count:
                break
    for row in rows:
        row["attention_mask"] = torch.ones_like(row["input_ids"])
        row["is_general"] = torch.zeros(1, dtype=torch.bool)
    return rows


def math_tasks(args: argparse.Namespace, out: Path) -> tuple[Path, str]:
    """The RL and generation tasks: (file, format): ``--math500`` or the built-in problems written as JSONL."""
    if args.math500:
        return Path(args.math500), "math500"
    path = out / "math_tasks.jsonl"
    path.write_text("".join(json.dumps({"id": f"m{i}", "prompt": q, "answer": a}) + "\n"
                            for i, (q, a) in enumerate(MATH_TASKS)))
    return path, "jsonl"


# ---- MoL step over CE step --------------------------------------------------------------------------------------

class StepClock:
    """Time marks from hooks: each decoder forward (with or without grad) and the gradient's arrival at the
    decoder's output (the final hidden states) during backward."""

    def __init__(self, decoder: Any):
        self.marks: dict[str, float] = {}
        decoder.register_forward_pre_hook(lambda _m, _a: self.mark("start"))
        decoder.register_forward_hook(self._after)

    def mark(self, name: str, grad: bool | None = None) -> None:
        grad = torch.is_grad_enabled() if grad is None else grad
        self.marks[f"{name}_{'grad' if grad else 'nograd'}"] = now()

    def _after(self, _module: Any, _args: Any, out: Any) -> None:
        self.mark("end")
        hidden = out.last_hidden_state
        if hidden.requires_grad:
            hidden.register_hook(lambda _g: self.mark("hidden_grad", grad=True))


def timed_step(model: Any, clock: StepClock, forward: Callable[[], torch.Tensor]) -> dict:
    """One step (``forward`` returns the loss, then backward) and its parts from the clock's marks."""
    clock.marks.clear()
    t0 = now()
    loss = forward()
    t1 = now()
    loss.backward()
    t2 = now()
    model.zero_grad(set_to_none=True)
    m = clock.marks
    parts = {"blocks forward": m["end_grad"] - m["start_grad"]}
    if "start_nograd" in m:  # MoL: the policy (head at 1 position), the base without its adapter, then the loss
        parts["base forward (adapter disabled)"] = m["end_nograd"] - m["start_nograd"]
        parts["head + loss forward"] = t1 - m["end_nograd"]
    else:
        parts["head + loss forward"] = t1 - m["end_grad"]
    parts["backward to hidden states"] = m["hidden_grad_grad"] - t1
    parts["blocks backward"] = t2 - m["hidden_grad_grad"]
    parts["other"] = (t2 - t0) - sum(parts.values())
    return {"s": t2 - t0, "parts": parts}


def measure_mol_vs_ce(args: argparse.Namespace, path: str) -> dict:
    from molrl.models import load_tokenizer

    rows = trace_rows(args, load_tokenizer(path), args.seq_len, args.pairs + args.warmup)
    model = load_lora_model(path)
    model.train()
    trainer = mol_step.make_trainer(model, "cpu")
    clock = StepClock(model.get_base_model().get_decoder())
    batch = lambda i: rows[i % len(rows)]  # noqa: E731 - pair i uses row i (warm-up: the last rows)

    def mol(i: int) -> dict:
        b = batch(i)
        counts = mol_step.step_counts(mol_step._masks(b))
        return timed_step(model, clock, lambda: trainer.compute_loss(model, b, num_items_in_batch=counts))

    def ce(i: int) -> dict:
        b = batch(i)
        carries = (b["feedback_mask"] + b["decision_mask"]).bool()  # mol_step.step_ce's labels
        labels = torch.where(carries, b["input_ids"], torch.full_like(b["input_ids"], -100))
        return timed_step(model, clock, lambda: model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                                                      labels=labels, use_cache=False).loss)

    result = interleaved({"mol": mol, "ce": ce}, args.pairs, args.warmup)
    masks = [mol_step._masks(batch(i)) for i in range(args.pairs)]
    result["tokens"] = {"per_row": args.seq_len,
                        "feedback": statistics.mean(int(m.feedback.sum()) for m in masks),
                        "decision": statistics.mean(int(m.decision.sum()) for m in masks)}
    result["split"] = {name: {part: statistics.median(r["parts"][part] for r in runs) for part in runs[0]["parts"]}
                       for name, runs in result["runs"].items()}
    # what the MoL step would cost without the frozen base's forward, the one part a CE step has no counterpart of
    result["ratios_without_base_forward"] = [(m["s"] - m["parts"]["base forward (adapter disabled)"]) / c["s"]
                                             for m, c in zip(result["runs"]["mol"], result["runs"]["ce"])]
    return result


def measure_mol_profile(args: argparse.Namespace, path: str) -> dict:
    """The operators taking the most self time in one MoL and one CE step (after one warm-up step of each)."""
    from torch.profiler import ProfilerActivity, profile

    from molrl.models import load_tokenizer

    b = trace_rows(args, load_tokenizer(path), args.seq_len, 1)[0]
    model = load_lora_model(path)
    model.train()
    trainer = mol_step.make_trainer(model, "cpu")
    steps = {"mol": lambda: mol_step.step_mol(trainer, model, b), "ce": lambda: mol_step.step_ce(trainer, model, b)}
    out = {}
    for name, step in steps.items():
        step()
        model.zero_grad(set_to_none=True)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        model.zero_grad(set_to_none=True)
        events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        total = sum(e.self_cpu_time_total for e in events)
        top = [{"op": e.key, "calls": e.count, "self_s": e.self_cpu_time_total / 1e6}
               for e in events[:args.profile_rows]]
        out[name] = {"total_s": total / 1e6, "top": top}
    return out


# ---- loss-path memory --------------------------------------------------------------------------------------------

def measure_loss_memory(args: argparse.Namespace, path: str) -> dict:
    """mol_step's loss paths (ours, naive full logits, CE on full logits) on the model's head and hidden states."""
    from molrl.models import load_tokenizer

    model = load_lora_model(path)
    weight = model.get_output_embeddings().weight.detach()  # [V, H], tied to the embeddings
    tokenizer = load_tokenizer(path)
    out: dict[str, dict] = {}
    for seq_len in args.memory_seq_lens:
        batch = trace_rows(args, tokenizer, seq_len, 1)[0]
        with torch.no_grad():
            hidden0 = model.get_base_model().model(input_ids=batch["input_ids"]).last_hidden_state  # [1, L, H]
        figures = {}
        for kind in ("mol", "naive", "ce"):
            hidden = hidden0.clone().requires_grad_(True)
            base_hidden = hidden0 + 0.01 * torch.randn_like(hidden0)
            with mol_step.peak_memory("cpu") as mem:
                mol_step.loss_path(kind, hidden, base_hidden, weight, batch)
            figures[f"{kind}_mb"] = mem["peak"] / 2**20
            del hidden, base_hidden
            gc.collect()
        figures["naive_over_mol"] = figures["naive_mb"] / figures["mol_mb"]
        figures["ce_over_mol"] = figures["ce_mb"] / figures["mol_mb"]
        out[str(seq_len)] = figures
        print(f"  {seq_len} tokens: " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()), flush=True)
    return {"by_seq_len": out}


# ---- molrl's RL step over TRL's GRPOTrainer step --------------------------------------------------------------

def rl_config(args: argparse.Namespace, model: str, tasks: tuple[Path, str], out: Path, sampling_error: bool) -> Any:
    """molrl's RL config for this comparison. The only place that names RlConfig's keys (adjust here when they move)."""
    from molrl.rl.config import RlConfig, TaskSource, rl_lora, rl_sampling, rl_train
    from molrl.rl.method_settings import RolloutSettings

    return RlConfig(output_dir=out, model=model, lora=rl_lora(rank=64, alpha=128),
                    data=TaskSource(path=tasks[0], format=tasks[1], limit=8), algorithm="grpo",
                    sampling=rl_sampling(n=args.generations, max_new_tokens=args.new_tokens),
                    max_prompt_length=1024,
                    train=rl_train(learning_rate=0.0, micro_batch_size=args.generations, max_steps=1000,
                                        save_steps=1000, report_to=["none"]),
                    rollout=RolloutSettings(sampling_error=sampling_error), threads=args.threads)


def measure_rl_vs_trl(args: argparse.Namespace, path: str) -> dict:
    """molrl's step as configured by default, the same without the sampling-error metric's forward pass (the
    control), and TRL's GRPOTrainer step, in turn."""
    from datasets import Dataset
    from trl import GRPOTrainer

    from molrl.graders.code import CodeRewardConfig
    from molrl.rl.policy import build_policy
    from molrl.rl.run import build_trainer, trl_args
    from molrl.rl.score import Scorer

    work, tasks = Path(args.out) / "work", math_tasks(args, Path(args.out))
    cfg = rl_config(args, path, tasks, work / "molrl", sampling_error=True)
    trainers, pools = {}, []
    for name, sampling_error in (("molrl", True), ("molrl_no_sampling_error", False)):
        trainer, _, pool = build_trainer(rl_config(args, path, tasks, work / name, sampling_error))
        trainers[name] = trainer
        pools.append(pool)
    policy = build_policy(cfg)  # the same loading and LoRA for TRL's trainer
    rows = [dict(r) for r in trainers["molrl"].train_dataset]
    trainers["trl"] = GRPOTrainer(
        model=policy.model, reward_funcs=[Scorer(None, CodeRewardConfig())],
        args=trl_args(cfg, work / "trl", cuda=False), processing_class=policy.tokenizer, peft_config=policy.peft_config,
        train_dataset=Dataset.from_list([{"prompt": r["prompt"], "task_json": r["task_json"]} for r in rows]))
    samples: dict[str, list] = {name: [] for name in trainers}
    for name, trainer in trainers.items():
        trainer.create_optimizer()
        trainer.current_gradient_accumulation_steps = 1  # set by TRL's loop, which we do not run
        trainer.timing = {}
        _time_method(trainer, "_generate", "generation", samples[name])
        if name == "trl":
            _time_method(trainer, "_calculate_rewards", "reward", None)
        else:
            _time_method(trainer.scorer, "score", "reward", None, owner=trainer)

    def step(trainer: Any) -> Callable[[int], dict]:
        def run(i: int) -> dict:
            row = rows[i % len(rows)]
            torch.manual_seed(1000 + i)  # the same seed for every trainer: the same samples
            trainer.timing.clear()
            t0 = now()
            trainer.training_step(trainer.model, [row] * args.generations, None)  # rollout, score, loss, backward
            params = [p for p in trainer.model.parameters() if p.requires_grad]
            trainer.accelerator.clip_grad_norm_(params, trainer.args.max_grad_norm)
            trainer.optimizer.step()
            trainer.optimizer.zero_grad(set_to_none=True)
            seconds = now() - t0
            return {"s": seconds, **trainer.timing, "rest": seconds - sum(trainer.timing.values())}
        return run

    try:
        result = interleaved({name: step(t) for name, t in trainers.items()}, args.pairs, args.warmup)
    finally:
        for pool in pools:
            if pool is not None:
                pool.close()
    timed = {name: s[args.warmup:] for name, s in samples.items()}  # the warm-up rounds' samples come first
    result["same_samples"] = {name: [x == y for x, y in zip(timed[name], timed["trl"])] for name in trainers}
    result["completion_tokens"] = [sum(len(c) for c in s[1]) for s in timed["trl"]]
    result["split"] = {name: {k: statistics.median(r[k] for r in runs) for k in ("generation", "reward", "rest")}
                       for name, runs in result["runs"].items()}
    return result


def _time_method(obj: Any, method: str, label: str, keep: list | None, owner: Any = None) -> None:
    """Wrap ``obj.method`` so its seconds add up in ``owner.timing[label]`` (and its (prompt ids, completion ids)
    results go to ``keep``)."""
    inner, owner = getattr(obj, method), owner or obj

    def wrapped(*a: Any, **k: Any) -> Any:
        t0 = now()
        result = inner(*a, **k)
        owner.timing[label] = owner.timing.get(label, 0.0) + now() - t0
        if keep is not None:
            keep.append((list(map(list, result[0])), list(map(list, result[1]))))
        return result

    setattr(obj, method, wrapped)


# ---- generation --------------------------------------------------------------------------------------------------

def measure_generation(args: argparse.Namespace, path: str, batch_size: int) -> dict:
    from molrl.engines.generation import TransformersGenerator
    from molrl.models import load_model, load_tokenizer
    from molrl.engines.sampling import SamplingConfig
    from molrl.tasks import load_tasks
    from molrl.traces.spans import render_prompts

    tok, model = load_tokenizer(path), load_model(path, dtype="float32")
    model.eval()
    file, fmt = math_tasks(args, Path(args.out))
    tasks = load_tasks(file, fmt)
    generator = TransformersGenerator(model, tok, batch_size=batch_size)
    sampling = SamplingConfig(n=1, temperature=0.0, max_new_tokens=args.gen_tokens)
    eos = {tok.eos_token_id, tok.pad_token_id}
    outputs: dict[str, list] = {"molrl": [], "plain": []}

    def prompts(i: int) -> list:
        start = (i % (len(tasks) // batch_size or 1)) * batch_size
        return render_prompts(tok, tasks[start:start + batch_size], enable_thinking=False)

    def ours(i: int) -> dict:
        batch = prompts(i)
        t0 = now()
        texts = [str(c[0]) for c in generator.generate(batch, sampling)]
        seconds = now() - t0
        outputs["molrl"].append(texts)
        return {"s": seconds}

    @torch.no_grad()
    def plain(i: int) -> dict:
        batch = prompts(i)
        enc = tok.pad({"input_ids": [list(p.ids) for p in batch]}, return_tensors="pt")  # left padding
        t0 = now()
        out = model.generate(**enc, max_new_tokens=args.gen_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
        seconds = now() - t0
        new = out[:, enc["input_ids"].shape[1]:].tolist()
        ends = [next((j for j, t in enumerate(r) if t in eos), None) for r in new]
        outputs["plain"].append([tok.decode(r[:e] if e is not None else r) for r, e in zip(new, ends)])
        return {"s": seconds, "tokens": sum(len(r) if e is None else e + 1 for r, e in zip(new, ends))}

    result = interleaved({"molrl": ours, "plain": plain}, args.pairs, args.warmup)
    a, b = result["runs"]["molrl"], result["runs"]["plain"]
    # The same prompts give the same greedy tokens (checked: same_text), so the tokens/s ratio molrl / plain is the
    # time ratio plain / molrl; tokens are counted on plain generate's ids.
    result["ratios"] = [y["s"] / x["s"] for x, y in zip(a, b)]
    result["median_ratio"] = statistics.median(result["ratios"])
    result["tokens_per_s"] = {"molrl": [y["tokens"] / x["s"] for x, y in zip(a, b)],
                              "plain": [y["tokens"] / y["s"] for y in b]}
    result["same_text"] = [sorted(a) == sorted(b) for a, b in zip(outputs["molrl"][args.warmup:],
                                                                  outputs["plain"][args.warmup:])]
    return result


# ---- the record ---------------------------------------------------------------------------------------------------

def environment(args: argparse.Namespace) -> dict:
    import peft
    import transformers
    import trl

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    return {"device": f"cpu: {cpu}, {len(os.sched_getaffinity(0))} cores usable",
            "load_average": open("/proc/loadavg").read().split()[:3], "torch": torch.__version__,
            "transformers": transformers.__version__, "peft": peft.__version__, "trl": trl.__version__,
            "python": platform.python_version(), "threads": torch.get_num_threads(),
            "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
            "date": datetime.datetime.now().isoformat(timespec="seconds")}


def markdown(record: dict) -> str:
    env, res = record["environment"], record["results"]
    lines = ["# Costs on a real pretrained model", "",
             f"{env['date']}; {env['device']}; load average at start {' '.join(env['load_average'])}; "
             f"torch {env['torch']}, transformers {env['transformers']}, peft {env['peft']}, trl {env['trl']}, "
             f"Python {env['python']}; torch threads {env['threads']}", "", f"`{env['command']}`", "",
             "| measurement | A / B | median | per run | goal |", "|---|---|---:|---|---|"]
    names = {"mol_vs_ce": "MoL step / CE step", "rl_vs_trl": "molrl RL step / TRL GRPOTrainer step",
             "generation_b1": "TransformersGenerator / model.generate tokens/s, batch 1",
             "generation_b8": "TransformersGenerator / model.generate tokens/s, batch 8"}
    for key, label in names.items():
        if key in res:
            r = res[key]
            lines.append(f"| {key} | {label} | {r['median_ratio']:.3f}x | "
                         f"{', '.join(f'{x:.3f}' for x in r['ratios'])} | {GOALS[key]} |")
            if key == "mol_vs_ce":  # derived from the split: the step less the base's forward
                derived = r["ratios_without_base_forward"]
                lines.append(f"| {key} (less the base forward) | (MoL step - base forward) / CE step | "
                             f"{statistics.median(derived):.3f}x | {', '.join(f'{x:.3f}' for x in derived)} | - |")
            if key == "rl_vs_trl":  # the control: molrl's step without the sampling-error metric
                control = r["ratios_to_last"]["molrl_no_sampling_error"]
                lines.append(f"| {key} (control) | molrl RL step with rollout.sampling_error=false / TRL | "
                             f"{statistics.median(control):.3f}x | {', '.join(f'{x:.3f}' for x in control)} | - |")
    for seq, f in res.get("loss_memory", {}).get("by_seq_len", {}).items():
        lines.append(f"| loss_memory {seq} tokens | naive / ours peak MB ({f['naive_mb']:.0f} / {f['mol_mb']:.0f}) | "
                     f"{f['naive_over_mol']:.1f}x | CE on full logits / ours {f['ce_over_mol']:.1f}x | "
                     f"{GOALS['loss_memory']} |")
    if "mol_vs_ce" in res:
        split = res["mol_vs_ce"]["split"]
        parts = list(dict.fromkeys([*split["mol"], *split["ce"]]))
        lines += ["", "MoL and CE steps by part (median seconds over the timed runs):", "",
                  "| part | MoL | CE |", "|---|---:|---:|"]
        lines += [f"| {p} | {split['mol'].get(p, 0.0):.3f} | {split['ce'].get(p, 0.0):.3f} |" for p in parts]
        runs = res["mol_vs_ce"]["runs"]
        lines.append(f"| whole step | {statistics.median(r['s'] for r in runs['mol']):.3f} | "
                     f"{statistics.median(r['s'] for r in runs['ce']):.3f} |")
    if "rl_vs_trl" in res:
        r = res["rl_vs_trl"]
        lines += ["", "RL steps by part (median seconds): " + "; ".join(
            f"{n}: " + ", ".join(f"{k} {v:.3f}" for k, v in s.items()) for n, s in r["split"].items()),
            "Same samples as TRL's trainer: " + ", ".join(f"{n} {sum(v)} of {len(v)} steps" for n, v in
                                                          r["same_samples"].items() if n != "trl")
            + f"; completion tokens per step {r['completion_tokens']}."]
    for key in ("generation_b1", "generation_b8"):
        if key in res:
            r = res[key]
            lines.append(f"{key}: tokens/s molrl {[round(x, 1) for x in r['tokens_per_s']['molrl']]}, plain "
                         f"{[round(x, 1) for x in r['tokens_per_s']['plain']]}; same text {sum(r['same_text'])} of "
                         f"{len(r['same_text'])}.")
    if "mol_profile" in res:
        for name in ("mol", "ce"):
            p = res["mol_profile"][name]
            lines += ["", f"{name} step under torch.profiler, {p['total_s']:.2f} s of self time; the most:", "",
                      "| op | calls | self s |", "|---|---:|---:|"]
            lines += [f"| {e['op']} | {e['calls']} | {e['self_s']:.3f} |" for e in p["top"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a plain transformers model directory (molrl export --gguf makes one)")
    parser.add_argument("--gguf", help="a GGUF file, converted once into runs/real_model_costs/models/ "
                                       "(replaces --model)")
    parser.add_argument("--traces", required=True, help="the MINT trace folder (its *.jsonl files)")
    parser.add_argument("--math500", help="MATH-500 test.jsonl for the RL and generation prompts (default: 8 built-in)")
    parser.add_argument("--out", help="output folder (default runs/real_model_costs; with --quick "
                                      "runs/real_model_costs_quick)")
    parser.add_argument("--quick", action="store_true", help="small settings where not given: " + ", ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items()))
    parser.add_argument("--only", help="comma-separated measurements: loss_memory, mol_vs_ce, mol_profile, rl_vs_trl, "
                                       "generation_b1, generation_b8")
    parser.add_argument("--redo", default="", help="comma-separated measurements to measure again")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--pairs", type=int, default=5, help="timed rounds (A, B) per measurement")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--seq-len", type=int, default=1024, help="tokens per MoL / CE row")
    parser.add_argument("--memory-seq-lens", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--generations", type=int, default=4, help="RL completions per prompt")
    parser.add_argument("--new-tokens", type=int, default=96, help="RL max completion length")
    parser.add_argument("--gen-tokens", type=int, default=128, help="max new tokens in the generation comparison")
    parser.add_argument("--profile-rows", type=int, default=12)
    args = parser.parse_args()
    for key, value in QUICK.items() if args.quick else ():
        if getattr(args, key) == parser.get_default(key):
            setattr(args, key, value)
    if not (args.model or args.gguf):
        parser.error("give --model DIR or --gguf FILE")
    args.out = args.out or ("runs/real_model_costs_quick" if args.quick else "runs/real_model_costs")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = model_dir(args)
    record_file = out / "costs.json"
    record = json.loads(record_file.read_text()) if record_file.is_file() else {"results": {}}
    env = environment(args)  # the record's environment is that of the last run that measured something
    common = {"model": path, "threads": args.threads, "pairs": args.pairs, "warmup": args.warmup}
    plan = {
        "loss_memory": ({"seq_lens": args.memory_seq_lens}, lambda: measure_loss_memory(args, path)),
        "mol_vs_ce": ({"seq_len": args.seq_len}, lambda: measure_mol_vs_ce(args, path)),
        "mol_profile": ({"seq_len": args.seq_len}, lambda: measure_mol_profile(args, path)),
        "rl_vs_trl": ({"generations": args.generations, "new_tokens": args.new_tokens, "math500": args.math500},
                      lambda: measure_rl_vs_trl(args, path)),
        "generation_b1": ({"gen_tokens": args.gen_tokens, "math500": args.math500},
                          lambda: measure_generation(args, path, 1)),
        "generation_b8": ({"gen_tokens": args.gen_tokens, "math500": args.math500},
                          lambda: measure_generation(args, path, 8)),
    }
    chosen = args.only.split(",") if args.only else list(plan)
    for name in chosen:
        settings, measure = plan[name]
        settings = {**common, **settings}
        done = record["results"].get(name)
        if done and done.get("settings") == settings and name not in args.redo.split(","):
            print(f"{name}: reused from {record_file} ({done['date']})")
            continue
        print(f"{name} ...", flush=True)
        t0 = now()
        result = measure()
        record["environment"] = env
        record["results"][name] = {**result, "settings": settings, "date": env["date"], "command": env["command"],
                                   "load_average": env["load_average"], "wall_s": now() - t0}
        record_file.write_text(json.dumps(record, indent=1))
        gc.collect()
    text = markdown(record)
    (out / "costs.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
