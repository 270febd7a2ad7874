"""The GPU checks of shared/GPU.md in one command: one markdown table on stdout, one JSON file.

    python benchmarks/gpu_check.py                              # on one GPU: the whole list, about 15 minutes on an H200
    python benchmarks/gpu_check.py --device cpu --tiny          # every item at tiny shapes (the slow test tier)
    python benchmarks/gpu_check.py --only mol_0.6b_4k,eval_throughput --json runs/x.json
    python benchmarks/gpu_check.py --reuse runs/x.json --json runs/y.json   # runs only what x.json lacks

Before anything runs it prints the device and the versions of python, torch (and its CUDA),
transformers, peft, trl, accelerate, datasets, math-verify, vllm and deepspeed; a missing required
package stops it there, with its name. Each item then runs in its own process with its own time
limit (an out-of-memory error or a hang costs that item only), inside a total budget (``--budget-s``);
items the budget no longer covers are reported as skipped. Everything runs in bfloat16 except
partial_rollouts, which is benchmarks/partial_rollouts.py as published (float32).

Items, in the order of the GPU list:
  matmul_peak        bf16 matmul TFLOP/s at 8192^3 (the MFU denominator, measured in this run)
  mol_<shape>_<len>  the MoL step (benchmarks/mol_step.py) at Qwen3-0.6B and 1.7B shapes, 4k and 8k
                     tokens, random weights, the real Qwen3 vocabulary, LoRA r64: tokens/s, peak memory,
                     MFU, MoL / CE step time, naive / MoL loss-path memory; mol_1.7b_4k_cached: MoL / CE with
                     the base's targets live, cached hidden states and cached top 64 (loss.base_targets)
  rl_split_0.6b      a GRPO step at 0.6B shape (transformers generation, G = 8, 512 new tokens, toy task
                     scored in the sandbox): generation / reward / optimisation and the reward share
  eval_throughput    evaluation generation (molrl.engines.generation) at 0.6B shape, batch 64: tokens/s
  demo_quick         ``molrl demo --quick`` on the device: wall time and the held-out accuracies
  partial_rollouts   synchronous vs partial rollouts at a fixed policy (benchmarks/partial_rollouts.py)
  rl_<algorithm>     one short run (``molrl.rl.run_rl``) of grpo, dr_grpo, opd, ppo over macro actions,
                     partial rollouts and PROPS at 0.6B shape: seconds per step
``--tiny`` keeps every item and shrinks it: one-layer Qwen3 shapes with a 1,024-token vocabulary,
the tiny test model for the 0.6B-shaped runs, a few tokens and steps.

MFU counts the LoRA step's model FLOPs (``mol_step.mol_step_flops``: the policy's forward and
backward to the activations, the frozen base's forward for the KL, LoRA's own, attention, the
head at loss positions) over the matmul peak measured by matmul_peak.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
REQUIRED = {"torch": "torch", "transformers": "transformers", "peft": "peft", "trl": "trl",
            "accelerate": "accelerate", "datasets": "datasets", "math-verify": "math_verify", "molrl": "molrl"}
"""Distribution name -> import name of what every item needs."""
OPTIONAL = ("vllm", "deepspeed")
RL_CASES = {  # item -> RlConfig settings of its one short run
    "rl_grpo": dict(algorithm="grpo"),
    "rl_dr_grpo": dict(algorithm="dr_grpo"),
    "rl_opd": dict(algorithm="opd", opd={"teacher": "feedback"}),
    "rl_ppo_macro": dict(algorithm="ppo", beta=0.05, macro={"rule": "fixed:5"}),
    "rl_partial": dict(algorithm="grpo", rollout={"partial": True, "over_provision": 2.0}),
    "rl_props": dict(algorithm="grpo", rollout={"behaviour": "props"}),
    "rl_multiturn": dict(algorithm="grpo", rollout={"turns": 2}, terms={"feedback_ce": 0.02, "decision_kl": 0.05}),
}


@dataclass(frozen=True)
class Item:
    """One check: its function, its time limit on a GPU, and with --tiny."""

    name: str
    run: Callable[[argparse.Namespace, dict], dict]
    limit_s: float
    tiny_limit_s: float


# --- the items: each returns its figures (name -> number or short string) --------------------------


def matmul_peak(args: argparse.Namespace, ctx: dict) -> dict:
    """Dense bf16 matmul throughput, the best of 10 timed runs after 3 warm-ups."""
    import torch

    n = 512 if args.tiny else 8192
    a = torch.randn(n, n, device=args.device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=args.device, dtype=torch.bfloat16)
    best = math.inf
    for i in range(13):
        sync(args.device)
        start = time.perf_counter()
        a @ b
        sync(args.device)
        if i >= 3:
            best = min(best, time.perf_counter() - start)
    return {"n": n, "tflops": 2 * n**3 / best / 1e12}


def mol_step(shape: str, seq_len: int, traces: int = 1, cached: bool = False
             ) -> Callable[[argparse.Namespace, dict], dict]:
    def run(args: argparse.Namespace, ctx: dict) -> dict:
        """benchmarks/mol_step.py's three variants (ours, naive full logits, plain CE) on one model and batch
        (``traces`` traces of ``seq_len`` tokens in one micro-batch); ``cached``: ours and CE, and ours on the base's
        cached targets (loss.base_targets hidden and topk), each step ÷ CE's from rounds interleaving them."""
        import mol_step as bench

        vocab = 1024 if args.tiny else qwen3_vocab(args.tokenizer)
        ns = argparse.Namespace(device=args.device, dtype="bfloat16", layers=1 if args.tiny else 28,
                                seq_len=seq_len // 64 if args.tiny else seq_len, tiny_seq_len=0,
                                steps=1 if args.tiny else 5, warmup=0 if args.tiny else 2, traces=traces,
                                variants=("mol", "naive", "ce") if traces == 1 and not cached else ("mol", "ce"),
                                cached=cached, topk=64)
        rows = {r["variant"]: r for r in bench.measure(shape, ns, vocab)}  # naive's full logits: one trace only
        if cached:
            ce = rows["ce"]["interleaved_step_s"]
            return {"seq_len": ns.seq_len, "layers": ns.layers, "vocab": vocab,
                    **{f"{name}_over_ce_step_time": rows[name]["interleaved_step_s"] / ce
                       for name in ("mol", "hidden", "topk")},
                    "hidden_kl_error": rows["hidden"]["kl_error"], "topk_kl_error": rows["topk"]["kl_error"],
                    "hidden_bytes_per_token": rows["hidden"]["cache"]["bytes_per_kl_token"]}
        mol = rows["mol"]
        if "error" in mol:
            raise RuntimeError(f"the MoL step itself: {mol['error']}")
        figures = {"seq_len": ns.seq_len, "traces": traces, "layers": ns.layers, "vocab": vocab,
                   "tokens_per_s": mol["tokens_per_s"], "step_s": mol["step_s"], "step_peak_mb": mol["step_peak_mb"],
                   "loss_path_mb": mol["loss_path_peak_mb"]}
        ce, naive = rows["ce"], rows.get("naive")
        figures["mol_over_ce_step_time"] = ce.get("error") or mol["step_s"] / ce["step_s"]  # HF's CE: full logits
        if naive is not None:
            figures["naive_loss_path_mb"] = naive["loss_path_peak_mb"]
            if mol["loss_path_peak_mb"] >= 1.0:  # below 1 MB the CPU's resident set cannot tell them apart
                figures["naive_over_mol_loss_path"] = naive["loss_path_peak_mb"] / mol["loss_path_peak_mb"]
        if ctx.get("peak_tflops"):
            figures["mfu"] = mol["mol_model_flops"] / mol["step_s"] / (ctx["peak_tflops"] * 1e12)
        return figures

    return run


def prepare_models(args: argparse.Namespace, ctx: dict) -> dict:
    """The 0.6B-shaped model directory the RL and eval items load: random bf16 weights, real tokenizer.

    With --tiny: the tiny test model (std 0.1, so that a LoRA step moves its outputs)."""
    import torch

    path = model_dir(args)
    if path.exists():
        shutil.rmtree(path)
    if args.tiny:
        from molrl.tiny import build_tiny_pair

        model, tok = build_tiny_pair("chatml", initializer_range=0.1)
    else:
        from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

        import mol_step as bench

        tok = AutoTokenizer.from_pretrained(args.tokenizer)
        config = Qwen3Config(vocab_size=qwen3_vocab(args.tokenizer), num_hidden_layers=28, tie_word_embeddings=True,
                             max_position_embeddings=40960, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                             pad_token_id=tok.pad_token_id, **bench.SHAPES["qwen3-0.6b"])
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(config)
    model.to(torch.bfloat16).save_pretrained(path)
    tok.save_pretrained(path)
    return {"parameters_m": sum(p.numel() for p in model.parameters()) / 1e6}


def rl_split(args: argparse.Namespace, ctx: dict, name: str = "rl_split", merged: bool = False) -> dict:
    """Three GRPO steps (the first dropped as warm-up): generation, reward and optimisation seconds per step."""
    settings: dict[str, Any] = dict(algorithm="grpo", rollout={"merged_generation": True}) if merged else \
        dict(algorithm="grpo")
    steps = run_rl_item(args, name, settings, steps=3, tokens=16 if args.tiny else 512)
    measured = steps[1:] or steps
    mean = lambda key: sum(r[key] for r in measured) / len(measured)  # noqa: E731
    step, generation, reward = mean("step_time"), mean("time/generation_s"), mean("time/reward_s")
    return {"step_s": step, "generation_s": generation, "reward_s": reward,
            "optimisation_s": step - generation - reward, "reward_share": reward / step,
            "completion_tokens": mean("completions/mean_length")}


def rl_split_merged(args: argparse.Namespace, ctx: dict) -> dict:
    """``rl_split`` with the adapter merged for generation (``rollout.merged_generation``)."""
    return rl_split(args, ctx, name="rl_split_merged", merged=True)


def rl_case(name: str) -> Callable[[argparse.Namespace, dict], dict]:
    def run(args: argparse.Namespace, ctx: dict) -> dict:
        """One short run; seconds per step over the steps after the first, and the last loss."""
        steps = run_rl_item(args, name, RL_CASES[name], steps=3, tokens=16 if args.tiny else 128)
        measured = steps[1:] or steps
        return {"steps": len(steps), "step_s": sum(r["step_time"] for r in measured) / len(measured),
                "last_loss": steps[-1]["loss"], "reward": sum(r["reward"] for r in steps) / len(steps)}

    return run


def generation_decode(args: argparse.Namespace, ctx: dict) -> dict:
    """transformers generation's decoding step at 0.6B shape: the base alone, with a LoRA r64 adapter (all linear
    layers) unmerged, and with it merged (``molrl.engines.lora_merge``), at widening batches until memory or time runs out.

    A decoding step is (time of N new tokens - time of 1) / (N - 1), EOS suppressed so that every row decodes N."""
    import torch
    from peft import LoraConfig, get_peft_model

    from molrl.engines.lora_merge import merged_lora
    from molrl.models import load_model

    model = load_model(str(model_dir(args)), dtype="bfloat16", device=args.device)
    lora = LoraConfig(r=16 if args.tiny else 64, lora_alpha=32 if args.tiny else 128, target_modules="all-linear",
                      init_lora_weights=False, task_type="CAUSAL_LM")  # random B: the adapter changes the outputs
    model = get_peft_model(model, lora).eval()
    vocab = model.get_output_embeddings().weight.shape[0]
    new_tokens, prompt_len = (8, 16) if args.tiny else (64, 128)
    batches = (2, 8) if args.tiny else (8, 64, 256, 1024)
    figures: dict[str, Any] = {"prompt_tokens": prompt_len, "new_tokens": new_tokens}

    def timed(batch: int, n: int, static: bool = False) -> float:
        ids = torch.randint(0, vocab, (batch, prompt_len), device=args.device,
                            generator=torch.Generator(args.device).manual_seed(batch))
        extra: dict[str, Any] = {}
        if static:  # one cache length for every n, so that the compiled step is compiled once per batch width
            from transformers import StaticCache
            extra["past_key_values"] = StaticCache(config=model.config, max_cache_len=prompt_len + new_tokens)
        sync(args.device)
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=0, **extra)
        sync(args.device)
        return time.perf_counter() - start

    started = time.perf_counter()
    for batch in (8,):  # merged, static cache: generate compiles its decoding step
        try:
            with merged_lora(model):
                timed(batch, 2, static=True)  # compiles
                timed(batch, 2, static=True)
                step_ms = (timed(batch, new_tokens, static=True) - timed(batch, 1, static=True)) / (new_tokens - 1) * 1e3
            figures[f"b{batch}/merged_static_step_ms"] = step_ms
        except Exception as exc:  # noqa: BLE001 - a figure, not a failure of the item
            figures[f"b{batch}/merged_static"] = f"{type(exc).__name__}: {str(exc)[:160]}"
    modes = {"base": model.disable_adapter, "lora": contextlib.nullcontext, "merged": lambda: merged_lora(model)}
    for batch in batches:
        try:
            for mode, context in modes.items():
                with context():
                    timed(batch, 2)  # warm-up at this width
                    step_ms = (timed(batch, new_tokens) - timed(batch, 1)) / (new_tokens - 1) * 1e3
                figures[f"b{batch}/{mode}_step_ms"] = step_ms
                figures[f"b{batch}/{mode}_tokens_per_s"] = batch / step_ms * 1e3
            figures[f"b{batch}/lora_over_merged"] = figures[f"b{batch}/lora_step_ms"] / figures[f"b{batch}/merged_step_ms"]
            figures["widest_batch"] = batch
        except torch.OutOfMemoryError:
            figures[f"b{batch}"] = "out of memory"
            break
        finally:
            if args.device == "cuda":
                torch.cuda.empty_cache()
        if time.perf_counter() - started > 0.6 * ITEMS_BY_NAME["generation_decode"].limit_s:
            break
    return figures


def eval_throughput(args: argparse.Namespace, ctx: dict) -> dict:
    """64 prompts in one batch through the evaluation generator (sampling at eval's defaults)."""
    from molrl.engines.generation import SamplingConfig, TransformersGenerator
    from molrl.models import load_model, load_tokenizer

    path = str(model_dir(args))
    tok = load_tokenizer(path)
    model = load_model(path, dtype="bfloat16", device=args.device)
    new_tokens: list[int] = []
    real_generate = model.generate

    def counting_generate(*a: Any, **kw: Any) -> Any:  # counts what eval's generator really decodes
        out = real_generate(*a, **kw)  # [B, P + T], finished rows padded with pad_token_id
        new_tokens.append(int((out[:, kw["input_ids"].shape[1]:] != kw["pad_token_id"]).sum()))
        return out

    model.generate = counting_generate
    generator = TransformersGenerator(model, tok, batch_size=64)
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"Write a function that returns {i} squared."}],
                                       tokenize=False, add_generation_prompt=True) for i in range(64)]
    sampling = SamplingConfig(n=1, temperature=0.7, top_p=0.8, top_k=20, max_new_tokens=16 if args.tiny else 256)
    generator.generate(prompts[:2], SamplingConfig(n=1, max_new_tokens=4))  # warm-up (CUDA context, kernels)
    new_tokens.clear()
    sync(args.device)
    start = time.perf_counter()
    generator.generate(prompts, sampling)
    sync(args.device)
    seconds = time.perf_counter() - start
    figures = {"batch": 64, "max_new_tokens": sampling.max_new_tokens, "new_tokens": sum(new_tokens),
               "seconds": seconds, "tokens_per_s": sum(new_tokens) / seconds}
    static = TransformersGenerator(model, tok, batch_size=64, static_cache=True)  # eval's static_cache=true
    start = time.perf_counter()
    static.generate(prompts, sampling)  # compiles the decoding step for this shape
    sync(args.device)
    figures["static_first_call_s"] = time.perf_counter() - start
    new_tokens.clear()
    start = time.perf_counter()
    static.generate(prompts, sampling)
    sync(args.device)
    seconds = time.perf_counter() - start
    figures["static_tokens_per_s"] = sum(new_tokens) / seconds
    figures["static_over_dynamic"] = figures["static_tokens_per_s"] / figures["tokens_per_s"]
    return figures


def demo_quick(args: argparse.Namespace, ctx: dict) -> dict:
    """``molrl demo --quick`` from scratch in the work directory; held-out accuracy per model of its report."""
    import re

    from molrl.cli import main as molrl_main

    out = Path(args.workdir) / "demo_quick"
    if out.exists():
        shutil.rmtree(out)  # a re-run would reuse finished stages
    start = time.perf_counter()
    if molrl_main(["demo", "--quick", "--out", str(out)]) != 0:
        raise RuntimeError("molrl demo --quick failed")
    figures: dict[str, Any] = {"wall_s": time.perf_counter() - start}
    report = (out / "pipeline" / "report.md").read_text()
    for line in report.splitlines():
        cells = re.findall(r"(\d\.\d{3}) ± \d\.\d{3}", line)
        if line.startswith("| ") and cells and not line.startswith("| model"):
            figures[f"held_out/{line.split('|')[1].strip()}"] = float(cells[0])
    return figures


def partial_rollouts(args: argparse.Namespace, ctx: dict) -> dict:
    """Both arms for one seed at learning rate 0 (one length distribution): throughput ratios partial / sync."""
    import partial_rollouts as bench

    ns = argparse.Namespace(prompts=2 if args.tiny else 4, group=4 if args.tiny else 8,
                            max_tokens=32 if args.tiny else 256, over_provision=2.0)
    steps = 3 if args.tiny else 20
    root = Path(args.workdir) / "partial_rollouts"
    base = bench.build_model(root / "base", 1.5, 0)
    widths = (ns.prompts * ns.group, math.ceil(ns.over_provision * ns.prompts) * ns.group)
    cost = bench.decode_cost(base, widths, tokens=8 if args.tiny else 64, device=args.device)
    arms = {arm: bench.summary(bench.run_arm(root / arm, base, arm, 0, ns, steps, 0.0), ns.group)
            for arm in ("sync", "partial")}
    sync_arm, part = arms["sync"], arms["partial"]
    return {"steps": steps, "sync_tokens_per_gen_s": sync_arm["tokens_per_gen_s"],
            "partial_tokens_per_gen_s": part["tokens_per_gen_s"],
            "generation_ratio": part["tokens_per_gen_s"] / sync_arm["tokens_per_gen_s"],
            "whole_step_ratio": part["tokens_per_step_s"] / sync_arm["tokens_per_step_s"],
            "decode_step_ratio": cost[widths[1]] / cost[widths[0]]}


ITEMS = [
    Item("matmul_peak", matmul_peak, 60, 60),
    Item("mol_0.6b_4k", mol_step("qwen3-0.6b", 4096), 150, 120),
    Item("mol_0.6b_8k", mol_step("qwen3-0.6b", 8192), 150, 120),
    Item("mol_1.7b_4k", mol_step("qwen3-1.7b", 4096), 180, 120),
    Item("mol_1.7b_8k", mol_step("qwen3-1.7b", 8192), 210, 120),
    Item("mol_1.7b_4k_x4", mol_step("qwen3-1.7b", 4096, traces=4), 240, 120),
    Item("mol_1.7b_4k_cached", mol_step("qwen3-1.7b", 4096, cached=True), 240, 300),
    Item("prepare_0.6b", prepare_models, 90, 60),
    Item("generation_decode", generation_decode, 180, 120),
    Item("rl_split_0.6b", rl_split, 300, 180),
    Item("rl_split_merged_0.6b", rl_split_merged, 240, 180),
    Item("eval_throughput", eval_throughput, 240, 120),
    Item("demo_quick", demo_quick, 300, 600),
    Item("partial_rollouts", partial_rollouts, 180, 240),
    *(Item(name, rl_case(name), 120, 180) for name in RL_CASES),
]
"""Every check, in the order of the GPU list (prepare_0.6b writes the model the later ones load)."""
ITEMS_BY_NAME = {item.name: item for item in ITEMS}


# --- helpers ---------------------------------------------------------------------------------------


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def qwen3_vocab(tokenizer: str) -> int:
    """The Qwen3 output vocabulary (151,936: the tokenizer's entries rounded up, as the real models are)."""
    from transformers import AutoTokenizer

    return max(151_936, len(AutoTokenizer.from_pretrained(tokenizer)))


def model_dir(args: argparse.Namespace) -> Path:
    return Path(args.workdir) / ("model-tiny" if args.tiny else "model-qwen3-0.6b")


def run_rl_item(args: argparse.Namespace, name: str, settings: dict, steps: int, tokens: int) -> list[dict]:
    """``run_rl`` on the prepared model in bf16 with ``settings``; its logged steps (metrics.jsonl)."""
    from molrl.rl import run_rl
    from molrl.config.blocks import ModelSource
    from molrl.rl.config import RlConfig, TaskSource, rl_lora, rl_sampling, rl_train

    out = Path(args.workdir) / name
    if out.exists():
        shutil.rmtree(out)  # a re-run would resume instead of measuring
    nested = {k: v for k, v in settings.items() if isinstance(v, dict)}
    cfg = RlConfig(output_dir=out, model=ModelSource(str(model_dir(args)), dtype="bfloat16"),
                   lora=rl_lora(rank=16 if args.tiny else 64, alpha=32 if args.tiny else 128),
                   data=TaskSource(format="toy", limit=64),
                   sampling=rl_sampling(n=8, max_new_tokens=tokens), max_prompt_length=512,
                   train=rl_train(learning_rate=1e-4, max_steps=steps, micro_batch_size=8, save_steps=10_000),
                   **{k: v for k, v in settings.items() if k not in nested})
    for section, values in nested.items():
        for key, value in values.items():
            setattr(getattr(cfg, section), key, value)
    cfg.__post_init__()  # re-check the combination the nested settings made
    cfg.sandbox.workers = 2 if args.tiny else 4
    run_rl(cfg)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "step_time" in r and "loss" in r]


def versions(device: str) -> dict[str, Any]:
    """Python, packages and device, as recorded in the JSON and printed first."""
    out: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine()}
    for name in [*REQUIRED, *OPTIONAL]:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "src/ (not installed)" if name == "molrl" else None
    import torch

    out["torch_cuda"] = torch.version.cuda
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        out["device"] = f"{props.name}, {props.total_memory / 2**30:.0f} GiB"
    else:
        out["device"] = f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    return out


def missing_packages() -> list[str]:
    """Required distributions that cannot be imported (molrl itself is found in src/ when not installed)."""
    if importlib.util.find_spec("molrl") is None:
        sys.path.insert(0, str(REPO / "src"))
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))
    missing = []
    for dist, module in REQUIRED.items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(dist)
    return missing


def reusable(path: str | None, info: dict[str, Any], tiny: bool) -> dict[str, dict]:
    """The items of an earlier run's JSON that finished ok on the same device and at the same shapes.

    ``prepare_0.6b`` is never reused: it writes the model directory the later items load, which a fresh
    machine does not have. Each kept record carries the date of the run that measured it.
    """
    if path is None:
        return {}
    try:
        report = json.loads(Path(path).read_text())
        same = report["device"] == info["device"] and report["tiny"] == tiny
        items = report["items"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise SystemExit(f"gpu_check: --reuse {path}: not a gpu_check JSON ({err}); give the file an earlier run "
                         "wrote with --json")
    if not same:
        print(f"gpu_check: --reuse {path}: measured on {report['device']}{' (tiny)' if report['tiny'] else ''}, "
              "not this device and shape; nothing reused", file=sys.stderr)
        return {}
    return {name: {**record, "reused": True, "date": record.get("date", report.get("date", "?"))}
            for name, record in items.items() if record.get("status") == "ok" and name != "prepare_0.6b"}


def format_figures(figures: dict) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    return ", ".join(f"{k} {fmt(v)}" for k, v in figures.items())


def run_item_in_child(item: Item, args: argparse.Namespace, ctx: dict, limit: float) -> dict:
    """Run one item in a fresh process under ``limit`` seconds; its record for the JSON."""
    result = Path(args.workdir) / f"{item.name}.result.json"
    result.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--item", item.name, "--device", args.device, "--workdir", args.workdir,
           "--context", json.dumps(ctx), "--result", str(result), "--threads", str(args.threads)]
    if args.tiny:
        cmd.append("--tiny")
    if args.tokenizer:
        cmd += ["--tokenizer", args.tokenizer]
    env = dict(os.environ)
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the stages take a visible GPU by themselves
    start = time.perf_counter()
    log = Path(args.workdir) / f"{item.name}.log"
    with log.open("w") as fh:
        try:
            proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=limit, cwd=REPO)
            status = "ok" if proc.returncode == 0 and result.is_file() else "failed"
        except subprocess.TimeoutExpired:
            status = "timeout"
    record: dict[str, Any] = {"status": status, "seconds": time.perf_counter() - start, "limit_s": limit,
                              "figures": json.loads(result.read_text()) if status == "ok" else {}, "log": str(log)}
    if status != "ok":
        record["error"] = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
    return record


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when a GPU is visible")
    parser.add_argument("--tiny", action="store_true", help="every item at tiny shapes (minutes on a CPU)")
    parser.add_argument("--json", default=None, help="where the JSON goes (default WORKDIR/gpu_check.json)")
    parser.add_argument("--workdir", default="runs/gpu_check", help="models, runs and per-item logs")
    parser.add_argument("--tokenizer", default=None,
                        help="the Qwen3 tokenizer directory (default $MOLRL_SHARED_DATA/qwen3_tokenizer, "
                             "else ../shared/data/qwen3_tokenizer beside the checkout)")
    parser.add_argument("--only", default=None, help="comma-separated item names, run in this order (default: all)")
    parser.add_argument("--budget-s", type=float, default=1200.0, help="total time for all items")
    parser.add_argument("--reuse", default=None,
                        help="an earlier run's JSON: its items that finished ok on the same device are kept, not run "
                             "again (a GPU lent for minutes at a time finishes the list over several calls)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads in each item (0: torch's default)")
    parser.add_argument("--item", help=argparse.SUPPRESS)  # run one item in this process (the parent's child)
    parser.add_argument("--context", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def child(args: argparse.Namespace) -> int:
    """Run ``args.item`` here and write its figures to ``args.result``."""
    import torch

    sys.path.insert(0, str(BENCHMARKS))
    if args.threads:
        torch.set_num_threads(args.threads)
    item = next(i for i in ITEMS if i.name == args.item)
    figures = item.run(args, json.loads(args.context))
    Path(args.result).write_text(json.dumps(figures))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    if args.item:
        return child(args)
    missing = missing_packages()
    if missing:
        print(f"gpu_check: missing packages: {', '.join(missing)}. Install them first (pip install -e .; on a machine "
              "without internet, carry wheels downloaded elsewhere; see benchmarks/RESULTS.md)", file=sys.stderr)
        return 2
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --device cuda but torch sees no GPU", file=sys.stderr)
        return 2
    if not args.tiny and args.tokenizer is None:
        shared = Path(os.environ.get("MOLRL_SHARED_DATA", REPO.parent / "shared" / "data"))
        args.tokenizer = str(shared / "qwen3_tokenizer")
    if args.tokenizer and not (Path(args.tokenizer) / "tokenizer_config.json").is_file():
        print(f"gpu_check: {args.tokenizer}: no tokenizer_config.json; give the Qwen3 tokenizer with --tokenizer",
              file=sys.stderr)
        return 2
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    info = versions(args.device)
    print("gpu_check:", ", ".join(f"{k} {v}" for k, v in info.items()), flush=True)

    names = args.only.split(",") if args.only else [i.name for i in ITEMS]
    unknown = [n for n in names if n not in ITEMS_BY_NAME]
    if unknown:
        print(f"gpu_check: --only {','.join(unknown)}: no such item; the items are {', '.join(ITEMS_BY_NAME)}",
              file=sys.stderr)
        return 2
    chosen = [ITEMS_BY_NAME[n] for n in names]  # in the order --only gives
    earlier = reusable(args.reuse, info, args.tiny)
    ctx: dict[str, Any] = {}
    if "matmul_peak" in earlier:
        ctx["peak_tflops"] = earlier["matmul_peak"]["figures"]["tflops"]
    records: dict[str, dict] = {}
    started = time.perf_counter()
    for item in chosen:
        if item.name in earlier:
            records[item.name] = earlier[item.name]
            print(f"{item.name}: reused from {args.reuse} ({earlier[item.name]['date']})", flush=True)
            continue
        left = args.budget_s - (time.perf_counter() - started)
        limit = min(item.tiny_limit_s if args.tiny else item.limit_s, left)
        if limit < 10:
            records[item.name] = {"status": "skipped", "seconds": 0.0, "figures": {}, "error": "total budget spent"}
            continue
        records[item.name] = run_item_in_child(item, args, ctx, limit)
        if item.name == "matmul_peak" and records[item.name]["status"] == "ok":
            ctx["peak_tflops"] = records[item.name]["figures"]["tflops"]
        r = records[item.name]
        print(f"{item.name}: {r['status']} in {r['seconds']:.0f} s {format_figures(r['figures'])}", flush=True)

    report = {"device": info["device"], "tiny": args.tiny, "versions": info,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "command": " ".join([Path(sys.executable).name, *sys.argv]),
              "total_s": time.perf_counter() - started, "items": records}
    out = Path(args.json) if args.json else workdir / "gpu_check.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"\n{info['device']}; torch {info['torch']} (CUDA {info['torch_cuda']}), transformers {info['transformers']}, "
          f"peft {info['peft']}, trl {info['trl']}, vllm {info['vllm']}; {report['total_s']:.0f} s in all\n")
    print("| item | status | s | figures |\n|---|---|---:|---|")
    for name, r in records.items():
        last_error_line = (r.get("error") or "").strip().splitlines()[-1:] or [""]
        status = f"{r['status']} (reused, {r['date']})" if r.get("reused") else r["status"]
        print(f"| {name} | {status} | {r['seconds']:.0f} | {format_figures(r['figures']) or last_error_line[0]} |")
    print(f"\nJSON: {out}")
    return 0 if all(r["status"] == "ok" for r in records.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
