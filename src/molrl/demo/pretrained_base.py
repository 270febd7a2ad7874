"""``molrl demo --model PATH``: a pretrained chat model as the chain world's base, taught the world's formats first.

A pretrained instruct model knows neither the chain world's tool (``walk``) nor its answer format, and a small one
does not follow them from an instruction (SmolLM2-135M-Instruct, asked "What is f^3(472)?", writes prose about
cubes). So before the pipeline, the model is warmed up, as the tiny base is trained, on text that shows every
format and never the secret rule: supervised fine-tuning (``molrl mol`` with ``loss.mode=ce``, a LoRA adapter then
merged) on

- tool-use episodes of the scripted demonstrator through the real episode loop and sandbox, on rule problems
  in decoy worlds (each its own random ``f``; ``molrl.demo.chain.decoy_at``) and on general problems;
- direct single-turn answers, posed as evaluation poses them, on rule problems in decoy worlds and on general
  problems (``s``, ``m``: public rules).

The warm-up's problems come from a chain world of its own (``WarmUpConfig.world_seed``, apart from the demo's seeds
0, 1, 2, ...), so one warmed-up model serves every seed, as one pretrained model would: the seeds vary the world
(its secret rule and splits) and the training, not the base. Its rule problems are drawn afresh
(``fresh_problems``) and each is posed in a decoy world with its own ``f``, so the warm-up teaches the model to call
the tool, copy its output and state a value of ``f`` in the answer format, but not which value: across decoy worlds
every digit is as likely, and no world's secret rule is ever shown. Its general problems (the public rules) are
its own world's; a seed's held-out general problem is among them with a chance of about 2% (192 of the 10,800
general problems of 3-digit starts and 1-6 steps). The merged model in ``base_dir`` is the base of every run of the
pipeline, and the reference of MoL's KL.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from molrl.demo.chain import ChainWorldConfig, build_chain_world
from molrl.demo.world import World
from molrl.traces.schema import append_trace
from molrl.records.writes import write_text

log = logging.getLogger(__name__)


@dataclass
class WarmUpConfig:
    """What a pretrained model is warmed up on, and how long."""

    rule_demos: int = 128
    """Tool-use episodes on rule problems in decoy worlds (as many direct decoy answers)."""
    general_demos: int = 64
    """Tool-use episodes on general problems."""
    general_direct: int = 128
    """Direct answers on general problems."""
    max_steps: int = 30
    """Optimiser steps of the warm-up."""
    learning_rate: float = 1e-3
    """Peak learning rate of the LoRA adapter."""
    micro_batch_size: int = 8
    """Sequences per forward pass."""
    grad_accumulation: int = 2
    """Micro-batches per optimiser step."""
    lora_rank: int = 16
    """LoRA rank of the warm-up adapter (merged afterwards)."""
    seed: int = 0
    """Seed of the decoy worlds, the adapter's initialisation and the data order."""
    world_seed: int = 1000
    """Seed of the warm-up's own chain world (its problems), apart from the demo's world seeds."""


def warm_up_traces(world_cfg: ChainWorldConfig, warm: WarmUpConfig, tokenizer: Any, episode: Any, pool: Any,
                   math_prompt: str | None) -> list[Any]:
    """The warm-up's conversations (see the module docstring): problems of the chain world ``world_cfg`` seeded by
    ``warm.world_seed``, decoy worlds drawn from ``warm.seed``."""
    from molrl.demo.chain_base import chain_base_traces

    own = replace(world_cfg, seed=warm.world_seed)
    world = build_chain_world(own)
    part = replace(world, rule_train=world.rule_train[: warm.rule_demos],
                   general_train=world.general_train[: warm.general_direct])
    return chain_base_traces(part, warm.seed, tokenizer, episode, pool, math_prompt, general_demos=warm.general_demos,
                             teacher_rounds=0, fresh=own)


def build_pretrained_base(world_cfg: Any, warm: WarmUpConfig, model: str, base_dir: Path, episode: Any,
                          math_prompt: str | None = None, threads: int = 2, make_traces: Any = None) -> Path:
    """``model`` warmed up on the formats of worlds shaped as ``world_cfg`` and merged, in ``base_dir`` (reused
    when one of the same model, world shape and settings is there).

    The warm-up's conversations are ``make_traces(tokenizer, pool)`` (default the chain world's ``warm_up_traces``;
    the library world's are ``molrl.demo.library_base.library_base_traces``); ``math_prompt`` is the single-turn
    instruction they are posed with (the library world's code instruction)."""
    from molrl.cpu import use_threads
    from molrl.demo.base import made_before
    from molrl.models import load_tokenizer
    from molrl.mol.config import MolConfig
    from molrl.engines.export import merge_adapter
    from molrl.mol.run import run_mol
    from molrl.pipeline.config import stage_config
    from molrl.sandbox import SandboxConfig, SandboxPool

    marker = base_dir / "DONE"
    made_of = {"model": str(Path(model).resolve()), "world": asdict(replace(world_cfg, seed=warm.world_seed)),
               "warm_up": asdict(warm),
               "episode": episode.key(), "math_prompt": math_prompt}
    if made_before(marker, made_of):
        log.info("%s: warmed-up base already made, reused", base_dir)
        return base_dir
    started = time.time()
    if marker.is_file():  # made by an earlier build with other settings: this build replaces it
        shutil.rmtree(base_dir)
    work = base_dir.with_name(f".{base_dir.name}.warm_up")  # beside the model folder, moved in once it is written
    traces_file = work / "traces.jsonl"
    work.mkdir(parents=True, exist_ok=True)
    with SandboxPool(SandboxConfig(workers=2)) as pool:
        tokenizer = load_tokenizer(model)
        traces = (make_traces(tokenizer, pool) if make_traces is not None
                  else warm_up_traces(world_cfg, warm, tokenizer, episode, pool, math_prompt))
    tmp = traces_file.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    for trace in traces:
        append_trace(tmp, trace)
    tmp.replace(traces_file)
    section = {
        "data": {"traces": [str(traces_file)], "max_length": episode.max_total_tokens},
        "thinking": True,
        "loss": {"mode": "ce"},
        "lora": {"rank": warm.lora_rank, "alpha": 2 * warm.lora_rank, "dropout": 0.0},
        "train": {"learning_rate": warm.learning_rate, "max_steps": warm.max_steps, "warmup_ratio": 0.1,
                  "micro_batch_size": warm.micro_batch_size, "grad_accumulation": warm.grad_accumulation,
                  "save_steps": 1000, "report_to": ["none"], "seed": warm.seed},
    }
    cfg = stage_config(MolConfig, section, {"model": model, "output_dir": str(work / "run")}, [], "warm-up")
    use_threads(None, "warm-up", most=threads)
    log.info("warming %s up on %d conversations of the world's formats (%d steps)", model, len(traces),
             warm.max_steps)
    run_mol(cfg)
    merge_adapter(work / "run" / "adapter", base_dir, base=model)
    os.replace(work, base_dir / "warm_up")
    write_text(marker, json.dumps(made_of))
    write_text(base_dir / "timing.json", json.dumps({"seconds": round(time.time() - started, 1)}))
    return base_dir


def unseen_by(world: World, base_dir: Path) -> World:
    """``world`` with its evaluation sets (held-out rule problems, general problems) leaving out the problems the
    warmed-up base in ``base_dir`` was trained on, known by content from its ``molrl_provenance.json``.

    The warm-up is one for every seed and draws its problems from the same space as the seeds' worlds, so a few of a
    seed's evaluation problems are ones it saw: general problems with their answers, rule problems posed in a decoy
    world (the same text, another answer). Evaluation refuses to score them; the seed scores the others.
    """
    from molrl.records.provenance import read_provenance, untrained

    record = read_provenance(base_dir)
    if record is None:
        return world
    kept = {"rule_heldout": untrained(record, world.rule_heldout),
            "general_eval": untrained(record, world.general_eval)}
    left = {name: len(getattr(world, name)) - len(tasks) for name, tasks in kept.items()}
    if any(left.values()):
        log.info("evaluation leaves out the problems the warmed-up base was trained on (by content): %s",
                 ", ".join(f"{name} {n} of {len(getattr(world, name))}" for name, n in left.items()))
    return replace(world, **kept)
