"""``benchmarks/ablation_paper.py``: MoL against CE before the same GRPO, its arms, its store and its report."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import ablation_paper  # noqa: E402
from headline_paper import PAPER  # noqa: E402

from molrl.study.claims import CLAIMS, PRIMARY, is_primary  # noqa: E402
from molrl.study.verdict import CLAIM_LINE  # noqa: E402


def arm_runs():
    """Every MoL and RL run of the arm phases, by name: (kind, run)."""
    found = {}
    for name in ablation_paper.ARM_PHASES:
        phase = ablation_paper.PHASES[name]
        for kind, runs in (("mol", phase.mol_runs), ("rl", phase.rl_runs)):
            for run in runs:
                assert run.name not in found, f"{run.name} trained by two phases"
                found[run.name] = (kind, run)
    return found


def test_every_arm_is_evaluated_by_exactly_one_phase_and_is_a_run_of_that_phase_or_the_base():
    evaluated = [m for name in ablation_paper.ARM_PHASES for m in ablation_paper.PHASES[name].models]
    assert sorted(evaluated) == sorted(ablation_paper.MODELS)  # each once, none missing
    runs = arm_runs()
    for name in ablation_paper.ARM_PHASES:
        phase = ablation_paper.PHASES[name]
        own = {r.name for r in (*phase.mol_runs, *phase.rl_runs)}
        assert set(phase.models) - {"base"} <= own, f"phase {name} evaluates a model it does not train"
        for run in phase.rl_runs:  # a phase needs nothing but the base and the traces: its GRPO starts in it
            assert run.start == "base" or run.start in {r.name for r in phase.mol_runs}
    assert set(runs) == set(ablation_paper.MODELS) - {"base"}


def test_each_arm_is_the_run_the_issue_names():
    runs = arm_runs()
    modes = {name: next(o for o in run.overrides if o.startswith("loss.mode=")) for name, (kind, run) in runs.items()
             if kind == "mol"}
    assert modes == {"mol": "loss.mode=mol", "ce": "loss.mode=ce", "ce_feedback": "loss.mode=ce_feedback"}
    for name, (kind, run) in runs.items():
        if kind == "rl":
            assert "algorithm=grpo" in run.overrides and run.start == name.split("+")[0], name
    # GRPO alone for as many optimiser steps as MoL + GRPO took, read from the headline's settings
    steps = {o.split("=")[0]: int(o.split("=")[1]) for o in PAPER if o.split("=")[0].endswith("max_steps")}
    assert f"train.max_steps={steps['mol.train.max_steps'] + steps['rl.train.max_steps']}" in \
        runs["base+grpo_long"][1].overrides
    assert "model.adapter_mode=merge_new" in runs["mol+grpo_fresh"][1].overrides
    # every other GRPO run is the same GRPO: no override beyond the algorithm
    same = [n for n, (k, r) in runs.items() if k == "rl" and n not in ("base+grpo_long", "mol+grpo_fresh")]
    assert all(runs[n][1].overrides == ["algorithm=grpo"] for n in same)


def test_the_ablations_claims_are_registered_with_one_primary_before_its_runs():
    assert PRIMARY["ablation.md"] == (("mol_over_ce_grpo", {}),)
    assert is_primary("ablation.md", "mol_over_ce_grpo") and not is_primary("ablation.md", "mol_over_long_grpo")
    assert CLAIMS["mol_over_ce_grpo"].what == "held-out, mol+grpo − ce+grpo"
    assert CLAIMS["mol_over_ce_grpo"].min_effect == 0.05


def write_seed(store, seed, held, general, kl, nll, right):
    """A stored seed of every arm: ``held``/``general`` pass@1 by model, ``right[model]`` the held-out problems it
    got right (of 10, the seed's own problems, as each chain-world seed draws its own), KL and NLL by model."""
    pipeline = store / f"seed-{seed}" / "pipeline"
    for m in ablation_paper.MODELS:
        for bench, score in (("heldout", held[m]), ("general", general[m])):
            rows = [{"id": f"f/{400 + 20 * seed + i}/1", "sample": 0, "completion": "\\boxed{1}", "correct": i in right[m]}
                    for i in range(10)] if bench == "heldout" else [
                {"id": f"s/4{i:02d}/1", "sample": 0, "completion": "\\boxed{1}", "correct": True} for i in range(4)]
            path = pipeline / "eval" / m / bench / "samples.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        results = {"benchmarks": {b: {"pass@1": s, "problems": 10, "samples": 10}
                                  for b, s in (("heldout", held[m]), ("general", general[m]))}}
        (pipeline / "eval" / m / "results.json").write_text(json.dumps(results))
    (pipeline / "forgetting.json").write_text(json.dumps({m: {"general_kl": kl[m]} for m in ablation_paper.MODELS}))
    (pipeline / "corpus_nll.json").write_text(json.dumps({m: {"nll": nll[m]} for m in ablation_paper.MODELS}))
    probe = {"one_digit_p": 0.1, "one_digit_right": 1, "three_digit_p": 0.1, "three_digit_right": 1}
    (pipeline / "rule_probe.json").write_text(json.dumps({m: probe for m in ablation_paper.MODELS}))
    (store / f"seed-{seed}" / "world").mkdir(parents=True)
    (store / f"seed-{seed}" / "world" / "world.json").write_text(json.dumps({"key": "1032547698"}))
    record = {"commit": "abc", "finished": "now", "base": "b", "cpu": "x", "cores": 2, "host": "h",
              "seconds": {"mol/x": 60.0}}
    (store / f"seed-{seed}" / "phases.json").write_text(json.dumps({p: record for p in ablation_paper.ARM_PHASES}))


def test_the_report_decides_the_primary_from_stored_seeds_alone_with_mcnemar_per_seed(tmp_path):
    store = tmp_path / "store"
    for seed, gap in enumerate((0.3, 0.4, 0.35)):
        held = {m: 0.2 for m in ablation_paper.MODELS} | {"mol+grpo": 0.2 + gap}
        right = {m: set(range(2)) for m in ablation_paper.MODELS} | {"mol+grpo": set(range(2 + seed + 3))}
        write_seed(store, seed, held, {m: 0.5 for m in ablation_paper.MODELS},
                   {m: 0.01 for m in ablation_paper.MODELS} | {"ce": 0.05},
                   {m: 1.0 for m in ablation_paper.MODELS} | {"ce": 1.1}, right)
    assert ablation_paper.seeds_done(store) == 3
    text = ablation_paper.report(store, 3).read_text()
    verdicts = {m.group(2): (bool(m.group(1)), m.group(3)) for m in map(CLAIM_LINE.match, text.splitlines()) if m}
    assert verdicts[CLAIMS["mol_over_ce_grpo"].text] == (True, "holds")
    assert verdicts[CLAIMS["ce_moves_general"].text] == (False, "holds")  # 0.05 - 0.01 on every seed
    assert verdicts[CLAIMS["ce_forgets_corpus"].text] == (False, "holds")  # 1.1 - 1.0
    assert verdicts[CLAIMS["ce_forgets_accuracy"].text] == (False, "no effect found")
    assert sum(primary for primary, _ in verdicts.values()) == 1 and len(verdicts) == 8
    # seed 0: mol+grpo right on 5, ce+grpo on 2, both on 2: b 3, c 0, p = 2 / 2^3
    assert "| `mol+grpo` vs `ce+grpo` | b 3, c 0, p 0.25 | b 4, c 0, p 0.12 | b 5, c 0, p 0.062 |" in text
    assert "- seed 2, ce_feedback: 1.0 min at abc" in text


def test_the_report_shows_the_replicate_phase_only_once_it_is_stored_read_from_its_files(tmp_path):
    store = tmp_path / "store"
    for seed in range(3):
        write_seed(store, seed, {m: 0.2 for m in ablation_paper.MODELS}, {m: 0.5 for m in ablation_paper.MODELS},
                   {m: 0.01 for m in ablation_paper.MODELS}, {m: 1.0 for m in ablation_paper.MODELS},
                   {m: set(range(2)) for m in ablation_paper.MODELS})
    assert "Replicate" not in ablation_paper.report(store, 3).read_text()
    pipeline = store / "seed-0" / "pipeline"
    replicate = ablation_paper.PHASES["replicate"].models
    measures = {f: json.loads((pipeline / f).read_text()) for f in ablation_paper.MEASURES}
    (pipeline / "metrics").mkdir()
    (pipeline / "metrics" / "mol+grpo.jsonl").write_text("".join(json.dumps({"step": k + 1, "reward": 0.5}) + "\n"
                                                               for k in range(4)))
    for i, m in enumerate(replicate):
        results = {"benchmarks": {b: {"pass@1": s, "problems": 10, "samples": 10}
                                  for b, s in (("heldout", 0.1 * i), ("general", 0.05 * i))}}
        (pipeline / "eval" / m).mkdir()
        (pipeline / "eval" / m / "results.json").write_text(json.dumps(results))
        measures["forgetting.json"][m] = {"general_kl": 0.001 * i}
        measures["corpus_nll.json"][m] = {"nll": 1.0 + 0.01 * i}
        measures["rule_probe.json"][m] = {"one_digit_p": 0.2, "one_digit_right": 2, "three_digit_p": 0.3,
                                          "three_digit_right": 3}
        rewards = (0.0, 0.25, 0.5, 1.0) if m.endswith("_rep") else (0.5, 0.5, 0.5, 0.5)
        (pipeline / "metrics" / f"{m}.jsonl").write_text("".join(json.dumps({"step": k + 1, "reward": r}) + "\n"
                                                                 for k, r in enumerate(rewards)))
    for f, found in measures.items():
        (pipeline / f).write_text(json.dumps(found))
    phases = json.loads((store / "seed-0" / "phases.json").read_text())
    (store / "seed-0" / "phases.json").write_text(json.dumps(phases | {"replicate": phases["mol"]}))
    text = ablation_paper.report(store, 3).read_text()
    assert "Replicate, seed 0" in text
    rows = {line.split(" | ")[1]: line for line in text.splitlines() if line.startswith("| `mol")
            and line.count(" | ") == 8}
    assert set(rows) == {f"`{m}`" for _, m, _ in ablation_paper.REPLICATE_ROWS}
    # mol+grpo_rep is the replicate phase's second model: held-out 0.1, general 0.05; rewards' quarters 0 and 1
    assert rows["`mol+grpo_rep`"] == ("| `mol` | `mol+grpo_rep` | 1000 | 0.100 | 0.050 | 0.0010 | 1.0100 | 0.200 / "
                                      "0.300 | 0.000 → 1.000 (± 0.000) |")
    assert rows["`mol+grpo`"].endswith("| 0.200 | 0.500 | 0.0100 | 1.0000 | 0.100 / 0.100 | 0.500 → 0.500 (± 0.000) |")
    assert rows["`mol`"].endswith("| - |") and rows["`mol_short`"].endswith("| - |")
    (pipeline / "metrics" / "mol_short+grpo.jsonl").unlink()
    assert "| `mol_short+grpo` | 0 (the seed's) | 0.200 | 0.100 |" in ablation_paper.report(store, 3).read_text()
    assert "| not logged |" in ablation_paper.report(store, 3).read_text()


def test_a_phase_names_the_commit_its_process_started_at_not_the_one_the_checkout_moved_to(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "a.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "a.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "a"], check=True)
    first = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert ablation_paper.repo_commit(repo) == first
    (repo / "a.py").write_text("x = 2\n")
    assert ablation_paper.repo_commit(repo) == first + "+dirty"
    # the phase's record reads the commit taken when the process started: no git call later can move it
    started = ablation_paper.commit()
    assert started.split("+")[0] == ablation_paper.repo_commit(REPO).split("+")[0]  # HEAD has not moved since import

    def moved(*args, **kwargs):
        raise AssertionError("the checkout was read again after the process started")
    monkeypatch.setattr(ablation_paper.subprocess, "run", moved)
    assert ablation_paper.commit() == started


def test_a_seed_counts_as_done_only_once_every_arm_phase_is_stored(tmp_path):
    store = tmp_path / "store"
    (store / "seed-0").mkdir(parents=True)
    (store / "seed-0" / "phases.json").write_text(json.dumps({p: {} for p in ablation_paper.ARM_PHASES[:-1]}))
    assert ablation_paper.seeds_done(store) == 0


@pytest.mark.slow
def test_phases_on_two_machines_pair_on_one_base_and_one_set_of_traces(tmp_path):
    from molrl.demo.run import prepare_seed

    prepare_seed(tmp_path / "made", "study_quick", [], 0)  # a small model that writes text, as the real one does
    out, store = tmp_path / "out", tmp_path / "store"
    cmd = [sys.executable, str(REPO / "benchmarks" / "ablation_paper.py"), "--model", str(tmp_path / "made" / "base"),
           "--quick", "--out", str(out), "--store", str(store), "--seed", "0"]
    first = subprocess.run([*cmd, "--phase", "ce"], capture_output=True, text=True, timeout=1800)  # ce before mol
    assert first.returncode == 0, first.stderr[-3000:]
    traces = (store / "seed-0" / "pipeline" / "collect" / "traces.jsonl").read_text()
    base = json.loads((store / "base" / "base.json").read_text())["fingerprint"]
    shutil.rmtree(out)  # a new machine: runs/ is gone, the store is in the repository
    second = subprocess.run([*cmd, "--phase", "ce", "--phase", "mol"], capture_output=True, text=True, timeout=1800)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "phase ce: stored" in second.stderr and "rebuilding the warmed-up base" in second.stderr
    assert "nothing to do" in second.stderr  # collect resumed on the stored traces
    assert (out / "pipeline" / "collect" / "traces.jsonl").read_text() == traces
    phases = json.loads((store / "seed-0" / "phases.json").read_text())
    assert set(phases) == {"mol", "ce"} and phases["ce"]["base"] == phases["mol"]["base"] == base
    # the seed's first phase evaluated and measured the base; the mol phase read it back and did not do it again
    assert phases["ce"]["models"] == ["base", "ce", "ce+grpo"] and "eval/base" in phases["ce"]["seconds"]
    assert "eval/base" not in phases["mol"]["seconds"]
    assert not (out / "pipeline" / "mol" / "ce").exists()  # the stored phase was not trained again
    kept = store / "seed-0" / "pipeline"
    kl = json.loads((kept / "forgetting.json").read_text())
    assert {"ce", "ce+grpo", "mol"} <= set(kl)  # both phases' general KL read the base's answers
    for measure in ("rule_probe.json", "corpus_nll.json"):
        assert {"base", "ce", "mol"} <= set(json.loads((kept / measure).read_text())), measure


def test_the_corpus_nll_scores_the_answer_tokens_alone_and_is_log_v_for_a_uniform_model():
    import math
    from types import SimpleNamespace

    import torch

    from molrl.models import load_tokenizer
    from molrl.study.corpus import answer_nll

    tokenizer = load_tokenizer("tiny:chatml")
    vocab = len(tokenizer)
    seen = []

    def uniform(ids):  # the same logit for every token: -log p = log V at every position
        seen.append(ids.shape[1])
        return SimpleNamespace(logits=torch.zeros(1, ids.shape[1], vocab))
    pairs = [("What is 2 + 2?", "It is 4."), ("Say hi.", "hi"), ("Nothing.", "")]
    total, count = answer_nll(uniform, tokenizer, pairs, max_tokens=3)
    answers = [min(len(tokenizer(a, add_special_tokens=False)["input_ids"]), 3) for _, a in pairs]
    assert count == sum(answers) and len(seen) == 2  # an empty answer is not read; answers cut at 3 tokens
    assert total == pytest.approx(count * math.log(vocab))


def test_a_base_rebuilt_from_another_model_path_is_refused_before_any_merge_naming_the_path_to_use(tmp_path):
    kept = tmp_path / "store" / "base"
    kept.mkdir(parents=True)
    (kept / "base.json").write_text(json.dumps({"fingerprint": "f" * 64, "commit": "c"}))
    made_from = str(tmp_path / "first" / "model")
    (kept / "made_of.json").write_text(json.dumps({"model": made_from, "world": {}}))
    with pytest.raises(SystemExit, match=f"pass --model {made_from} "):
        ablation_paper.restore_base(tmp_path / "out", tmp_path / "store", str(tmp_path / "elsewhere" / "model"))
    assert not (tmp_path / "out" / "base").exists()  # refused before the merge wrote anything


@pytest.mark.parametrize("bench", ["ablation_paper", "library_headline"])
def test_whichever_phase_runs_first_on_a_seed_evaluates_the_base_and_no_later_phase_again(tmp_path, bench):
    module = __import__(bench)
    phases = module.PHASES
    for first in phases:  # every phase as a seed's first
        store = tmp_path / bench / first
        (store / "seed-0").mkdir(parents=True)

        def run(name):
            return ablation_paper.with_base(phases[name], ablation_paper.stored_models(store, 0, phases))
        assert run(first).models.count("base") == 1
        record = {"models": list(run(first).models)}
        (store / "seed-0" / "phases.json").write_text(json.dumps({first: record}))
        assert ablation_paper.stored_models(store, 0, phases) == set(record["models"])
        for later in phases:
            assert run(later) == phases[later], (first, later)
    # a record from before phases named their models: the phase's own list
    (store / "seed-0" / "phases.json").write_text(json.dumps({name: {} for name in phases}))
    assert ablation_paper.stored_models(store, 0, phases) == {m for p in phases.values() for m in p.models}


def test_phases_of_one_seed_stored_from_two_run_folders_at_once_keep_each_others_models(tmp_path):
    """Two phases of a seed run side by side in separate run folders (each restored from the store before the other
    was stored): whichever stores last adds its own models to the stored measures and drops none of the other's."""
    store = tmp_path / "store"
    phases = {name: ablation_paper.with_base(ablation_paper.PHASES[name], set()) if name == "ce_feedback"
              else ablation_paper.PHASES[name] for name in ("ce_feedback", "mol", "ce")}

    def ran(folder, name, stored):
        """A run folder holding phase ``name``'s models' evaluations and measures, and ``stored``'s restored ones."""
        out = tmp_path / folder
        (out / "base").mkdir(parents=True, exist_ok=True)
        (out / "base" / "model.safetensors").write_bytes(b"weights")
        run = ablation_paper.seed_dir(out, 2)
        (run / "world").mkdir(parents=True, exist_ok=True)
        (run / "world" / "world.json").write_text("{}")
        (run / "pipeline" / "collect").mkdir(parents=True, exist_ok=True)
        models = [*phases[name].models, *stored]
        for model in phases[name].models:
            (run / "pipeline" / "eval" / model).mkdir(parents=True, exist_ok=True)
            (run / "pipeline" / "eval" / model / "results.json").write_text(json.dumps({"model": model}))
        for i, measure in enumerate(ablation_paper.MEASURES):
            (run / "pipeline" / measure).write_text(json.dumps({m: {"value": i} for m in models}))
        return out
    first = ran("a", "ce_feedback", [])
    ablation_paper.store_phase(first, store, 2, "ce_feedback", phases["ce_feedback"], {})
    done = sorted(ablation_paper.stored_models(store, 2))
    side_by_side = [(ran("b", "mol", done), "mol"), (ran("c", "ce", done), "ce")]  # both started from the store
    for out, name in side_by_side:
        ablation_paper.store_phase(out, store, 2, name, phases[name], {})
    everyone = {m for p in phases.values() for m in p.models}
    assert ablation_paper.stored_models(store, 2) == everyone
    kept = store / "seed-2" / "pipeline"
    for measure in ablation_paper.MEASURES:
        assert set(json.loads((kept / measure).read_text())) == everyone, measure
    assert {p.name for p in (kept / "eval").iterdir()} == everyone


def test_the_report_sets_each_seeds_grpo_replicate_beside_its_first_run_once_stored(tmp_path):
    store = tmp_path / "store"
    for seed in range(3):
        write_seed(store, seed, {m: 0.1 * (seed + 1) for m in ablation_paper.MODELS} | {"mol+grpo": 0.6},
                   {m: 0.5 for m in ablation_paper.MODELS}, {m: 0.01 for m in ablation_paper.MODELS},
                   {m: 1.0 for m in ablation_paper.MODELS}, {m: set(range(2)) for m in ablation_paper.MODELS})
    assert "two training seeds" not in ablation_paper.report(store, 3).read_text()
    pipeline = store / "seed-2" / "pipeline"
    results = {"benchmarks": {b: {"pass@1": s, "problems": 10, "samples": 10} for b, s in (("heldout", 0.9),
                                                                                            ("general", 0.4))}}
    (pipeline / "eval" / "mol+grpo_rep").mkdir()
    (pipeline / "eval" / "mol+grpo_rep" / "results.json").write_text(json.dumps(results))
    (pipeline / "metrics").mkdir()
    (pipeline / "metrics" / "mol+grpo_rep.jsonl").write_text("".join(json.dumps({"step": k + 1, "reward": r}) + "\n"
                                                                     for k, r in enumerate((0.0, 0.5, 0.5, 1.0))))
    phases = json.loads((store / "seed-2" / "phases.json").read_text())
    phases["grpo_replicate"] = phases["mol"] | {"models": list(ablation_paper.PHASES["grpo_replicate"].models)}
    (store / "seed-2" / "phases.json").write_text(json.dumps(phases))
    text = ablation_paper.report(store, 3).read_text()
    assert "two training seeds (seed 2;" in text
    rows = [line for line in text.splitlines() if line.startswith("| 2 | ")]
    # seed 2: mol 0.3, mol+grpo 0.6 (its metrics not stored), the replicate 0.9 rising 0 → 1; ce's not replicated
    assert rows == ["| 2 | `mol` | 0.300 | 0.600 | not logged | 0.900 | 0.000 → 1.000 (± 0.000) |",
                    "| 2 | `ce` | 0.300 | 0.300 | not logged | - | - |"]
    assert ablation_paper.report(store, 2).read_text().count("two training seeds") == 0  # seed 2 not reported
    # seed 1's CE + GRPO replicated alone: its row has the replicate, MoL's has none
    pipeline = store / "seed-1" / "pipeline"
    (pipeline / "eval" / "ce+grpo_rep").mkdir()
    (pipeline / "eval" / "ce+grpo_rep" / "results.json").write_text(json.dumps(results))
    phases = json.loads((store / "seed-1" / "phases.json").read_text())
    phases["ce_grpo_replicate"] = phases["ce"] | {"models": ["ce+grpo_rep"]}
    (store / "seed-1" / "phases.json").write_text(json.dumps(phases))
    text = ablation_paper.report(store, 3).read_text()
    assert "two training seeds (seeds 1, 2;" in text
    assert [line for line in text.splitlines() if line.startswith("| 1 | ")] == [
        "| 1 | `mol` | 0.200 | 0.600 | not logged | - | - |", "| 1 | `ce` | 0.200 | 0.200 | not logged | 0.900 | not logged |"]


def test_a_stored_phase_keeps_each_grpo_runs_samples_gzipped_and_the_same_samples_make_the_same_file(tmp_path):
    """What GRPO sampled (``completions.jsonl``) outlives the run folder: every RL run of the phase is kept in the
    store gzipped, byte for byte what the run wrote, and storing again gives the identical file (no timestamp)."""
    import gzip

    out, store = tmp_path / "out", tmp_path / "store"
    phase = ablation_paper.PHASES["mol"]
    (out / "base").mkdir(parents=True)
    (out / "base" / "model.safetensors").write_bytes(b"weights")
    run = ablation_paper.seed_dir(out, 0)
    (run / "world").mkdir(parents=True)
    (run / "world" / "world.json").write_text("{}")
    (run / "pipeline" / "collect").mkdir(parents=True)
    for model in phase.models:
        (run / "pipeline" / "eval" / model).mkdir(parents=True)
    for measure in ablation_paper.MEASURES:
        (run / "pipeline" / measure).write_text(json.dumps({m: 1 for m in phase.models}))
    rows = {r.name: "".join(json.dumps({"step": s, "completion": f"{r.name} {s}"}) + "\n" for s in (1, 2))
            for r in phase.rl_runs}
    for r in phase.rl_runs:
        (run / "pipeline" / "rl" / r.name).mkdir(parents=True)
        (run / "pipeline" / "rl" / r.name / "completions.jsonl").write_text(rows[r.name])
    ablation_paper.store_phase(out, store, 0, "mol", phase, {})
    kept = {r.name: store / "seed-0" / "pipeline" / "metrics" / f"{r.name}.completions.jsonl.gz"
            for r in phase.rl_runs}
    assert kept and all(gzip.decompress(f.read_bytes()).decode() == rows[n] for n, f in kept.items())
    first = {n: f.read_bytes() for n, f in kept.items()}
    ablation_paper.store_phase(out, store, 0, "mol", phase, {})
    assert {n: f.read_bytes() for n, f in kept.items()} == first
    assert ablation_paper.keep_samples(tmp_path / "no run", tmp_path / "metrics", "x") is None
    assert not (tmp_path / "metrics").exists()
