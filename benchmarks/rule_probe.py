"""What a chain-world model knows of the secret rule, read from its next-token distribution, without generating.

For each digit d, the model reads the evaluation's single-turn prompt for "What is f^1(n)?" and the answer's first
step up to its value, "Output:\\n1: f(n) = ", and the probe reads its distribution over the ten digits there: the
probability of the true value f(d) (renormalised over the digits; 0.1 is a uniform guess) and whether it is the
most likely digit. It does so for n = d (a one-digit input, the form every step after a chain's first takes) and for
n = 470 + d (a three-digit input, the form of every chain's first step, ruled by its last digit). A held-out chain
starts from a three-digit number never seen in training, so a model that knows f only on one-digit inputs fails
its first step.

    python benchmarks/rule_probe.py runs/demo_pretrained               # the base and every MoL / RL run of seed 0
    python benchmarks/rule_probe.py runs/demo_pretrained/seed-1 --models base mol

Writes RUN/pipeline/rule_probe.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence

import torch


def probe(model, tokenizer, key: str, start: int) -> tuple[float, int]:
    """Mean probability of the true value over the ten digits' inputs ``start + d``, and how many are the argmax."""
    from molrl.chat import render

    digit_ids = [tokenizer.convert_tokens_to_ids(str(i)) for i in range(10)]
    probs, hits = [], 0
    for d in range(10):
        n = start + d
        text = render(tokenizer, [{"role": "user", "content": f"What is f^1({n})?"}], add_generation_prompt=True)
        ids = tokenizer(text + f"Output:\n1: f({n}) = ", return_tensors="pt", add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            over_digits = torch.softmax(model(ids).logits[0, -1], -1)[digit_ids]
        probs.append(float(over_digits[int(key[d])] / over_digits.sum()))
        hits += int(over_digits.argmax()) == int(key[d])
    return sum(probs) / len(probs), hits


def probe_run(run: Path, models: Sequence[str] | None = None) -> dict[str, dict[str, float]]:
    """Probe each of ``models`` (default every pipeline model) of the demo seed in ``run``; returned by model name
    and written to RUN/pipeline/rule_probe.json beside the models probed there before."""
    from molrl.models import load_model, load_tokenizer
    from molrl.pipeline import model_names, model_weights
    from molrl.pipeline.config import load_pipeline_config
    from molrl.records.writes import write_text

    pipeline = run / "pipeline"
    cfg = load_pipeline_config(pipeline / "config.yaml")
    key = json.loads((run / "world" / "world.json").read_text())["key"]
    tokenizer = load_tokenizer(cfg.model)
    found = {}
    for name in models or model_names(cfg):
        path, adapter = model_weights(cfg, name, pipeline)
        model = load_model(path, adapter=adapter)
        one, one_hits = probe(model, tokenizer, key, 0)
        three, three_hits = probe(model, tokenizer, key, 470)
        found[name] = {"one_digit_p": one, "one_digit_right": one_hits, "three_digit_p": three,
                       "three_digit_right": three_hits}
        del model
    kept = json.loads((pipeline / "rule_probe.json").read_text()) if (pipeline / "rule_probe.json").is_file() else {}
    write_text(pipeline / "rule_probe.json", json.dumps({**kept, **found}, indent=1))
    return found


def table(found: dict[str, dict[str, float]]) -> list[str]:
    """The probe's markdown table, a row per model."""
    return ["| model | P(true value), one-digit input | right of 10 | P(true value), three-digit input | right of 10 |",
            "|---|---:|---:|---:|---:|",
            *(f"| {name} | {f['one_digit_p']:.3f} | {f['one_digit_right']} | {f['three_digit_p']:.3f} | "
              f"{f['three_digit_right']} |" for name, f in found.items())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a demo seed's directory (world/ and pipeline/ inside)")
    parser.add_argument("--models", nargs="*", help="pipeline model names (default: every one)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("\n".join(table(probe_run(args.run, args.models))))


if __name__ == "__main__":
    main()
