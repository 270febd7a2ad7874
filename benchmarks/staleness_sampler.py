"""The two samplers of ``benchmarks/staleness.py`` at the weights both runs' first step samples from: does the
in-process sampler (the trainer's batched ``generate``) give the same reward as the reference server's
(``tests/fake_engine_server.ModelAnswer``) on the first step's prompts?

    python benchmarks/staleness_sampler.py --seed-dir runs/staleness_adapters/seed-0 [--n 64]

Reads the seed's MoL model (the base with ``pipeline/mol/mol/adapter``: the weights step 1 of every run samples from),
the first step's prompts and the sampling (temperature, most new tokens) from ``pipeline/rl/server_s0``, and the
world's answers. Each sampler draws ``n`` completions a prompt; a completion is right when its last ``\\boxed{}``
holds the task's answer (the check printed first: how often that grading agrees with the run's own rewards on the
run's step-1 rows). Printed: each sampler's mean reward ± its binomial s.e., and its seconds.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the reference engine server


def boxed_right(text: str, answer: str) -> bool:
    """Whether the last ``\\boxed{}`` of ``text`` holds ``answer`` (the chain world's answers are digits)."""
    boxes = re.findall(r"\\boxed\{([^{}]*)\}", text)
    return bool(boxes) and boxes[-1].strip() == answer


def mean_se(values: list[float]) -> tuple[float, float]:
    m = sum(values) / len(values)
    return m, (m * (1 - m) / len(values)) ** 0.5


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed-dir", type=Path, required=True, help="a seed's folder of benchmarks/staleness.py's --out")
    p.add_argument("--n", type=int, default=64, help="completions a prompt, per sampler")
    args = p.parse_args()
    import torch
    import yaml
    from fake_engine_server import ModelAnswer
    from transformers import GenerationConfig

    from molrl.models import load_model, load_tokenizer

    seed_dir = args.seed_dir
    base, adapter = seed_dir / "base", seed_dir / "pipeline" / "mol" / "mol" / "adapter"
    run = seed_dir / "pipeline" / "rl" / "server_s0"
    sampling = yaml.safe_load((run / "config.yaml").read_text())["sampling"]
    answers = {}
    for name in ("rl_train.jsonl", "rl_rule_train.jsonl"):
        for line in (seed_dir / "world" / name).read_text().splitlines():
            task = json.loads(line)
            answers[task["id"]] = task["answer"]
    rows = [json.loads(x) for x in (run / "completions.jsonl").read_text().splitlines()]
    first = [r for r in rows if r["step"] == 1]
    agree = sum(boxed_right(r["completion"], answers[r["task_id"]]) == (r["rewards"]["correctness"] == 1.0)
                for r in first)
    print(f"grading check: agrees with the run's reward on {agree} of its {len(first)} step-1 rows")
    prompts = list(dict.fromkeys((r["prompt"], r["task_id"]) for r in first))
    tok = load_tokenizer(str(base))
    ends = sorted({tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")} - {None})
    most, temperature, n = int(sampling["max_new_tokens"]), float(sampling["temperature"]), args.n

    model = load_model(str(base), adapter=str(adapter)).eval()
    torch.manual_seed(1234)
    config = GenerationConfig(max_new_tokens=most, do_sample=True, pad_token_id=tok.pad_token_id, eos_token_id=ends,
                              temperature=temperature, top_p=1.0, top_k=0)
    local, start = [], time.perf_counter()
    for prompt, task in prompts:
        ids = tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model.generate(input_ids=ids.repeat(n, 1), attention_mask=torch.ones(n, ids.size(1), dtype=torch.long),
                                 generation_config=config)
        local += [float(boxed_right(tok.decode(o[ids.size(1):], skip_special_tokens=True), answers[task]))
                  for o in out]
    local_s = time.perf_counter() - start

    answer, server, start = ModelAnswer(str(base)), [], time.perf_counter()
    for prompt, task in prompts:
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        for k in range(n):
            new: list[int] = []
            for token, _ in answer(str(adapter.resolve()), ids, {"seed": 10_000 + k, "temperature": temperature}):
                new.append(token)
                if token in ends or len(new) >= most:
                    break
            server.append(float(boxed_right(tok.decode(new, skip_special_tokens=True), answers[task])))
    server_s = time.perf_counter() - start
    (lm, ls), (sm, ss) = mean_se(local), mean_se(server)
    print(f"{len(prompts)} prompts x {n} completions, temperature {temperature}, at most {most} tokens: in-process "
          f"generate {lm:.3f} ± {ls:.3f} ({local_s:.0f} s); reference server sampler {sm:.3f} ± {ss:.3f} "
          f"({server_s:.0f} s)")


if __name__ == "__main__":
    main()
