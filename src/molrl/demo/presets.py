"""The demo's presets: each built-in world's sizes and step counts, by ``molrl demo``'s ``--world`` and preset name.

The presets (default and quick; study and study_quick for ``molrl demo --study``) only change sizes and step counts
(the digit world's study presets add the code-answer family; the chain world's ``study`` preset is its
``default``). ``PRETRAINED_WORLDS`` holds ``molrl demo --model``'s: the worlds a pretrained model runs, each with
its warm-up.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from molrl.demo.base import BaseModelConfig
from molrl.demo.chain import ChainWorldConfig
from molrl.demo.library import LibraryConfig
from molrl.demo.library_base import LibraryDemos
from molrl.demo.pretrained_base import WarmUpConfig
from molrl.demo.world import CODE_TOKENS, WorldConfig


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
