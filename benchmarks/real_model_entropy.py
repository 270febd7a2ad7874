"""Why the general NLL of the base's greedy answers can fall while the model moves away from the base: the
trained model's entropy at those answers' positions against the base's (a sharper model gives the base's own
greedy tokens more probability). Reads benchmarks/real_model.py's results folder; writes OUT/entropy.json.

    python benchmarks/real_model_entropy.py --out runs/real_model --data ../shared/data --seed 0
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import real_model as rm  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/real_model")
    p.add_argument("--data", required=True)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)
    from peft import PeftModel

    from molrl.models import load_model

    out, path = Path(args.out), str(Path(args.out) / "model")
    _, prompts, base = rm.prepared(path, out / "data/held_out.jsonl", args, rm.FULL, out)  # the study's prompts
    result = {}
    for run in sorted((out / f"seed{args.seed}").glob("*/adapter")):
        model = PeftModel.from_pretrained(load_model(path, dtype="float32"), run).eval()
        sums = {"trained": 0.0, "base": 0.0, "n": 0}
        for prompt, answer in zip(prompts, base["answers"]):
            ids = torch.tensor(list(prompt.ids) + answer)[None]
            start = len(prompt.ids) - 1
            with torch.no_grad():
                for name, ctx in (("trained", contextlib.nullcontext()), ("base", model.disable_adapter())):
                    with ctx:
                        logp = torch.log_softmax(model(ids).logits[0, start:-1].float(), -1)
                    sums[name] += float(-(logp.exp() * logp).sum())
            sums["n"] += len(answer)
        result[run.parent.name] = {"trained_entropy": sums["trained"] / sums["n"],
                                   "base_entropy": sums["base"] / sums["n"], "tokens": sums["n"]}
        print(run.parent.name, result[run.parent.name], flush=True)
    (out / f"entropy_seed{args.seed}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
