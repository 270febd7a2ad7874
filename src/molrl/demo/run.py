"""``run_demo``: the demo world and base model, then the real pipeline on them, then the report.

Steps, each skipped when its output is already there (so an interrupted demo resumes):

1. the world (``world/``): task files for GRPO and evaluation, the world's description;
2. the base model (``base/``): demonstrations through the real episode loop and sandbox, then
   training from scratch (``molrl.demo.base``);
3. the pipeline (``pipeline/``) from ``configs/pipeline_tiny.yaml``: collection with the base in
   the sandbox, MoL, GRPO from the MoL model and from the base, single-step evaluation, ``report.md``.

The presets (``molrl.demo.presets``) only change sizes and step counts. Every seed is fixed, so the
same machine gives the same table run to run; another machine (other BLAS kernels) gives other
numbers and the same comparison. ``seeds > 1`` repeats the whole demo with world and training seeds
1, 2, ... in ``seed-N/`` beside the first, and adds the headline comparison over seeds (mean,
standard error, per-seed values) to the first report and to ``seeds.md``.

Each training stage uses as many torch threads as there are idle cores (at most ``threads``),
re-measured every few seconds while it trains: beside another CPU-bound process two threads run
about three times slower than one.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from molrl.demo.chain import ChainWorldConfig, build_chain_world
from molrl.demo.library import LibraryConfig, build_library_world
from molrl.demo.pretrained_base import WarmUpConfig
from molrl.demo.presets import PRETRAINED_WORLDS, WORLD_CONFIGS, WORLDS, DemoPreset
from molrl.demo.world import World, WorldConfig, build_world
from molrl.cpu import govern_threads, use_threads
from molrl.errors import MolrlError
from molrl.pipeline import run_pipeline
from molrl.tasks import Task
from molrl.records.writes import append_text, write_text

log = logging.getLogger(__name__)


def config_dir() -> Path:
    """The repository's ``configs/`` directory (the demo reads ``pipeline_tiny.yaml`` from it)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "configs" / "pipeline_tiny.yaml").is_file():
            return parent / "configs"
    raise MolrlError("configs/pipeline_tiny.yaml not found next to the molrl sources; run the demo from a checkout")


def run_demo(out: str | Path, preset: str = "default", overrides: list[str] | None = None, seeds: int = 1,
             config: str | Path | None = None, world: str = "chain", model: str | None = None) -> Path:
    """The demo in ``out`` (seed 0) and ``out/seed-N`` (further seeds); returns the first report's path.

    ``config``: the pipeline config (default the world's, ``configs/pipeline_tiny.yaml`` for the digit
    world; ``pipeline_tiny_rl.yaml`` adds every RL algorithm's run); ``world``: a name in ``WORLDS``;
    ``model``: a pretrained chat model's directory as the chain or library world's base (``PRETRAINED_WORLDS``)."""
    from molrl.demo.seeds import seed_summary

    if seeds < 1:
        raise MolrlError(f"--seeds {seeds}: give 1 or more")
    if world not in WORLDS:
        raise MolrlError(f"--world {world}: unknown; choose one of {', '.join(WORLDS)}")
    if model and world not in PRETRAINED_WORLDS:
        raise MolrlError(f"--model runs the {' or '.join(PRETRAINED_WORLDS)} world, not --world {world}")
    presets = PRETRAINED_WORLDS[world][0] if model else WORLDS[world]
    if model and not (Path(model) / "config.json").is_file():
        raise MolrlError(f"--model {model}: not a transformers model directory (no config.json); a GGUF file "
                         "converts with molrl export --gguf FILE --out DIR")
    if preset not in presets:
        raise MolrlError(f"preset {preset!r}: the {world} world has {', '.join(presets)}"
                         + (" with --model" if model else ""))
    out = Path(out)
    try:
        reports = [run_one(out if seed == 0 else out / f"seed-{seed}", preset, overrides, seed, config, world, model)
                   for seed in range(seeds)]
    finally:
        govern_threads(None)
    if seeds > 1:
        summary = seed_summary([r.parent for r in reports])
        write_text(out / "seeds.md", summary)
        append_text(reports[0], "\n" + summary)
        log.info("headline over %d seeds: %s", seeds, out / "seeds.md")
    return reports[0]


def run_one(out: Path, preset: str, overrides: list[str] | None, seed: int, config: str | Path | None = None,
            world_name: str = "chain", model: str | None = None) -> Path:
    """One whole demo with world and training seed ``seed``; returns its report's path."""
    started = time.time()
    cfg, world, threads = prepare_seed(out, preset, overrides, seed, config, world_name, model)
    properties = None
    if world_name in ("chain", "long") and model is None:  # the chain world's measured properties, before the pipeline changes nothing of the base
        from molrl.demo.chain_measure import measure_world

        properties = measure_world(world, out / "base", out / "world", cfg)
    run_pipeline(cfg, collect_tasks=world.rule_train, most_threads=threads)
    report = Path(cfg.output_dir) / "report.md"
    if properties is not None:
        append_text(report, "\n" + properties)
    log.info("demo finished in %.0f s: %s", time.time() - started, report)
    return report


def prepare_seed(out: Path, preset: str, overrides: list[str] | None, seed: int,
                 config: str | Path | None = None, world_name: str = "chain",
                 model: str | None = None) -> tuple["PipelineConfig", World, int]:  # noqa: F821
    """The world and trained base of seed ``seed`` in ``out``, and the pipeline config to run on them; with
    ``model``, the base is that pretrained model warmed up on the world's formats.

    Returns (pipeline config, world, most torch threads).
    """
    import torch

    from molrl.pipeline.config import load_pipeline_config

    chosen = seeded((PRETRAINED_WORLDS[world_name][0] if model else WORLDS[world_name])[preset], seed)
    torch.manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    # a pretrained model's warmed-up base is one for every seed, in the first seed's directory (out/../base)
    world_dir, base_dir = out / "world", (out if seed == 0 or model is None else out.parent) / "base"
    fixed = seed_overrides(out, world_dir, base_dir, preset, seed, world_name, model,
                           code=isinstance(chosen.world, LibraryConfig))
    default_config = PRETRAINED_WORLDS[world_name][1] if model else WORLD_CONFIGS[world_name]
    cfg = load_pipeline_config(config or config_dir() / default_config,
                               [*fixed, *chosen.pipeline_overrides, *(overrides or [])])
    prompts = {"math_prompt": cfg.eval.get("math_prompt"), "code_prompt": cfg.eval.get("code_prompt")}
    if isinstance(chosen.world, LibraryConfig):
        world = prepare_library(chosen, base_dir, world_dir, cfg, prompts["code_prompt"], model)
    elif isinstance(chosen.world, ChainWorldConfig):
        from molrl.demo.chain_base import build_chain_base, direct_traces as chain_direct

        world = build_chain_world(chosen.world)
        if model is not None:
            from molrl.demo.pretrained_base import build_pretrained_base, unseen_by

            build_pretrained_base(chosen.world, chosen.warm_up or WarmUpConfig(), model, base_dir,
                                  episode_config(cfg), prompts["math_prompt"], threads=chosen.threads)
            world = unseen_by(world, base_dir)
        write_world(world, chosen.world, world_dir, prompts["math_prompt"], replay_traces=chain_direct)
        if model is None:
            use_threads(None, "base model", most=chosen.threads)
            build_chain_base(world, chosen, base_dir, episode_config(cfg), prompts["math_prompt"])
    else:
        world = build_world(chosen.world)
        write_world(world, chosen.world, world_dir, prompts["math_prompt"])
        use_threads(None, "base model", most=chosen.threads)
        build_base(world, chosen, base_dir, episode_config(cfg), **prompts)
    log.info("world and base of seed %d ready after %.0f s", seed, time.time() - started)
    return cfg, world, chosen.threads


def prepare_library(chosen: DemoPreset, base_dir: Path, world_dir: Path, cfg: "PipelineConfig",  # noqa: F821
                    code_prompt: str | None, model: str | None) -> World:
    """The library world of ``chosen`` written to ``world_dir`` and its base in ``base_dir``: the tiny base taught in
    decoy libraries, or with ``model`` that model warmed up on them (one for every seed)."""
    from molrl.demo.library_base import build_library_base, direct_code_traces, library_base_traces

    library = build_library_world(chosen.world)
    if model is not None:
        from molrl.demo.pretrained_base import build_pretrained_base, unseen_by

        warm = chosen.warm_up or WarmUpConfig()
        own = build_library_world(replace(chosen.world, seed=warm.world_seed))

        def traces(tokenizer: Any, pool: Any) -> list:
            return library_base_traces(own, warm.rule_demos, warm.rule_demos, warm.general_direct, warm.seed,
                                       chosen.world, tokenizer, episode_config(cfg), pool, code_prompt)

        build_pretrained_base(chosen.world, warm, model, base_dir, episode_config(cfg), code_prompt,
                              threads=chosen.threads, make_traces=traces)
        world = unseen_by(library.as_world(), base_dir)
    else:
        world = library.as_world()
    write_world(world, chosen.world, world_dir, replay_traces=lambda tasks, **_: direct_code_traces(tasks, code_prompt))
    if model is None:
        use_threads(None, "base model", most=chosen.threads)
        build_library_base(library, chosen, base_dir, episode_config(cfg), code_prompt)
    return world


def seed_overrides(out: Path, world_dir: Path, base_dir: Path, preset: str, seed: int, world_name: str,
                   model: str | None, code: bool) -> list[str]:
    """The pipeline overrides that point seed ``seed``'s run at its world files and base; ``code``: every stage
    poses and grades code tasks (the library world)."""
    title = (f"title=molrl demo ({preset} preset{'' if world_name == 'digit' else f', {world_name} world'}"
             f"{f', {Path(model).name}' if model else ''}, seed {seed})")
    fixed = [f"model={base_dir}", f"output_dir={out / 'pipeline'}",
             f"general_traces=[{world_dir / 'general_traces.jsonl'}]", f"rl.data.path={world_dir / 'rl_train.jsonl'}",
             title, f"mol.train.seed={seed}", f"rl.train.seed={seed}"]
    if not code:
        return fixed + [f"eval.data.{name}={world_dir / (name + '.jsonl')}" for name in ("heldout", "general")]
    return fixed + ["rl.data.spec.kind=code", *(f"eval.data.{name}={{path: {world_dir / (name + '.jsonl')}, "
                                               "spec: {kind: code}}" for name in ("heldout", "general"))]


def seeded(preset: DemoPreset, seed: int) -> DemoPreset:
    """``preset`` with its world, base model and decoy libraries seeded by ``seed``."""
    demos = replace(preset.library_demos, seed=seed) if preset.library_demos else None
    return replace(preset, world=replace(preset.world, seed=seed), base=replace(preset.base, seed=seed),
                   library_demos=demos)


RULE_ONLY = "rl_rule_train.jsonl"
"""The world file of the training rule problems alone: RL prompts without the general replay."""


def write_world(world: World, cfg: WorldConfig | ChainWorldConfig | LibraryConfig, world_dir: Path, math_prompt: str | None = None,
                replay_traces: Any = None) -> Path:
    """Task files (JSONL ``{id, prompt, answer}``) and the general replay traces of ``world``: RL's prompts with the
    general replay (``rl_train.jsonl``) and without it (``RULE_ONLY``), the held-out and general evaluation sets.

    ``math_prompt`` is evaluation's single-turn instruction, which the replay traces pose problems with;
    ``replay_traces(tasks, math_prompt=...)`` makes them (default the digit world's ``direct_traces``).
    """
    from molrl.demo.base import direct_traces
    from molrl.traces.schema import append_trace

    world_dir.mkdir(parents=True, exist_ok=True)
    # RL prompts: the training rule problems plus half as many general problems, so RL keeps
    # rewarding what the base could already do instead of trading it away.
    rl_mix = world.rule_train + world.general_train[: len(world.rule_train) // 2]
    files = {"rl_train.jsonl": rl_mix, RULE_ONLY: world.rule_train, "heldout.jsonl": world.rule_heldout,
             "general.jsonl": world.general_eval}
    if world.code_train:  # the code-answer family, mixed the same way
        files["code_rl_train.jsonl"] = world.code_train + world.code_general[: len(world.code_train) // 2]
    if world.code_heldout:
        files["code_heldout.jsonl"] = world.code_heldout
    for name, tasks in files.items():
        write_text(world_dir / name, "\n".join(json.dumps(task_record(t)) for t in tasks) + "\n")
    replay = world_dir / "general_traces.jsonl"
    tmp = replay.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    for trace in (replay_traces or direct_traces)(world.general_train, math_prompt=math_prompt):
        append_trace(tmp, trace)
    os.replace(tmp, replay)
    write_text(world_dir / "world.json", json.dumps({"config": asdict(cfg), "key": world.key}, indent=1))
    return world_dir


def task_record(task: Task) -> dict[str, Any]:
    """A task file line: ``{id, prompt, answer, preamble, probe}``, or ``{id, prompt, entry_point, tests}`` (and a
    ``preamble`` where it has one: the library world's ``lib``) for a code task. The preamble and probe run only in
    the sandbox (the feedback teacher of ``algorithm=opd`` reads the probe's output); the model is never shown them.
    Code-answer problems have neither.
    """
    if task.kind == "code":
        tests = [{"kind": t.kind, "args": t.args, "expected": t.expected} for t in task.tests]
        record = {"id": task.id, "prompt": task.prompt, "entry_point": task.entry_point, "tests": tests}
        return {**record, "preamble": task.preamble} if task.preamble else record  # the library world's lib
    sandbox_only = {"preamble": task.preamble, "probe": task.probe}
    return {"id": task.id, "prompt": task.prompt, "answer": task.answer, **{k: v for k, v in sandbox_only.items() if v}}


def build_base(world: World, preset: DemoPreset, base_dir: Path, episode: "CollectionFormat",  # noqa: F821
               math_prompt: str | None = None, code_prompt: str | None = None) -> Path:
    """The trained base model in ``base_dir`` (trained now unless one of the same world and settings is there).

    ``episode`` is the collection format the tool-use demonstrations follow; ``math_prompt`` and
    ``code_prompt`` are evaluation's single-turn instructions, which the direct answers are posed with.
    """
    from molrl.demo.base import demonstration_traces, direct_traces, made_before, train_base, write_making_time
    from molrl.sandbox import SandboxConfig, SandboxPool
    from molrl.tiny import build_tiny_tokenizer

    marker = base_dir / "DONE"
    made_of = {"world": asdict(preset.world), "base": asdict(preset.base), "episode": episode.key(),
               "math_prompt": math_prompt, **({"code_prompt": code_prompt} if world.code_train else {})}
    if made_before(marker, made_of):
        log.info("%s: base model already trained, reused", base_dir)
        return base_dir
    started = time.time()
    tokenizer = build_tiny_tokenizer("chatml")
    with SandboxPool(SandboxConfig(workers=2)) as pool:
        demos = demonstration_traces(world.rule_train, tokenizer, episode, pool, hide_value=True)
        if preset.base.general_tool_use:
            demos += demonstration_traces(world.general_train[: len(world.rule_train)], tokenizer, episode, pool)
    rule_format = direct_traces(world.rule_train, kind="domain", hide_value=True, math_prompt=math_prompt)
    general = direct_traces(world.general_train, math_prompt=math_prompt)
    code = [*direct_traces(world.code_train, kind="domain", hide_value=True, code_prompt=code_prompt),
            *direct_traces(world.code_general, code_prompt=code_prompt)]
    train_base([*demos, *rule_format, *general, *code], preset.base, base_dir)
    write_text(marker, json.dumps(made_of))
    write_making_time(base_dir, time.time() - started)
    return base_dir


def episode_config(cfg: "PipelineConfig") -> "CollectionFormat":  # noqa: F821
    """The collect section's episode settings and sampling: the demonstrations use exactly the format collection
    will."""
    from molrl.demo.collection import CollectionFormat
    from molrl.pipeline.config import collect_config

    return CollectionFormat.of(collect_config(cfg, Path(cfg.output_dir), in_memory=True))
