"""MoL's mechanism on a real pretrained model (SmolLM2-135M-Instruct) and real MINT traces, over seeds.

From the base, each arm trains a LoRA adapter with ``molrl mol`` on MINT traces (in-context example stripped,
traces with at least one feedback turn), split by task: the traces of one task (whichever agent wrote them) are
all in training or all held out. Arms (``loss.*`` settings):

  mol        CE on feedback + KL to the base on decisions (weight 1)
  ce         CE on every assistant and tool token
  ce_fb      CE on feedback only, no KL (the KL weight at 0)
  mol_kl0.1  MoL with the KL weight 10x lower
  mol_kl10   MoL with the KL weight 10x higher

Measured per arm and seed, on the same held-out traces and general prompts:
  absorption   held-out traces' feedback NLL (nats per token; lower = more absorbed; the base's is the reference)
  drift        full-vocabulary KL(trained || base) on held-out decision tokens (nats per token)
  forgetting   on general prompts MINT does not contain (MATH-500, HumanEval, MBPP prompts whose problem text is in
               no MINT trace): the NLL of the base's own greedy answers under the trained model minus under the base,
               and the full-vocabulary KL(trained || base) on those answer tokens
  agreement    generation level: the share of general prompts where the trained model's greedy answer equals the
               base's, token for token (and the mean share of the answer's tokens before they first differ)

Verdicts (over seeds, paired by seed; the rule of ``molrl.study.verdict``, every measure here in nats with the
study's smallest KL effect, 0.005): a difference "holds" on 3 seeds or more when its mean is at least that effect, over
Student's t standard errors and of the same sign on every seed; "refuted" when that holds the other way; "no effect
found" under the smallest effect; else "undecided", with the chance more seeds would decide it. MoL "absorbs about as much as
CE" holds when MoL's absorption is at least 80% of CE's on every seed and on the mean less 2 s.e.

    python benchmarks/real_model.py --gguf PATH/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --traces ../shared/data/traces/mint --data ../shared/data
    python benchmarks/real_model.py --model DIR --traces DIR --data DIR --quick     # one seed, 2 steps: a check

Resumable: each arm is a ``molrl mol`` run under OUT/seed<S>/<arm> (a finished run is not trained again) and its
measurement is kept in measure.json beside it; the base's answers and figures are kept in OUT/base.json. The
report (OUT/report.md, OUT/study.json) tables whatever has finished, with each run's wall time.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from molrl.demo.seeds import mean_se

ARMS = {
    "mol": ["loss.mode=mol", "loss.kl_weight=1.0"],
    "ce": ["loss.mode=ce"],
    "ce_fb": ["loss.mode=ce_feedback"],
    "mol_kl0.1": ["loss.mode=mol", "loss.kl_weight=0.1"],
    "mol_kl10": ["loss.mode=mol", "loss.kl_weight=10.0"],
}
FULL = {"steps": 8, "grad_accumulation": 2, "held_out": 10, "general_per_source": 8, "answer_tokens": 32, "seeds": 3}
QUICK = {"steps": 2, "grad_accumulation": 1, "held_out": 3, "general_per_source": 2, "answer_tokens": 16, "seeds": 1}
TRAIN = ["data.max_length=1024", "thinking=false", "lora.rank=16", "lora.alpha=32",
         "train.learning_rate=5e-4", "train.warmup_ratio=0.0", "train.micro_batch_size=1", "train.report_to=[]",
         "threads=1"]
HELD_OUT_SHARE = 0.2
MAX_LENGTH = 1024


# ---- statistics and verdicts (pure) ------------------------------------------------------------------------------

def verdict(diffs: Sequence[float]) -> str:
    """The study's verdict rule (``molrl.study.verdict``) at the smallest KL effect, with what more seeds would say of
    an undecided claim."""
    from molrl.study.claims import KL_NATS
    from molrl.study.verdict import outlook, paired_se, verdict as rule

    found = rule(diffs, KL_NATS)
    return found if found != "undecided" else f"undecided ({outlook(diffs, KL_NATS, paired_se(diffs))})"


def about_as_much(side: Sequence[float], ref: Sequence[float], share: float = 0.8) -> str:
    """Holds when ``side`` reaches ``share`` of ``ref`` on every seed and on the mean of side - share*ref less 2 s.e."""
    diffs = [s - share * r for s, r in zip(side, ref)]
    if len(diffs) < 2:
        return "undecided (one seed)"
    m, se = mean_se(diffs)
    if all(d > 0 for d in diffs) and m - 2 * se > 0:
        return "holds"
    if all(d < 0 for d in diffs) and m + 2 * se < 0:
        return "refuted"
    return f"undecided (side - {share} x ref: mean {m:+.4f}, 2 s.e. {2 * se:.4f})"


# ---- data ----------------------------------------------------------------------------------------------------------

def task_key(trace: dict) -> str:
    """The task a MINT trace solves, the same whichever agent wrote it: its dataset and the task's text."""
    first = trace["messages"][0]["content"]
    text = first.split("Task:", 1)[-1].strip()
    return f"{trace['meta'].get('dataset')}:{hashlib.sha1(text.encode()).hexdigest()[:16]}"


def feedback_turns(trace: dict) -> int:
    """Tool messages: the environment's feedback, as ``molrl traces filter --min-feedback-turns`` counts it."""
    return sum(m["role"] == "tool" for m in trace["messages"])


def split_traces(traces_dir: Path, out: Path) -> tuple[Path, Path, dict]:
    """MINT converted with the example stripped, traces with feedback, split by task into train.jsonl/held_out.jsonl."""
    train, held = out / "data/train.jsonl", out / "data/held_out.jsonl"
    if train.is_file() and held.is_file():
        return train, held, json.loads((out / "data/split.json").read_text())
    from molrl.traces.importers import import_file

    rows = []
    for path in sorted(traces_dir.glob("*.jsonl")):
        for _, t in import_file(path, "mint", strip_example=True).traces:
            rows.append(t.to_dict())
    rows = [r for r in rows if feedback_turns(r) > 0]
    keys = sorted({task_key(r) for r in rows})
    random.Random(0).shuffle(keys)
    held_keys = set(keys[: round(len(keys) * HELD_OUT_SHARE)])
    train.parent.mkdir(parents=True, exist_ok=True)
    with train.open("w") as tf, held.open("w") as hf:
        for r in rows:
            (hf if task_key(r) in held_keys else tf).write(json.dumps(r, ensure_ascii=True) + "\n")
    split = {"traces": len(rows), "tasks": len(keys), "held_out_tasks": len(held_keys),
             "held_out_traces": sum(task_key(r) in held_keys for r in rows)}
    (out / "data/split.json").write_text(json.dumps(split, indent=1))
    return train, held, split


def normalised(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def general_tasks(data: Path, mint_text: str, per_source: int) -> list[Any]:
    """``per_source`` tasks each from MATH-500, HumanEval and MBPP whose problem text no MINT trace contains."""
    from molrl.tasks.loaders import load_tasks

    sources = [("math500/test.jsonl", "math500"), ("humaneval/HumanEval.jsonl.gz", "humaneval"),
               ("mbpp/mbpp.jsonl", "mbpp")]
    chosen = []
    for rel, fmt in sources:
        tasks = load_tasks(data / rel, fmt)
        fresh = [t for t in tasks if normalised(t.prompt)[:80] not in mint_text]
        random.Random(0).shuffle(fresh)
        chosen += sorted(fresh[:per_source], key=lambda t: len(t.prompt))
    return chosen


# ---- measurement ---------------------------------------------------------------------------------------------------

def token_terms(model: Any, ids: "torch.Tensor", masks: Sequence["torch.Tensor"]) -> list[dict[str, float]]:  # noqa: F821
    """Per mask ([L-1] bool, position t predicting token t+1): sums of the trained model's NLL, the base's NLL and
    the full-vocabulary KL(trained || base) over its positions, with their count; one forward of each model."""
    import torch

    with torch.no_grad():
        logp = torch.log_softmax(model(ids[None]).logits[0, :-1].float(), -1)
        with model.disable_adapter():
            base = torch.log_softmax(model(ids[None]).logits[0, :-1].float(), -1)
    out = []
    for mask in masks:
        p, b, target = logp[mask], base[mask], ids[1:][mask][:, None]
        out.append({"nll": float(-p.gather(-1, target).sum()), "base_nll": float(-b.gather(-1, target).sum()),
                    "kl": float((p.exp() * (p - b)).sum()), "n": int(mask.sum())})
    return out


def summed(parts: list[dict[str, float]]) -> dict[str, float]:
    return {k: sum(p[k] for p in parts) for k in parts[0]}


def greedy(model: Any, tokenizer: Any, prompts: list[Any], new_tokens: int) -> list[list[int]]:
    """Greedy answers (token ids, up to eos) for chat prompts, in batches of 8 with left padding."""
    import torch

    answers = []
    for i in range(0, len(prompts), 8):
        batch = [list(p.ids) for p in prompts[i:i + 8]]
        width = max(map(len, batch))
        pad = tokenizer.pad_token_id
        ids = torch.tensor([[pad] * (width - len(b)) + b for b in batch])
        mask = torch.tensor([[0] * (width - len(b)) + [1] * len(b) for b in batch])
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=pad)
        for row in out[:, width:].tolist():
            cut = row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
            answers.append(row[:cut])
    return answers


def measure(model: Any, tokenizer: Any, held: list[dict], prompts: list[Any], base_answers: list[list[int]],
            new_tokens: int, generate: bool = True) -> dict[str, Any]:
    """The held-out and general figures of ``model`` (a PeftModel) against its base (the adapter disabled)."""
    import torch

    fb, dec = [], []
    for ex in held:
        ids = torch.tensor(ex["input_ids"])
        f, d = token_terms(model, ids, [torch.tensor(ex[k][1:]).bool() for k in ("feedback_mask", "decision_mask")])
        fb.append(f)
        dec.append(d)
    gen = []
    for prompt, answer in zip(prompts, base_answers):
        ids = torch.tensor(list(prompt.ids) + answer)
        positions = torch.zeros(len(ids) - 1, dtype=torch.bool)
        positions[len(prompt.ids) - 1:] = True
        gen += token_terms(model, ids, [positions])
    fb, dec, gen = summed(fb), summed(dec), summed(gen)
    result = {
        "feedback_nll": fb["nll"] / fb["n"], "base_feedback_nll": fb["base_nll"] / fb["n"], "feedback_tokens": fb["n"],
        "decision_kl": dec["kl"] / dec["n"], "decision_tokens": dec["n"],
        "general_nll_increase": (gen["nll"] - gen["base_nll"]) / gen["n"], "general_kl": gen["kl"] / gen["n"],
        "general_tokens": gen["n"],
    }
    if generate:
        own = greedy(model, tokenizer, prompts, new_tokens)
        same = [a == b for a, b in zip(own, base_answers)]
        prefix = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))) / max(len(b), 1)
                  for a, b in zip(own, base_answers)]
        result |= {"greedy_same": sum(same) / len(same), "greedy_prefix": statistics.fmean(prefix)}
    return result


# ---- runs ----------------------------------------------------------------------------------------------------------

def train_arm(model_dir: str, train: Path, run: Path, arm: str, seed: int, size: dict) -> float:
    """``molrl mol`` for one arm and seed (a finished run is a no-op); its wall seconds."""
    args = [sys.executable, "-m", "molrl.cli", "mol", f"model={model_dir}", f"output_dir={run}",
            f"data.traces=[{train}]", *TRAIN, f"train.seed={seed}", f"train.max_steps={size['steps']}",
            f"train.grad_accumulation={size['grad_accumulation']}", f"train.save_steps={size['steps']}", *ARMS[arm]]
    start = time.time()
    done = subprocess.run(args, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
    (run.parent / f"{arm}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"molrl mol ({arm}, seed {seed}) failed:\n{done.stderr[-3000:]}")
    return time.time() - start


CLAIM = "claimed.pid"


def claimed(run: Path) -> bool:
    """Claim ``run`` for this process (False when a live process holds it): OUT/seed<S>/<arm>/claimed.pid."""
    run.mkdir(parents=True, exist_ok=True)
    marker = run / CLAIM
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            os.kill(int(marker.read_text() or 0), 0)
            return False  # a live process trains or measures it
        except (ProcessLookupError, ValueError):
            marker.unlink(missing_ok=True)  # left by a killed process
            return claimed(run)
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


def model_dir(args: argparse.Namespace, out: Path) -> str:
    """``--model``, or ``--gguf`` converted once into OUT/model and reused."""
    if not args.gguf:
        return args.model
    from molrl.engines.export import convert_gguf

    target = out / "model"
    if not (target / "config.json").is_file():
        print(f"converting {args.gguf} into {target}", flush=True)
        convert_gguf(args.gguf, target)
    return str(target)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a plain transformers directory of the model")
    p.add_argument("--gguf", help="or SmolLM2's GGUF file, converted once into OUT/model")
    p.add_argument("--traces", required=True, help="folder of MINT .jsonl files (../shared/data/traces/mint)")
    p.add_argument("--data", required=True, help="folder with math500/, humaneval/, mbpp/ (../shared/data)")
    p.add_argument("--out", help="results folder (default runs/real_model, runs/real_model_quick with --quick)")
    p.add_argument("--seeds", type=int, help="seeds (default 3; 1 with --quick)")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated arms (default all: {','.join(ARMS)})")
    p.add_argument("--reverse", action="store_true",
                   help="take the runs last first: a second process beside a first shares the work (each run is "
                        "claimed by the process that takes it)")
    p.add_argument("--quick", action="store_true", help="one seed, two steps, a few prompts: checks the whole path")
    args = p.parse_args()
    if not (args.model or args.gguf):
        p.error("give --model DIR or --gguf FILE")
    size = dict(QUICK if args.quick else FULL)
    size["seeds"] = args.seeds or size["seeds"]
    out = Path(args.out or ("runs/real_model_quick" if args.quick else "runs/real_model"))
    out.mkdir(parents=True, exist_ok=True)
    import torch

    torch.set_num_threads(1)
    path = model_dir(args, out)
    train, held_path, split = split_traces(Path(args.traces), out)
    print(f"traces: {split}", flush=True)
    runs = [(seed, arm) for seed in range(size["seeds"]) for arm in args.arms.split(",")]
    for seed, arm in runs[::-1] if args.reverse else runs:
        run = out / f"seed{seed}" / arm
        if (run / "measure.json").is_file() or not claimed(run):
            continue
        try:
            seconds = train_arm(path, train, run, arm, seed, size)
            print(f"seed {seed} {arm}: trained in {seconds:.0f} s", flush=True)
            start = time.time()
            figures = measure_run(path, run / "adapter", held_path, args, size, out)
            figures |= {"train_s": seconds, "measure_s": time.time() - start}
            (run / "measure.json").write_text(json.dumps(figures, indent=1))
            print(f"seed {seed} {arm}: {figures}", flush=True)
            write_report(out, args.arms.split(","), size, split)
        finally:
            (run / CLAIM).unlink(missing_ok=True)
    control = out / "control.json"
    if not control.is_file():
        _, prompts, base = prepared(path, held_path, args, size, out)
        control.write_text(json.dumps({"fresh_adapter_greedy_same": greedy_control(path, prompts, base, size)}))
    write_report(out, args.arms.split(","), size, split)


def greedy_control(path: str, prompts: list[Any], base: dict, size: dict) -> float:
    """The greedy check's control: a fresh LoRA adapter (B = 0, the model unchanged) must give the base's answers."""
    from peft import LoraConfig, get_peft_model

    from molrl.models import load_model

    model = get_peft_model(load_model(path, dtype="float32"),
                           LoraConfig(r=16, lora_alpha=32, target_modules="all-linear")).eval()
    own = greedy(model, _CACHE["tok"], prompts, size["answer_tokens"])
    return sum(a == b for a, b in zip(own, base["answers"])) / len(own)


_CACHE: dict[str, Any] = {}


def prepared(path: str, held_path: Path, args: argparse.Namespace, size: dict, out: Path) -> tuple[list, list, dict]:
    """The held-out examples, the general prompts and the base's greedy answers to them (made once, kept in
    OUT/base.json)."""
    from molrl.models import load_model, load_tokenizer
    from molrl.mol.data import load_examples
    from molrl.traces.spans import render_prompts

    if "tok" not in _CACHE:
        tok = load_tokenizer(path)
        examples, _ = load_examples([str(held_path)], tok, max_length=MAX_LENGTH, enable_thinking=False)
        held = [ex for ex in examples if any(ex["feedback_mask"])]
        random.Random(0).shuffle(held)
        firsts = (json.loads(x)["messages"][0]["content"] for f in (held_path, held_path.parent / "train.jsonl")
                  for x in f.read_text().splitlines())
        tasks = general_tasks(Path(args.data), normalised("\n".join(firsts)), size["general_per_source"])
        prompts = render_prompts(tok, tasks, enable_thinking=False)
        _CACHE.update(tok=tok, held=held[: size["held_out"]], prompts=prompts, tasks=tasks)
    base_file = out / "base.json"
    if not base_file.is_file():
        model = load_model(path, dtype="float32").eval()
        answers = greedy(model, _CACHE["tok"], _CACHE["prompts"], size["answer_tokens"])
        base_file.write_text(json.dumps({"answers": answers, "tasks": [t.id for t in _CACHE["tasks"]],
                                         "held_out_traces": len(_CACHE["held"])}))
    return _CACHE["held"], _CACHE["prompts"], json.loads(base_file.read_text())


def measure_run(path: str, adapter: Path, held_path: Path, args: argparse.Namespace, size: dict, out: Path) -> dict:
    """Load the base with ``adapter`` (plain peft) and measure it against the base."""
    import torch
    from peft import PeftModel

    from molrl.models import load_model

    held, prompts, base = prepared(path, held_path, args, size, out)
    model = PeftModel.from_pretrained(load_model(path, dtype="float32"), adapter).eval()
    torch.manual_seed(0)
    return measure(model, _CACHE["tok"], held, prompts, base["answers"], size["answer_tokens"])


# ---- report --------------------------------------------------------------------------------------------------------

METRICS = [("feedback_nll", "held-out feedback NLL"), ("decision_kl", "held-out decision KL"),
           ("general_nll_increase", "general NLL increase"), ("general_kl", "general KL"),
           ("greedy_same", "general greedy = base"), ("greedy_prefix", "general greedy shared prefix")]


def collect(out: Path, arms: list[str]) -> dict[str, dict[int, dict]]:
    found: dict[str, dict[int, dict]] = {arm: {} for arm in arms}
    for f in sorted(out.glob("seed*/*/measure.json")):
        arm, seed = f.parent.name, int(f.parent.parent.name[4:])
        if arm in found:
            found[arm][seed] = json.loads(f.read_text())
    return found


def paired(found: dict, a: str, b: str, key: str, sign: float = 1.0) -> list[float]:
    """sign * (a - b) per seed both arms have."""
    seeds = sorted(set(found.get(a, {})) & set(found.get(b, {})))
    return [sign * (found[a][s][key] - found[b][s][key]) for s in seeds]


def write_report(out: Path, arms: list[str], size: dict, split: dict) -> None:
    found = collect(out, arms)
    base_fb = [m["base_feedback_nll"] for runs in found.values() for m in runs.values()]
    lines = [f"# MoL's mechanism on SmolLM2-135M-Instruct, MINT traces ({datetime.date.today()})", "",
             f"Split by task: {split}. Each arm: {size['steps']} steps x {size['grad_accumulation']} traces, "
             f"LoRA r16, lr 5e-4, max_length {MAX_LENGTH}. Held-out: {size['held_out']} traces; general: "
             f"{3 * size['general_per_source']} prompts, base answers of {size['answer_tokens']} tokens.",
             f"Base: held-out feedback NLL {base_fb[0]:.4f}." if base_fb else "", "",
             "Mean ± s.e. over seeds (per-seed values):", "",
             "| arm | seeds | " + " | ".join(label for _, label in METRICS) + " | train s | measure s |",
             "|---|---|" + "---|" * (len(METRICS) + 2)]
    for arm, runs in found.items():
        if not runs:
            continue
        cells = []
        for key, _ in METRICS:
            vals = [runs[s][key] for s in sorted(runs)]
            m, se = mean_se(vals)
            cells.append(f"{m:.4f} ± {se:.4f} ({', '.join(f'{v:.4f}' for v in vals)})")
        times = [statistics.fmean(r[k] for r in runs.values()) for k in ("train_s", "measure_s")]
        lines.append(f"| {arm} | {len(runs)} | " + " | ".join(cells) + f" | {times[0]:.0f} | {times[1]:.0f} |")
    absorb = {arm: {s: r["base_feedback_nll"] - r["feedback_nll"] for s, r in runs.items()}
              for arm, runs in found.items()}
    both = sorted(set(found.get("mol", {})) & set(found.get("ce", {})))
    claims = [
        ("MoL absorbs about as much as CE (absorption = base - trained held-out feedback NLL; MoL >= 80% of CE)",
         about_as_much([absorb["mol"][s] for s in both], [absorb["ce"][s] for s in both]) if both else "no runs"),
        ("CE drifts further from the base on decisions (CE - MoL decision KL > 0)",
         verdict(paired(found, "ce", "mol", "decision_kl"))),
        ("MoL stays nearer the base on general prompts than CE (CE - MoL general KL > 0)",
         verdict(paired(found, "ce", "mol", "general_kl"))),
        ("... and than CE on feedback only (CE_fb - MoL general KL > 0)",
         verdict(paired(found, "ce_fb", "mol", "general_kl"))),
        ("MoL raises the general NLL of the base's own greedy answers less than CE (CE - MoL NLL increase > 0; a "
         "sharper model lowers it without staying near the base: see the entropy line)",
         verdict(paired(found, "ce", "mol", "general_nll_increase"))),
        ("The KL keeps decisions near the base (CE_fb - MoL decision KL > 0)",
         verdict(paired(found, "ce_fb", "mol", "decision_kl"))),
        ("More KL, less drift (MoL x0.1 - MoL x10 decision KL > 0)",
         verdict(paired(found, "mol_kl0.1", "mol_kl10", "decision_kl"))),
        ("More KL, less absorption (MoL x10 - MoL x0.1 held-out feedback NLL > 0)",
         verdict(paired(found, "mol_kl10", "mol_kl0.1", "feedback_nll"))),
    ]
    lines += ["", "Verdicts (paired by seed; holds: mean over 2 s.e. and the same sign on every seed):", ""]
    lines += [f"- {claim}: **{v}**" for claim, v in claims]
    total = sum(r["train_s"] + r["measure_s"] for runs in found.values() for r in runs.values())
    control = out / "control.json"
    if control.is_file():
        lines += ["", "Control for the greedy check: a fresh adapter (B = 0) gives the base's answer on "
                  f"{json.loads(control.read_text())['fresh_adapter_greedy_same']:.2f} of the general prompts."]
    for f in sorted(out.glob("entropy_seed*.json")):  # benchmarks/real_model_entropy.py
        ent = json.loads(f.read_text())
        lines += ["", f"Entropy at the general answers' positions ({f.stem[8:]}; base "
                  f"{next(iter(ent.values()))['base_entropy']:.3f} nats): "
                  + ", ".join(f"{arm} {e['trained_entropy']:.3f}" for arm, e in ent.items()) + "."]
    lines += ["", f"Machine time of the finished runs: {total / 60:.1f} min (1 torch thread each)."]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    (out / "study.json").write_text(json.dumps({"size": size, "split": split, "runs": found,
                                                 "verdicts": dict(claims)}, indent=1))
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
