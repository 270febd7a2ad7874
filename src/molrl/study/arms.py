"""The study's arms (``molrl demo --study``): the runs each claim compares, by name, per world, and their sizes."""

from __future__ import annotations

from dataclasses import dataclass, field

from molrl.demo.world import CODE_TOKENS  # noqa: F401  (the study's code arms use the demo's)

SOURCES = {"own": "", "expert": "-expert"}
"""Trace sources and the suffix of their MoL run names."""
LOSSES = ("mol", "ce", "ce_feedback")
"""The MoL loss ablation."""
CODE = "code"
"""The held-out code-answer benchmark's name (digit world)."""


@dataclass(frozen=True)
class StudyArms:
    """The run names a world's study compares, claim by claim."""

    world: str
    """The demo world the study runs on (``molrl.demo.run.WORLDS``)."""
    epochs: dict[str, str]
    """Claim 2: MoL length (epochs, or ``demo``: the demo's own step count) -> the MoL run; ``{run}+grpo`` follows
    each, ``base`` (0 epochs) included."""
    algorithms: dict[str, str]
    """Claim 3: algorithm -> its RL run, all from ``algorithm_start``."""
    algorithm_start: str
    """The MoL run the algorithms and rewards start from."""
    rewards: dict[str, str] = field(default_factory=dict)
    """Claim 4: ``reward.code_mode`` -> its GRPO run on the code-answer problems (empty: the world has none)."""
    kl_doses: dict[float, str] = field(default_factory=dict)
    """Claim 5: MoL's ``loss.kl_weight`` -> its MoL run (empty: not run)."""
    rl_kl: dict[float, str] = field(default_factory=dict)
    """Claim 6: RL's ``loss.kl_weight`` -> its GRPO run from ``algorithm_start`` (empty: not run)."""
    rl_adapter_mode: str = "continue"
    """Claim 6's ``model.adapter_mode``: continue (the KL's base is the model before MoL) or merge_new (the MoL
    model merged; the KL's base is the MoL model, so the term holds only what GRPO changes)."""
    replay: bool = True
    """Whether the MoL and GRPO runs replay the general tasks (MoL: the general traces; GRPO: general problems
    in its prompts). Without it, forgetting has room to show."""


DIGIT = StudyArms(
    world="digit",
    epochs={"0": "base", "1": "mol_1ep", "3": "mol", "demo": "mol_demo"},
    algorithms={"grpo": "mol_demo+grpo", "dr_grpo": "mol_demo+dr_grpo"},
    algorithm_start="mol_demo",
    rewards={"staged": "mol_demo+grpo_code_staged", "binary": "mol_demo+grpo_code_binary"},
)
"""The digit world's study (``--study --world digit``): claim 1's runs are 3 epochs each, so ``mol`` is claim 2's
3-epoch run; the demo's length is a run of its own."""

CHAIN = StudyArms(
    world="chain",
    epochs={"0": "base", "1": "mol_1ep", "3": "mol_3ep", "demo": "mol"},
    algorithms={"grpo": "mol+grpo", "dr_grpo": "mol+dr_grpo"},
    algorithm_start="mol",
    kl_doses={0.0: "mol_kl0", 0.1: "mol_kl0.1", 1.0: "mol", 10.0: "mol_kl10"},
    rl_kl={0.0: "mol+grpo", 0.05: "mol+grpo_dkl0.05", 0.1: "mol+grpo_dkl0.1", 0.3: "mol+grpo_dkl0.3"},
)
"""The chain world's study (``--study``, the default): every MoL run has the demo's length unless it is one of
claim 2's epoch runs, so ``mol``, ``mol+grpo`` and ``base+grpo`` are the demo's own runs, shared by claims 1, 2,
3, 5 and 6. The RL weights start at the pipeline's own ``rl.beta`` (0.05, TRL's sampled-token KL to the same base)
and end at 0.3, where on seed 0 the term already held GRPO's training reward near its start (0.39 in the first 10
steps, 0.43 in the last 10, against 0.61 and 0.74 without it); at MoL's own weight, 1, held-out accuracy after
GRPO fell to 0.33 (0.86 without), as low as 1 epoch of MoL gives."""

NO_REPLAY = "-norep"
"""The suffix of a run trained without the general replay."""

CHAIN_NO_REPLAY = StudyArms(
    world="chain",
    epochs={"0": "base", "demo": "mol" + NO_REPLAY},
    algorithms={},
    algorithm_start="mol" + NO_REPLAY,
    kl_doses={0.0: "ce_feedback" + NO_REPLAY, 0.1: "mol_kl0.1" + NO_REPLAY, 1.0: "mol" + NO_REPLAY,
              10.0: "mol_kl10" + NO_REPLAY},
    rl_kl={0.0: f"mol{NO_REPLAY}+grpo", 0.05: f"mol{NO_REPLAY}+grpo_dkl0.05", 0.1: f"mol{NO_REPLAY}+grpo_dkl0.1",
           0.3: f"mol{NO_REPLAY}+grpo_dkl0.3"},
    rl_adapter_mode="merge_new",
    replay=False,
)
"""The chain world's arms without the general replay (``--study --no-replay``): MoL, CE and CE on feedback only on
the base's own traces alone, the KL dose, and GRPO from MoL on the rule problems alone with MoL's decision KL at
0 to 0.3 in ``merge_new`` mode, so that forgetting has room and the term holds only what GRPO changes. The demo's
length and settings otherwise; every name ends in ``-norep`` (GRPO's in ``-norep+grpo...``). Without replay, MoL at
KL weight 0 is CE on the feedback tokens alone, the loss of ``ce_feedback-norep`` (the same sums and normaliser),
so the dose's zero point is that run."""

WORLD_ARMS = {"chain": CHAIN, "digit": DIGIT}
"""The arms of each world that has a study."""
