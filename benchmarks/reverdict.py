"""Every stored study and headline verdict read again with the study's rule (``molrl.study.verdict``).

The runs are not kept in the repository, so the per-seed values are quoted from benchmarks/RESULTS.md as printed
there (each row names the line of RESULTS.md at commit 49c0421 it comes from). For each claim the script prints the
verdict of the rule the reports used when they were written (mean paired difference over 2 standard errors and the
same sign on every seed, from 2 seeds up, no smallest effect) and the verdict of the rule now in
``molrl.study.verdict`` (3 seeds at least, the claim's smallest effect from ``molrl.study.claims``, Student's t
point), both computed here, and marks the ones that changed.

One thing the quoted values cannot give: the code task's per-problem scores (its seeds scored the same 100 MBPP and
50 HumanEval tasks, so the rule's standard error there is a bootstrap over seeds and problems). Its rows are read
with the seeds' spread alone, which can only make them easier to decide than the stored runs' reports will.

    python benchmarks/reverdict.py            # a table per study, then the changed verdicts
"""

from __future__ import annotations

from typing import Sequence

from molrl.demo.seeds import mean_se
from molrl.study.claims import CLAIMS, Claim
from molrl.study.verdict import verdict

Row = tuple[int, str, dict[str, object], list[float]]
"""(line of RESULTS.md at 49c0421, the claim's key in CLAIMS, its fields, d per seed)."""


def minus(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Per-seed a - b."""
    return [x - y for x, y in zip(a, b)]


# the chain study's per-seed scores (RESULTS.md "The study on the chain world", lines 1932-1935 and 1948-1951)
DOSE_HELD = {0: [0.13, 0.70, 0.86], 0.1: [0.71, 0.80, 0.85], 1: [0.53, 0.52, 0.42], 10: [0.25, 0.35, 0.18]}
DOSE_GENERAL = {0: [0.13, 0.51, 0.11], 0.1: [0.99, 0.93, 0.83], 1: [1.0, 1.0, 1.0], 10: [1.0, 1.0, 1.0]}
RL_HELD = {0: [0.86, 0.73, 0.95], 0.05: [0.85, 0.69, 0.53], 0.1: [0.85, 0.65, 0.40], 0.3: [0.58, 0.53, 0.39]}

STUDIES: dict[str, list[Row]] = {
    "pretrained headline, chain world, seeds 0-1 (RESULTS.md 142-149)": [
        (142, "headline", {}, [0.010, 0.070]),
        (143, "absorbs", {}, [0.095, 0.015]),
        (144, "grpo_learns", {}, [0.000, -0.005]),
        (145, "grpo_adds", {}, [-0.085, 0.050]),
        (146, "mol_forgets", {}, [-0.040, -0.010]),
        (147, "mol_grpo_forgets", {}, [-0.010, 0.010]),
        (148, "mol_grpo_moves", {}, [0.009, 0.010]),
        (149, "reference_keeps", {"control": "mol+grpo_refmol"}, [-0.040, -0.055]),
    ],
    "pretrained headline, chain world, seeds 0-2 (RESULTS.md 171-178)": [
        (171, "headline", {}, [0.010, 0.070, 0.285]),
        (172, "absorbs", {}, [0.095, 0.015, 0.720]),
        (173, "grpo_learns", {}, [0.000, -0.005, 0.010]),
        (174, "grpo_adds", {}, [-0.085, 0.050, -0.425]),
        (175, "mol_forgets", {}, [-0.040, -0.010, -0.100]),
        (176, "mol_grpo_forgets", {}, [-0.010, 0.010, -0.070]),
        (177, "mol_grpo_moves", {}, [0.009, 0.010, 0.117]),
        (178, "reference_keeps", {"control": "mol+grpo_refmol"}, [-0.040, -0.055, 0.200]),
    ],
    "pretrained headline, code task, seeds 0-2 (RESULTS.md 254-260; seeds' spread only)": [
        (254, "headline", {}, [0.010, -0.010, 0.010]),
        (255, "absorbs", {}, [-0.010, -0.040, 0.000]),
        (256, "grpo_learns", {}, [0.000, -0.010, 0.000]),
        (257, "grpo_adds", {}, [0.020, 0.020, 0.010]),
        (258, "mol_forgets", {}, [0.020, 0.040, 0.040]),
        (259, "mol_grpo_forgets", {}, [0.000, 0.080, 0.000]),
        (260, "mol_grpo_moves", {}, [0.056, 0.047, 0.048]),
    ],
    "study without the general replay, seeds 0-4 (RESULTS.md 334-359)": [
        (334, "forgets_alone", {"mode": "mol", "run": "mol-norep"}, [0.750, 0.550, 0.720, 0.600, 0.550]),
        (335, "forgets_alone", {"mode": "ce", "run": "ce-norep"}, [0.500, 0.330, 0.630, 0.410, 0.310]),
        (336, "forgets_alone", {"mode": "ce_feedback", "run": "ce_feedback-norep"}, [0.760, 0.640, 0.880, 0.860, 0.700]),
        (337, "ce_forgets_alone", {}, [-0.250, -0.220, -0.090, -0.190, -0.240]),
        (338, "ce_feedback_forgets_alone", {}, [0.010, 0.090, 0.160, 0.260, 0.150]),
        (339, "mol_over_ce_feedback_alone", {}, [-0.060, -0.270, -0.630, -0.280, -0.460]),
        (340, "ce_moves_decisions_alone", {}, [0.044, 0.040, 0.052, 0.043, 0.051]),
        (341, "rl_forgets_alone", {"start": "mol-norep", "run": "mol-norep+grpo"}, [0.020, 0.280, 0.240, 0.330, 0.260]),
        (342, "rl_learns_alone", {"start": "mol-norep", "run": "mol-norep+grpo"}, [0.720, -0.130, -0.050, -0.170, -0.010]),
        (343, "dose_keeps", {"weight": 0.1}, [0.100, 0.260, 0.070, 0.110, 0.080]),
        (344, "dose_costs", {"weight": 0.1}, [-0.240, -0.120, 0.020, 0.100, 0.170]),
        (345, "dose_keeps", {"weight": 1}, [0.010, 0.090, 0.160, 0.260, 0.150]),
        (346, "dose_costs", {"weight": 1}, [0.060, 0.270, 0.630, 0.280, 0.460]),
        (347, "dose_keeps", {"weight": 10}, [0.120, 0.360, 0.420, 0.840, 0.690]),
        (348, "dose_costs", {"weight": 10}, [0.030, 0.370, 0.610, 0.570, 0.290]),
        (349, "dose_works", {"weight": 10}, [0.393, 0.460, 0.341, 0.260, 0.452]),
        (350, "rl_drop", {"weight": 0, "start": "mol-norep"}, [0.020, 0.280, 0.240, 0.330, 0.260]),
        (351, "rl_drop", {"weight": 0.05, "start": "mol-norep"}, [0.100, 0.280, 0.160, 0.170, 0.250]),
        (352, "rl_weight_keeps", {"weight": 0.05}, [-0.080, 0.000, 0.080, 0.160, 0.010]),
        (353, "rl_weight_costs", {"weight": 0.05}, [-0.070, -0.460, -0.570, -0.230, -0.200]),
        (354, "rl_drop", {"weight": 0.1, "start": "mol-norep"}, [0.120, 0.230, 0.170, 0.300, 0.280]),
        (355, "rl_weight_keeps", {"weight": 0.1}, [-0.100, 0.050, 0.070, 0.030, -0.020]),
        (356, "rl_weight_costs", {"weight": 0.1}, [-0.020, -0.300, -0.500, -0.400, -0.290]),
        (357, "rl_drop", {"weight": 0.3, "start": "mol-norep"}, [0.060, -0.040, 0.170, 0.250, 0.030]),
        (358, "rl_weight_keeps", {"weight": 0.3}, [-0.040, 0.320, 0.070, 0.080, 0.230]),
        (359, "rl_weight_costs", {"weight": 0.3}, [0.230, -0.620, -0.700, -0.200, -0.490]),
    ],
    "the study on the chain world, seeds 0-2 (RESULTS.md 1881-1961)": [
        (1881, "ce_moves_decisions", {"source": "own"}, [0.038, 0.036, 0.046]),
        (1882, "ce_moves_decisions", {"source": "expert"}, [5.50, 5.59, 5.93]),
        (1883, "ce_forgets", {"source": "own"}, [0.0, 0.0, 0.01]),
        (1884, "ce_forgets", {"source": "expert"}, [0.01, 0.01, 0.06]),
        (1885, "mol_over_ce_feedback", {"source": "own"}, [0.45, -0.11, -0.42]),
        (1886, "mol_over_ce_feedback", {"source": "expert"}, [0.24, 0.06, -0.25]),
        (1900, "mol_before_grpo", {"length": "1 epochs (17 steps)", "label": "1"}, [0.20, 0.03, -0.02]),
        (1901, "mol_before_grpo", {"length": "3 epochs (51 steps)", "label": "3"}, [0.71, 0.31, 0.74]),
        (1902, "mol_before_grpo", {"length": "4.7 epochs (80 steps, the demo's)", "label": "demo"}, [0.73, 0.39, 0.82]),
        (1906, "dr_grpo_loses", {}, [-0.07, 0.01, 0.58]),
        (1921, "reward_learns", {"mode": "staged"}, [0.20, 0.29, 0.02]),
        (1922, "reward_learns", {"mode": "binary"}, [0.20, 0.50, 0.02]),
        (1922, "staged_over_binary", {}, [0.0, -0.21, 0.0]),
        *((1933, "dose_keeps", {"weight": w}, minus(DOSE_GENERAL[w], DOSE_GENERAL[0])) for w in (0.1, 1, 10)),
        *((1933, "dose_costs", {"weight": w}, minus(DOSE_HELD[0], DOSE_HELD[w])) for w in (0.1, 1, 10)),
        (1953, "rl_drop", {"weight": 0, "start": "mol"}, [0.11, 0.02, 0.02]),
        *((1949, "rl_weight_costs", {"weight": w}, minus(RL_HELD[0], RL_HELD[w])) for w in (0.05, 0.1, 0.3)),
    ],
}
"""Per stored study or headline, its claims with their per-seed differences as RESULTS.md printed them."""


def old_verdict(diffs: Sequence[float]) -> str:
    """The rule the stored reports were written with: from 2 seeds, mean over 2 s.e. and every seed one sign."""
    if len(diffs) < 2:
        return "undecided"
    mean, se = mean_se(diffs)
    if mean > 2 * se and all(d > 0 for d in diffs):
        return "holds"
    if -mean > 2 * se and all(d < 0 for d in diffs):
        return "refuted"
    return "undecided"


def reverdict() -> list[tuple[str, int, Claim, list[float], str, str]]:
    """(study, line, claim, d per seed, old verdict, new verdict) for every stored claim."""
    rows = []
    for study, claims in STUDIES.items():
        for line, key, fields, diffs in claims:
            claim = CLAIMS[key].fill(**fields)
            rows.append((study, line, claim, diffs, old_verdict(diffs), verdict(diffs, claim.min_effect)))
    return rows


def main() -> None:
    rows = reverdict()
    changed = []
    for study in STUDIES:
        print(f"\n## {study}\n\n| line | claim | d per seed | mean ± s.e. | smallest effect | old -> new |")
        print("|---|---|---|---|---|---|")
        for name, line, claim, diffs, old, new in rows:
            if name != study:
                continue
            mean, se = mean_se(diffs)
            mark = f"**{old} -> {new}**" if old != new else new
            print(f"| {line} | {claim.text} | " + ", ".join(f"{d:+.3f}" for d in diffs)
                  + f" | {mean:+.3f} ± {se:.3f} | {claim.min_effect:g} | {mark} |")
            if old != new:
                changed.append((study, line, claim.text, old, new))
    print(f"\n{len(changed)} of {len(rows)} verdicts changed:")
    for study, line, text, old, new in changed:
        print(f"- {study}, line {line}: {text}: {old} -> {new}")


if __name__ == "__main__":
    main()
