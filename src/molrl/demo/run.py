"""``run_demo``: the demo world and base model, then the real pipeline on them, then the report.

Steps, each skipped when its output is already there (so an interrupted demo resumes):

1. the world (``world/``): task files for GRPO and evaluation, the world's description;
2. the base model (``base/``): demonstrations through the real episode loop and sandbox, then
   training from scratch (``molrl.demo.base``);
3. the pipeline (``pipeline/``) from ``configs/pipeline_tiny.yaml``: collection with the base in
   the sandbox, MoL, GRPO from the MoL model and from the base, single-step evaluation, ``report.md``.

The presets (default and quick; study and study_quick for ``molrl demo --study``) only change
sizes and step counts (the digit world's study presets add the code-answer family; the chain
world's ``study`` preset is its ``default``). Every seed is fixed, so the
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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from molrl.demo.base import BaseModelConfig
from molrl.demo.chain import ChainWorldConfig, build_chain_world
from molrl.demo.library import LibraryConfig, build_library_world
from molrl.demo.library_base import LibraryDemos
from molrl.demo.pretrained_base import WarmUpConfig
from molrl.demo.world import CODE_TOKENS, World, WorldConfig, build_world
from molrl.cpu import govern_threads, use_threads
from molrl.errors import MolrlError
from molrl.pipeline import run_pipeline
from molrl.tasks import Task
from molrl.records.writes import append_text, write_text

log = logging.getLogger(__name__)


@dataclass
class DemoPreset:
    """Sizes of one demo preset."""

    world: WorldConfig | ChainWorldConfig | LibraryConfig = field(default_factory=WorldConfig)
    """The world's sizes and seed (its type picks the world: digit, chain or library)."""
    base: BaseModelConfig = field(default_factory=BaseModelConfig)
    """The base model's size and schedule."""
    pipeline_overrides: list[str] = field(default_factory=list)
    """``key=value`` overrides of configs/pipeline_tiny.yaml."""
    threads: int = 2
    """Most torch threads (fewer while other processes keep cores busy)."""
    warm_up: WarmUpConfig | None = None
    """With ``molrl demo --model``: how the pretrained model is warmed up on the world's formats (its base)."""
    library_demos: LibraryDemos | None = None
    """The library world: the decoy tasks its base is taught on (``molrl.demo.library_base``)."""


STUDY_PROMPTS = ['rl.code_prompt="{prompt}"', 'eval.code_prompt="{prompt}"',
                 f"eval.sampling.max_new_tokens={CODE_TOKENS}"]
"""The study's code-answer problems are posed as their question alone, like the others, and have room
for a code answer."""

PRESETS = {
    "default": DemoPreset(),
    "quick": DemoPreset(
        world=WorldConfig(train_problems=200, heldout_problems=50, general_train=200, general_eval=50),
        base=BaseModelConfig(steps=120),
        pipeline_overrides=["mol.train.max_steps=20", "rl.train.max_steps=5", "rl.prompts_per_step=4"],
    ),
    "study": DemoPreset(  # `molrl demo --study`: the demo's sizes, the code-answer family, shorter GRPO runs
        world=WorldConfig(code_problems=200, code_heldout=100),
        pipeline_overrides=["rl.train.max_steps=60", *STUDY_PROMPTS],
    ),
    "study_quick": DemoPreset(  # `molrl demo --study --quick`: a check that every table of the study fills
        world=WorldConfig(train_problems=60, heldout_problems=20, general_train=200, general_eval=20,
                          code_problems=30, code_heldout=20),
        base=BaseModelConfig(steps=80),
        pipeline_overrides=["mol.train.max_steps=12", "rl.train.max_steps=3", "rl.prompts_per_step=2",
                            "rl.sampling.n=4", "rl.train.micro_batch_size=8", *STUDY_PROMPTS],
    ),
}


CHAIN_PRESETS = {
    "default": DemoPreset(world=ChainWorldConfig(max_steps=6), base=BaseModelConfig(num_layers=3, steps=400)),
    "quick": DemoPreset(
        world=ChainWorldConfig(max_steps=6, train_problems=100, heldout_problems=50, general_train=200,
                               general_eval=50),
        base=BaseModelConfig(num_layers=3, steps=120),
        pipeline_overrides=["mol.train.max_steps=20", "rl.train.max_steps=5", "rl.prompts_per_step=4"],
    ),
    "study_quick": DemoPreset(  # `molrl demo --study --quick`: a check that every table and verdict of the study fills
        world=ChainWorldConfig(max_steps=6, train_problems=16, heldout_problems=10, general_train=40, general_eval=10),
        base=BaseModelConfig(num_layers=1, hidden_size=64, steps=100, teacher_rounds=1),
        pipeline_overrides=["mol.train.max_steps=3", "mol.train.micro_batch_size=8", "mol.train.grad_accumulation=1",
                            "rl.train.max_steps=2", "rl.prompts_per_step=2", "rl.sampling.n=4",
                            "rl.train.micro_batch_size=8", "eval.sampling.max_new_tokens=32",
                            "rl.sampling.max_new_tokens=32"],
    ),
}
"""``molrl demo`` (the default world): the chain world with chains of 1-6 steps (``molrl.demo.chain``)."""
CHAIN_PRESETS["study"] = CHAIN_PRESETS["default"]  # `molrl demo --study`: the demo itself, so its runs are the demo's

LONG_BASE = BaseModelConfig(num_layers=3, steps=1200, short_steps=700, batch_size=12, micro_batch_size=6,
                            copy_weight=10.0, teacher_rounds=4, attempt_values="context", repeat_values=True,
                            guess_others=True, fresh_decoys=True)
"""The long world's base: the chain base's model, trained so that it reads long feedback (``molrl.demo.chain_base``):
copies out of feedback weighted and never opposed by a uniform target, decoy problems of their own shape, a cheap
first phase on short sequences, and no rule guessed as mapping a digit to itself; about 5 minutes on 2 cores."""

LONG_PRESETS = {
    "default": DemoPreset(world=ChainWorldConfig(), base=LONG_BASE),
    "teacher": DemoPreset(world=ChainWorldConfig(),
                          base=replace(LONG_BASE, steps=5 * LONG_BASE.steps, short_steps=5 * LONG_BASE.short_steps)),
    "quick": DemoPreset(
        world=ChainWorldConfig(train_problems=100, heldout_problems=30, general_train=200, general_eval=30),
        base=replace(LONG_BASE, num_layers=2, steps=120, short_steps=60),
        pipeline_overrides=["mol.train.max_steps=20", "rl.train.max_steps=5", "rl.prompts_per_step=4",
                            "rl.train.micro_batch_size=16"],
    ),
}
"""``molrl demo --world long``: the chain world with chains of 1-24 steps, long-tailed, for telling RL methods apart.
``--teacher`` (``teacher``) trains the same base five times as long (25 to 32 minutes on 2 cores instead of 5), so
that the base reading the feedback, on-policy distillation's feedback teacher, answers at about 0.9 (0.88-0.96 on
seeds 0-2, against 0.20-0.71 with the 5-minute base)."""

PRETRAINED_PRESETS = {
    "default": DemoPreset(
        world=ChainWorldConfig(max_steps=6, train_problems=200, heldout_problems=200, general_train=400,
                               general_eval=100),
        warm_up=WarmUpConfig(),
    ),
    "quick": DemoPreset(
        world=ChainWorldConfig(max_steps=3, train_problems=16, heldout_problems=12, general_train=24, general_eval=8),
        warm_up=WarmUpConfig(rule_demos=8, general_demos=4, general_direct=8, max_steps=2, micro_batch_size=4),
        pipeline_overrides=["mol.train.max_steps=2", "rl.train.max_steps=1", "rl.prompts_per_step=2",
                            "rl.train.micro_batch_size=8",
                            "rl.sampling.max_new_tokens=48", "eval.sampling.max_new_tokens=48",
                            "collect.sampling.max_new_tokens=48"],
    ),
}
"""``molrl demo --model PATH``: the chain world (chains of 1-6 steps) with a pretrained chat model as its base,
warmed up on the world's formats first (``molrl.demo.pretrained_base``), and sizes for a 135M model on 2 cores:
200 rule problems to collect and train on, 200 held out, 100 general ones held out
(``configs/pipeline_pretrained.yaml``)."""

LIBRARY_QUICK = ["mol.train.max_steps=4", "mol.train.micro_batch_size=8", "mol.train.grad_accumulation=1",
                 "rl.train.max_steps=2", "rl.prompts_per_step=2", "rl.sampling.n=4", "rl.train.micro_batch_size=8"]
"""The library world's quick runs: every stage, a few steps each."""

LIBRARY_PRESETS = {
    "default": DemoPreset(world=LibraryConfig(), base=BaseModelConfig(steps=500), library_demos=LibraryDemos()),
    "quick": DemoPreset(
        world=LibraryConfig(train_twists=2, heldout_twists=3, general_train=24, general_eval=12),
        base=BaseModelConfig(num_layers=2, hidden_size=64, steps=200, batch_size=8),
        library_demos=LibraryDemos(tool=12, direct=12, general=12),
        pipeline_overrides=LIBRARY_QUICK,
    ),
}
"""``molrl demo --world library``: code tasks against a library only the sandbox runs (``molrl.demo.library``), on
the tiny base taught in decoy libraries (``molrl.demo.library_base``)."""

LIBRARY_PRETRAINED_PRESETS = {
    "default": DemoPreset(world=LibraryConfig(), warm_up=WarmUpConfig(rule_demos=128, general_demos=0,
                                                                      general_direct=128, max_steps=48)),
    "quick": DemoPreset(
        world=LibraryConfig(train_twists=2, heldout_twists=3, general_train=24, general_eval=12),
        warm_up=WarmUpConfig(rule_demos=4, general_demos=0, general_direct=4, max_steps=2, micro_batch_size=4),
        pipeline_overrides=[*LIBRARY_QUICK, "rl.sampling.max_new_tokens=64", "eval.sampling.max_new_tokens=64",
                            "collect.sampling.max_new_tokens=64"],
    ),
}
"""``molrl demo --world library --model PATH``: the library world on a pretrained chat model, warmed up in decoy
libraries first (``WarmUpConfig.rule_demos`` tool-use episodes and as many direct answers, ``general_direct``
direct answers to general tasks)."""

WORLDS = {"chain": CHAIN_PRESETS, "long": LONG_PRESETS, "digit": PRESETS, "library": LIBRARY_PRESETS}
"""Presets of each built-in world by its ``--world`` name (the first is the default)."""

WORLD_CONFIGS = {"chain": "pipeline_chain.yaml", "long": "pipeline_long.yaml", "digit": "pipeline_tiny.yaml",
                 "library": "pipeline_library.yaml"}
"""The pipeline config each world runs by default."""
PRETRAINED_CONFIG = "pipeline_pretrained.yaml"
"""The pipeline config of ``molrl demo --model``."""
PRETRAINED_WORLDS = {"chain": (PRETRAINED_PRESETS, PRETRAINED_CONFIG),
                     "library": (LIBRARY_PRETRAINED_PRESETS, "pipeline_library_pretrained.yaml")}
"""The worlds ``molrl demo --model`` runs: their presets and pipeline config."""


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
    ``model``: a pretrained chat model's directory as the chain world's base (``PRETRAINED_PRESETS``)."""
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
    fixed = [
        f"model={base_dir}",
        f"output_dir={out / 'pipeline'}",
        f"general_traces=[{world_dir / 'general_traces.jsonl'}]",
        f"rl.data.path={world_dir / 'rl_train.jsonl'}",
        f"eval.data.heldout={world_dir / 'heldout.jsonl'}",
        f"eval.data.general={world_dir / 'general.jsonl'}",
        f"title=molrl demo ({preset} preset{'' if world_name == 'digit' else f', {world_name} world'}"
        f"{f', {Path(model).name}' if model else ''}, seed {seed})",
        f"mol.train.seed={seed}",
        f"rl.train.seed={seed}",
    ]
    if isinstance(chosen.world, LibraryConfig):  # code tasks everywhere
        fixed = [f for f in fixed if not f.startswith(("eval.data.heldout=", "eval.data.general="))]
        fixed += ["rl.data.spec.kind=code", *(f"eval.data.{name}={{path: {world_dir / (name + '.jsonl')}, "
                                              "spec: {kind: code}}" for name in ("heldout", "general"))]
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
    from molrl.demo.base import demonstration_traces, direct_traces, train_base, write_making_time
    from molrl.sandbox import SandboxConfig, SandboxPool
    from molrl.tiny import build_tiny_tokenizer

    marker = base_dir / "DONE"
    made_of = {"world": asdict(preset.world), "base": asdict(preset.base), "episode": episode.key(),
               "math_prompt": math_prompt, **({"code_prompt": code_prompt} if world.code_train else {})}
    if marker.is_file() and json.loads(marker.read_text()) == made_of:
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
