"""Every claim the study's reports test, with the smallest effect worth reporting on each.

A claim is tested on paired per-seed differences d (the claim's side minus the other; ``molrl.study.verdict``). Its
``min_effect`` is in the units of d: a mean under it never holds, and where the mean ± t standard errors lies inside
± the minimum the verdict is "no effect found". The minimums are set per measure, before any run is read:

- accuracy (held-out, general, code pass@1; a training reward's share of passing completions): 0.05, five problems
  in a hundred, about one binomial standard error of one seed's score on 100-200 problems;
- KL per token (decision KL, general KL; nats): 0.005, about a sixth of the smallest KL a MoL run left on its own
  decisions on the chain world (0.003-0.03) and a tenth of CE's;
- completion length: 10 tokens, a fifth of a chain answer's length (about 50 tokens);
- NLL per token of a general corpus none of the runs trained on (nats): 0.02, a 2% change of perplexity, set
  before any run as the smallest forgetting a reader would count; one model's NLL on a fixed corpus is
  deterministic, so the seeds' spread is all its noise.

Each report names its pre-registered primary claims (``PRIMARY``, one in most); its other claims print as
secondary.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

ACCURACY = 0.05
"""Smallest difference of pass@1 (or of a reward's share of passing completions) worth reporting."""
KL_NATS = 0.005
"""Smallest difference of a per-token KL (nats) worth reporting."""
TOKENS = 10.0
"""Smallest difference of a mean completion length (tokens) worth reporting."""
NLL_NATS = 0.02
"""Smallest difference of a general corpus's NLL per token (nats) worth reporting."""


@dataclass(frozen=True)
class Claim:
    """One claim a report tests on paired per-seed differences."""

    text: str
    """What the claim says, in the report's words (``{field}`` filled in by ``fill``)."""
    what: str
    """The measure d is in and which side is subtracted, e.g. ``held-out, mol − base``."""
    min_effect: float
    """The smallest mean |d| worth reporting, in d's units: a smaller mean never holds."""

    def fill(self, **fields: object) -> "Claim":
        """The claim with its ``{field}`` placeholders filled in (text and measure)."""
        return replace(self, text=self.text.format(**fields), what=self.what.format(**fields))


CLAIMS: dict[str, Claim] = {
    # study.md (molrl.study.report)
    "ce_forgets": Claim("CE forgets more than MoL ({source} traces)", "general accuracy, mol − ce", ACCURACY),
    "mol_over_ce_feedback": Claim("MoL learns more than CE on feedback only ({source} traces)",
                                  "held-out accuracy, mol − ce_feedback", ACCURACY),
    "ce_moves_decisions": Claim("CE moves the decisions further from the base than MoL ({source} traces)",
                                "decision KL, ce − mol", KL_NATS),
    "mol_before_grpo": Claim("MoL before GRPO helps ({length} vs none)", "held-out after GRPO, {label} − 0", ACCURACY),
    "dr_grpo_shorter": Claim("Dr.GRPO writes shorter completions", "tokens, grpo − dr_grpo", TOKENS),
    "dr_grpo_loses": Claim("Dr.GRPO loses held-out accuracy against GRPO", "held-out, grpo − dr_grpo", ACCURACY),
    "reward_learns": Claim("GRPO with the {mode} reward learns the code-answer problems",
                           "code after − before, {mode}", ACCURACY),
    "staged_over_binary": Claim("The staged reward learns more than the binary one", "code after GRPO, staged − binary",
                                ACCURACY),
    # the KL claims (molrl.study.kl), in study.md and study_no_replay.md
    "dose_keeps": Claim("MoL's KL at weight {weight:g} keeps more general accuracy than no KL",
                        "general, {weight:g} − 0", ACCURACY),
    "dose_costs": Claim("MoL's KL at weight {weight:g} costs held-out accuracy", "held-out, 0 − {weight:g}", ACCURACY),
    "dose_works": Claim("The weight works: at {weight:g} the decisions stay closer to the base than at 0",
                        "decision KL, 0 − {weight:g}", KL_NATS),
    "rl_drop": Claim("GRPO at weight {weight:g} drops general accuracy from MoL's", "general, {start} − run", ACCURACY),
    "rl_weight_keeps": Claim("Weight {weight:g} keeps more general accuracy than GRPO without the term",
                             "general, {weight:g} − 0", ACCURACY),
    "rl_weight_costs": Claim("Weight {weight:g} costs held-out accuracy", "held-out, 0 − {weight:g}", ACCURACY),
    # study_no_replay.md (molrl.study.no_replay)
    "forgets_alone": Claim("{mode} without replay forgets", "general, base − {run}", ACCURACY),
    "ce_forgets_alone": Claim("CE forgets more than MoL", "general accuracy, mol − ce", ACCURACY),
    "ce_feedback_forgets_alone": Claim("CE on feedback only forgets more than MoL",
                                       "general accuracy, mol − ce_feedback", ACCURACY),
    "mol_over_ce_feedback_alone": Claim("MoL learns more than CE on feedback only",
                                        "held-out accuracy, mol − ce_feedback", ACCURACY),
    "ce_moves_decisions_alone": Claim("CE moves the decisions further from the base than MoL", "decision KL, ce − mol",
                                      KL_NATS),
    "rl_forgets_alone": Claim("RL from MoL forgets", "general, {start} − {run}", ACCURACY),
    "rl_learns_alone": Claim("RL from MoL learns the rule problems", "held-out, {run} − {start}", ACCURACY),
    # headline.md (molrl.study.headline, benchmarks/headline_code.py)
    "headline": Claim("MoL + GRPO reaches more than GRPO alone (the headline)", "held-out, mol+grpo − base+grpo",
                      ACCURACY),
    "absorbs": Claim("MoL absorbs the feedback", "held-out, mol − base", ACCURACY),
    "grpo_learns": Claim("GRPO alone learns the held-out problems", "held-out, base+grpo − base", ACCURACY),
    "grpo_adds": Claim("GRPO from MoL adds to MoL", "held-out, mol+grpo − mol", ACCURACY),
    "mol_forgets": Claim("MoL forgets general accuracy", "general, base − mol", ACCURACY),
    "mol_grpo_forgets": Claim("MoL + GRPO forgets more than GRPO alone", "general, base+grpo − mol+grpo", ACCURACY),
    "mol_grpo_moves": Claim("MoL + GRPO moves further from the base than GRPO alone",
                            "general KL, mol+grpo − base+grpo", KL_NATS),
    "reference_keeps": Claim("GRPO from MoL keeps more of MoL with its KL to the MoL model",
                             "held-out, {control} − mol+grpo", ACCURACY),
    # ablation.md (benchmarks/ablation_paper.py): MoL against CE before the same GRPO, pre-registered before its runs
    "mol_over_ce_grpo": Claim("MoL + GRPO reaches more than CE + GRPO (MoL against CE on every trace token)",
                              "held-out, mol+grpo − ce+grpo", ACCURACY),
    "ce_forgets_accuracy": Claim("CE forgets more general accuracy than MoL", "general, mol − ce", ACCURACY),
    "ce_moves_general": Claim("CE moves further from the base on general answers than MoL", "general KL, ce − mol",
                              KL_NATS),
    "ce_forgets_corpus": Claim("CE raises a general corpus's NLL more than MoL", "corpus NLL, ce − mol", NLL_NATS),
    "mol_over_ce_feedback_grpo": Claim("MoL + GRPO reaches more than CE on feedback only + GRPO (MoL's KL)",
                                       "held-out, mol+grpo − ce_feedback+grpo", ACCURACY),
    "mol_over_long_grpo": Claim("MoL + GRPO reaches more than GRPO alone at MoL + GRPO's optimiser steps",
                                "held-out, mol+grpo − base+grpo_long", ACCURACY),
    "continue_over_fresh": Claim("GRPO continuing MoL's adapter reaches more than GRPO with a fresh LoRA on the "
                                 "merged MoL model", "held-out, mol+grpo − mol+grpo_fresh", ACCURACY),
    "probe_answer": Claim("MoL's answers without execution put more on the library's behaviour than {other}'s",
                          "library probe answer share, mol − {other}", ACCURACY),
    "probe_feedback": Claim("MoL predicts what the library prints better than {other}",
                            "library probe feedback share, mol − {other}", ACCURACY),
    "reward_rises": Claim("{run}: the reward rises by tests passed", "reward, last quarter − first quarter", ACCURACY),
}
"""Every claim of the study's reports by key, each with its smallest effect worth reporting."""

PRIMARY: dict[str, tuple[tuple[str, dict[str, str]], ...]] = {
    "study.md": (("mol_before_grpo", {"label": "demo"}),),
    "study_no_replay.md": (("ce_forgets_alone", {}),),
    "headline.md": (("headline", {}),),
    "ablation.md": (("mol_over_ce_grpo", {}),),
    "library.md": (("headline", {}), ("mol_over_ce_grpo", {})),
}
"""Each report's pre-registered primary claims: (its key in ``CLAIMS``, the fields that pick its one line; for
study.md the demo's MoL length before GRPO, that is the headline's MoL + GRPO against GRPO alone). Most reports have
one; the library world's registered two before its runs (benchmarks/RESULTS.md): MoL + GRPO against GRPO alone and
against CE + GRPO."""


def is_primary(report: str, key: str, **fields: object) -> bool:
    """Whether the claim ``key`` with ``fields`` is ``report``'s pre-registered primary claim.

    >>> is_primary("headline.md", "headline"), is_primary("study.md", "mol_before_grpo", label="1", length="1")
    (True, False)
    """
    return any(key == primary and all(str(fields.get(k)) == v for k, v in picks.items())
               for primary, picks in PRIMARY[report])
