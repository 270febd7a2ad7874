"""The library probe of a library world's run: what each model knows of the world's library, without running code.

For each model of a ``molrl demo --world library`` run (the base, and each MoL / GRPO adapter found in the run's
pipeline), ``molrl.demo.library_measure.probe_library``: per function, the probability the model gives the true
probe output among the outputs of every behaviour (``feedback``, what MoL's cross-entropy trains), and the true
answer among answers written for every behaviour, on single-function tasks of held-out twists (``answer``, what
single-turn evaluation needs), and the true solution submitted after the true probe output (``answer_in_context``:
whether the model turns feedback it can see into code). A guess is 1/3 (1/2 for ``ship``). Each share is of the
candidates' whole probability; the second table gives the same shares by mean log-likelihood per token.

    python benchmarks/library_probe.py --run runs/demo_library_pretrained [--models base mol ce]

Writes RUN/pipeline/library_probe.json (each model measured once, kept) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Sequence

from molrl.cli import setup_logging
from molrl.records.writes import write_text


def models_of(run: Path) -> dict[str, Path | None]:
    """The run's models: ``base`` (no adapter), each MoL run's and each RL run's adapter."""
    pipeline = run / "pipeline"
    found: dict[str, Path | None] = {"base": None}
    for stage in ("mol", "rl"):
        for adapter in sorted((pipeline / stage).glob("*/adapter")):
            if (adapter.parent / "DONE").is_file():
                found[adapter.parent.name] = adapter
    return found


def probe_run(run: Path, names: Sequence[str] | None = None) -> dict:
    """The library probe of ``run``'s models (``names``, default all), each measured once and kept in
    RUN/pipeline/library_probe.json; returns that file's contents (with ``library``: the world's quirks)."""
    from molrl.demo.library import LibraryConfig, build_library_world
    from molrl.demo.library_measure import probe_library
    from molrl.demo.run import episode_config
    from molrl.models import load_model, load_tokenizer
    from molrl.pipeline.config import load_pipeline_config
    from molrl.sandbox import SandboxConfig, SandboxPool

    base = run / "base" if (run / "base").is_dir() else run.parent / "base"
    world_file = json.loads((run / "world" / "world.json").read_text())
    world = build_library_world(LibraryConfig(**world_file["config"]))
    if world.quirks.key() != world_file["key"]:
        raise SystemExit(f"{run}/world/world.json: its library {world_file['key']!r} is not what its config builds "
                         f"({world.quirks.key()!r}); the world's code changed since the run")
    cfg = load_pipeline_config(run / "pipeline" / "config.yaml")
    episode, code_prompt = episode_config(cfg), cfg.eval.get("code_prompt")
    out = run / "pipeline" / "library_probe.json"
    kept = json.loads(out.read_text()) if out.is_file() else {}
    chosen = {k: v for k, v in models_of(run).items() if names is None or k in names}
    todo = {k: v for k, v in chosen.items() if "per_token" not in kept.get(k, {}).get("mean", {})}
    if todo:  # a record without per-token shares is an older probe's
        tokenizer = load_tokenizer(str(base))
        with SandboxPool(SandboxConfig(workers=2)) as pool:
            for name, adapter in todo.items():
                started = time.time()
                model = load_model(str(base), adapter=adapter)
                kept[name] = {**probe_library(model, tokenizer, world, episode, pool, code_prompt),
                              "seconds": round(time.time() - started, 1)}
                write_text(out, json.dumps(kept, indent=1))
    return {"library": world.quirks.key(), **kept}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="a molrl demo --world library run directory (one seed)")
    p.add_argument("--models", nargs="*", default=None, help="which of the run's models (default all)")
    args = p.parse_args()
    setup_logging()
    kept = probe_run(Path(args.run), args.models)
    key = kept.pop("library")
    print(f"library {key}; P(true) among the behaviours (guess: price, stock, weight 1/3, ship 1/2)")
    print("\n".join(probe_table(kept, lambda row, probe: row[probe])))
    print("The same shares by mean log-likelihood per token:")
    print("\n".join(probe_table(kept, lambda row, probe: row["per_token"][probe])))


def probe_table(kept: dict, pick) -> list[str]:
    """A markdown row per model: each probe's share per function and their mean (``pick(row, probe)``)."""
    fams = ("price", "stock", "weight", "ship", "mean")
    lines = ["| model | feedback: price | stock | weight | ship | mean | answer: price | stock | weight | ship | mean | "
             "in context: price | stock | weight | ship | mean | answer likeliest (mean) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, row in kept.items():
        cells = [f"{pick(row[f], probe):.3f}" for probe in ("feedback", "answer", "answer_in_context") for f in fams]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {row['mean']['answer_argmax']:.3f} |")
    return lines


if __name__ == "__main__":
    main()
