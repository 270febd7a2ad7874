"""``benchmarks/library_headline.py``: the library world's six models over seeds, its phases, store and report."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import library_headline  # noqa: E402

from molrl.study.claims import CLAIMS, PRIMARY  # noqa: E402
from molrl.study.verdict import CLAIM_LINE  # noqa: E402

MODELS = library_headline.MODELS


def test_every_model_is_evaluated_by_one_phase_that_trains_it_from_the_base_or_its_own_mol_run():
    evaluated = [m for phase in library_headline.PHASES.values() for m in phase.models]
    assert sorted(evaluated) == sorted(MODELS)
    for name, phase in library_headline.PHASES.items():
        own = {r.name for r in (*phase.mol_runs, *phase.rl_runs)}
        assert set(phase.models) - {"base"} == own, name
        for run in phase.rl_runs:
            assert run.overrides == ["algorithm=grpo"] and run.start in {"base", *(r.name for r in phase.mol_runs)}
    modes = {r.name: r.overrides for p in library_headline.PHASES.values() for r in p.mol_runs}
    assert modes == {"mol": ["loss.mode=mol"], "ce": ["loss.mode=ce"]}


def test_both_pre_registered_primaries_are_the_reports():
    assert PRIMARY["library.md"] == (("headline", {}), ("mol_over_ce_grpo", {}))
    assert CLAIMS["headline"].what == "held-out, mol+grpo − base+grpo" and CLAIMS["headline"].min_effect == 0.05


def write_seed(store, seed, right, general_right, kl, probe):
    """A stored seed: ``right[model]`` the held-out tasks it solved (of 12, under ids every seed shares, each seed's
    own contents), ``general_right`` likewise of 8, general KL and the library probe's mean answer share by model."""
    pipeline = store / f"seed-{seed}" / "pipeline"
    for m in MODELS:
        for bench, solved, count in (("heldout", right[m], 12), ("general", general_right[m], 8)):
            rows = [{"id": f"library/{bench}/{'stock+ship' if i < 6 else 'weight+ship'}/{i}",
                     "task_key": f"s{seed}-{bench}-{i}", "sample": 0,
                     "completion": "", "correct": i in solved} for i in range(count)]
            path = pipeline / "eval" / m / bench / "samples.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        results = {"benchmarks": {b: {"pass@1": len(s) / n, "problems": n, "samples": n}
                                  for b, s, n in (("heldout", right[m], 12), ("general", general_right[m], 8))}}
        (pipeline / "eval" / m / "results.json").write_text(json.dumps(results))
    (pipeline / "forgetting.json").write_text(json.dumps({m: {"general_kl": kl[m]} for m in MODELS}))
    shares = {m: {f: {"feedback": 0.5, "answer": probe[m], "answer_in_context": 0.5, "answer_argmax": 0.5}
                  for f in ("price", "stock", "weight", "ship", "mean")} for m in MODELS}
    (pipeline / "library_probe.json").write_text(json.dumps(shares))
    (pipeline / "metrics").mkdir()
    (pipeline / "metrics" / "base+grpo.config.yaml").write_text(
        "sampling: {n: 8, temperature: 0.7, top_p: 1.0}\nprompts_per_step: 4\nbeta: 0.05\n"
        "train: {max_steps: 48, learning_rate: 0.0003}\n")
    (store / f"seed-{seed}" / "world").mkdir(parents=True)
    (store / f"seed-{seed}" / "world" / "world.json").write_text(json.dumps({"key": f"price/10 seed {seed}"}))
    record = {"commit": "abc", "finished": "now", "base": "b", "cpu": "x", "cores": 2, "host": "h",
              "seconds": {"rl/x": 120.0}}
    (store / f"seed-{seed}" / "phases.json").write_text(json.dumps({p: record for p in library_headline.PHASES}))


def test_the_report_reads_both_primaries_with_each_seeds_own_tasks_in_the_standard_error(tmp_path):
    store = tmp_path / "store"
    for seed in range(3):
        right = {m: {0, 1} for m in MODELS} | {"mol+grpo": set(range(8 + seed % 2))}
        write_seed(store, seed, right, {m: set(range(8)) for m in MODELS}, {m: 0.01 for m in MODELS} | {"ce": 0.03},
                   {m: 0.3 for m in MODELS} | {"mol": 0.45})
    assert library_headline.seeds_done(store) == 3
    text = library_headline.report(store, 3).read_text()
    verdicts = {m.group(2): (bool(m.group(1)), m.group(3)) for m in map(CLAIM_LINE.match, text.splitlines()) if m}
    assert verdicts[CLAIMS["headline"].text] == (True, "holds")  # +0.5 to +0.58 on every seed
    assert verdicts[CLAIMS["mol_over_ce_grpo"].text] == (True, "holds")
    assert verdicts[CLAIMS["ce_moves_general"].text] == (False, "holds")  # 0.03 - 0.01
    assert verdicts[CLAIMS["probe_answer"].fill(other="base").text] == (False, "holds")  # 0.45 - 0.3
    assert verdicts[CLAIMS["ce_forgets_accuracy"].text] == (False, "no effect found")
    assert sum(p for p, _ in verdicts.values()) == 2 and len(verdicts) == 10
    assert "The pre-registered primary claims are" in text
    headline = next(line for line in text.splitlines() if line.startswith(f"- **Primary: {CLAIMS['headline'].text}"))
    assert "s.e. over seeds and each seed's problems" in headline  # the ids repeat, the tasks do not
    assert "GRPO: 48 steps of 4 prompts x groups of 8 at temperature 0.7, top-p 1, lr 0.0003, KL 0.05" in text
    assert "Seed 2 (`price/10 seed 2`):" in text and "- seed 2, ce: 2.0 min at abc" in text
    # held-out passes by pair: tasks 0-5 combine stock+ship, 6-11 weight+ship; seed 1's mol+grpo solved 0-8
    pairs = text[text.index("Held-out passes by the functions"):text.index("Library probe")]
    seed_1 = pairs[pairs.index("Seed 1:"):pairs.index("Seed 2:")]
    assert "| model | `stock+ship` | `weight+ship` |" in seed_1
    assert "| `mol+grpo` | 6 of 6 | 3 of 6 |" in seed_1 and "| `base` | 2 of 6 | 0 of 6 |" in seed_1


def test_a_primary_left_undecided_asks_for_more_seeds():
    line = "- **Primary: X**: undecided (held-out: +0.1 ± 0.1, per seed +0.1)."
    assert library_headline.undecided(line + "\n- **Primary: Y**: holds (d).")
    assert not library_headline.undecided("- **Primary: X**: holds (d).\n- **Y**: undecided (d).")


@pytest.mark.parametrize("script", ["library_headline.py", "ablation_paper.py"])
def test_a_report_before_any_seed_is_complete_says_which_phases_are_stored(tmp_path, script):
    seed = tmp_path / "seed-0"
    seed.mkdir()
    (seed / "phases.json").write_text(json.dumps({"base": {"seconds": 1.0}}))
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--report", "--store", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2
    assert f"no seed has every phase stored in {tmp_path} yet (seed 0 holds: base)" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_seeds_phases_run_stored_and_move_to_a_new_machine(tmp_path):
    import shutil
    import subprocess

    from molrl.demo.run import prepare_seed

    prepare_seed(tmp_path / "made", "quick", [], 0, None, "library")  # a small model that writes text
    out, store = tmp_path / "out", tmp_path / "store"
    cmd = [sys.executable, str(REPO / "benchmarks" / "library_headline.py"), "--model", str(tmp_path / "made" / "base"),
           "--quick", "--out", str(out), "--store", str(store), "--seed", "0"]
    first = subprocess.run([*cmd, "--phase", "base"], capture_output=True, text=True, timeout=1800)
    assert first.returncode == 0, first.stderr[-3000:]
    shutil.rmtree(out)  # a new machine: runs/ is gone, the store is in the repository
    second = subprocess.run([*cmd, "--phase", "base", "--phase", "mol"], capture_output=True, text=True, timeout=1800)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "phase base: stored" in second.stderr and "rebuilding the warmed-up base" in second.stderr
    assert not (out / "pipeline" / "rl" / "base+grpo").exists()  # the stored phase was not trained again
    kept = store / "seed-0" / "pipeline"
    assert set(json.loads((store / "seed-0" / "phases.json").read_text())) == {"base", "mol"}
    assert {"base", "base+grpo", "mol", "mol+grpo"} <= set(json.loads((kept / "library_probe.json").read_text()))
    assert {"base+grpo", "mol", "mol+grpo"} <= set(json.loads((kept / "forgetting.json").read_text()))
    assert (kept / "metrics" / "mol+grpo.config.yaml").is_file()
    samples = (kept / "eval" / "mol" / "heldout" / "samples.jsonl").read_text().splitlines()
    assert samples and all(len(json.loads(line)["task_key"]) == 16 for line in samples)
