"""A finished run is never rewritten (``molrl.records.rerun``): re-run as it was, or with any key a re-run may change
(``HARMLESS``, and ``GREEDY_ONLY`` under greedy decoding), eval, collect and the pipeline leave every file of the run
as it was, byte for byte and mtime for mtime (mol and rl: tests/test_rerun.py); a key that changes how samples are drawn
is refused by name with both values; and each sample and results file records the engine, the model's fingerprint and
the sampling that made it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from molrl.config import ConfigError, load_config
from molrl.errors import MolrlError
from molrl.records.rerun import GREEDY_ONLY, HARMLESS

AIME = "aime24/test.jsonl"
MATH = "math500/test.jsonl"


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder`` but a lock (which says who runs there, not what the run made): its bytes and
    modification time."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.rglob("*")
            if p.is_file() and not p.name.endswith(".lock")}


def copy_of(run: Path, dest: Path) -> Path:
    """A copy of a finished run (mtimes kept), so each variant starts from the same finished folder."""
    return Path(shutil.copytree(run, dest))


# --- eval -------------------------------------------------------------------------------------------------------------

def eval_cfg(shared_data: Path, out: Path, *overrides: str, temperature: float = 0.7):
    from molrl.eval.config import EvalConfig

    base = [f"model=tiny:chatml", "benchmarks=[aime24, math500]", f"data.aime24={shared_data / AIME}",
            f"data.math500={shared_data / MATH}", "limit=2", "sandbox.workers=1", "engine=transformers",
            f"sampling.temperature={temperature}", "sampling.max_new_tokens=4", f"output_dir={out}",
            *(["sampling.n=2", "ks=[1, 2]"] if temperature > 0 else ["sampling.n=1", "ks=[1]"])]  # greedy: one sample
    return load_config(EvalConfig, None, [*base, *overrides])


EVAL_VARIANTS = {
    "output_dir": [],  # the copy itself: saved under the original's folder, re-run in the copy's
    "label": ["label=another"],
    "benchmarks": ["benchmarks=[aime24]"],
    "limit": ["limit=1"],
    "data.*.limit": ["data.aime24.limit=1"],
    "ks": ["ks=[1]"],  # under greedy decoding the saved one: there n is 1
    "partial_predictions": ["partial_predictions=true"],
    "static_cache": ["static_cache=true"],
    "sandbox.workers": ["sandbox.workers=2"],
    "threads": ["threads=1"],
    "engine": ["engine=vllm"],
    "device": ["device=meta"],
    "batch_size": ["batch_size=3"],
}
"""A value other than the finished run's for every key a re-run of eval may change."""


@pytest.fixture(scope="module")
def finished_eval(shared_data, tmp_path_factory) -> dict[float, Path]:
    """A finished tiny eval of two benchmarks, sampled at temperature 0.7 and greedily."""
    from molrl.eval import run_eval

    root = tmp_path_factory.mktemp("eval")
    return {t: run_eval(eval_cfg(shared_data, root / f"t{t}", temperature=t)) for t in (0.7, 0.0)}


def test_every_key_a_rerun_of_eval_may_change_has_a_variant():
    assert set(EVAL_VARIANTS) == {*HARMLESS["eval"], *GREEDY_ONLY["eval"]}


@pytest.mark.parametrize("temperature", [0.7, 0.0])
@pytest.mark.parametrize("key", sorted(EVAL_VARIANTS))
def test_a_finished_eval_rerun_changes_no_file(finished_eval, shared_data, tmp_path, key, temperature):
    from molrl.eval import run_eval

    run = copy_of(finished_eval[temperature], tmp_path / "run")
    before = snapshot(run)
    cfg = eval_cfg(shared_data, run, *EVAL_VARIANTS[key], temperature=temperature)
    if key in GREEDY_ONLY["eval"] and temperature > 0:  # another random stream: refused, by name, both values
        saved = {"engine": "'transformers'", "device": "None", "batch_size": "16"}[key]
        now = EVAL_VARIANTS[key][0].split("=")[1]
        with pytest.raises(ConfigError, match=rf"{key} was {saved}, now '?{now}'?"):
            run_eval(cfg)  # before: engine, device and batch_size were accepted and the run rewritten
    else:
        run_eval(cfg)  # before: config.yaml, results.json and results.md rewritten (label, ks, limit, engine...)
    assert snapshot(run) == before


def test_finding_a_finished_run_rerun_with_another_engine_is_refused(finished_eval, shared_data, tmp_path):
    from molrl.eval import run_eval

    run = copy_of(finished_eval[0.7], tmp_path / "run")
    before = snapshot(run)
    with pytest.raises(ConfigError, match="engine was 'transformers', now 'vllm'; start a new run elsewhere"):
        run_eval(eval_cfg(shared_data, run, "engine=vllm"))  # before: "2 of 2 problems already done", rewritten
    assert snapshot(run) == before


def test_each_sample_and_the_results_record_engine_model_and_sampling(finished_eval):
    run = finished_eval[0.7]
    records = [json.loads(line) for line in (run / "math500" / "samples.jsonl").read_text().splitlines()]
    made = [r["made_by"] for r in records]
    assert {m["engine"] for m in made} == {"transformers"}
    assert [m["sampling"]["seed"] for m in made] == [0, 0, 0, 0]  # one chunk: its seed is the run's
    assert {(m["sampling"]["temperature"], m["sampling"]["n"]) for m in made} == {(0.7, 2)}
    results = json.loads((run / "results.json").read_text())
    assert results["engine"] == "transformers" and results["sampling"]["temperature"] == 0.7
    assert results["model_fingerprint"] == {}  # an in-process tiny model has no files to fingerprint


def test_a_raised_limit_extends_only_with_the_model_that_made_the_samples(shared_data, tmp_path, tiny_pair):
    from molrl.eval import run_eval

    model, tokenizer = tiny_pair
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    out = tmp_path / "run"
    run_eval(eval_cfg(shared_data, out, f"model={folder}", "benchmarks=[aime24]", "limit=1"))
    kept = json.loads((out / "aime24" / "samples.jsonl").read_text().splitlines()[0])["made_by"]["model"]
    assert set(kept) == {"model.path"}
    (out / "inputs.json").unlink()  # the guard beside the config gone: the samples still carry theirs
    with (folder / "config.json").open("a") as handle:  # other contents under the same name
        handle.write("\n")
    before = snapshot(out)
    with pytest.raises(MolrlError, match=r"samples.jsonl: problem \S+ was sampled from another model.path "
                                         r"\(fingerprint \S+, now \S+\); put that model back"):
        run_eval(eval_cfg(shared_data, out, f"model={folder}", "benchmarks=[aime24]", "limit=2"))
    assert snapshot(out) == before  # before: two models' samples in one report


# --- collect ----------------------------------------------------------------------------------------------------------

def collect_cfg(shared_data: Path, out: Path, *overrides: str, temperature: float = 1.0):
    from molrl.collect import CollectConfig

    base = ["model=tiny:chatml", f"data.path={shared_data / 'mbpp' / 'mbpp.jsonl'}", "data.format=mbpp",
            "data.split=all", "data.limit=2", "sampling.n=2", "episode.max_turns=1", "thinking=true", "progress=false",
            "sandbox.workers=1", "engine=transformers", f"sampling.temperature={temperature}",
            "sampling.max_new_tokens=8", f"output_dir={out}"]
    return load_config(CollectConfig, None, [*base, *overrides])


COLLECT_VARIANTS = {
    "output_dir": [],
    "data.limit": ["data.limit=1"],
    "sampling.n": ["sampling.n=1"],
    "progress": ["progress=true"],
    "sandbox.workers": ["sandbox.workers=2"],
    "threads": ["threads=1"],
    "engine": ["engine=vllm"],
    "device": ["device=meta"],
    "episode.batch_size": ["episode.batch_size=3"],
}
"""A value other than the finished run's for every key a re-run of collect may change."""


@pytest.fixture(scope="module")
def finished_collect(shared_data, tmp_path_factory) -> dict[float, Path]:
    """A finished tiny collection (2 MBPP tasks, 2 samples each), sampled at temperature 1 and greedily."""
    from molrl.collect import run_collect

    root = tmp_path_factory.mktemp("collect")
    return {t: run_collect(collect_cfg(shared_data, root / f"t{t}", temperature=t)).parent for t in (1.0, 0.0)}


def test_every_key_a_rerun_of_collect_may_change_has_a_variant():
    assert set(COLLECT_VARIANTS) == {*HARMLESS["collect"], *GREEDY_ONLY["collect"]}


@pytest.mark.parametrize("temperature", [1.0, 0.0])
@pytest.mark.parametrize("key", sorted(COLLECT_VARIANTS))
def test_a_finished_collect_rerun_changes_no_file(finished_collect, shared_data, tmp_path, key, temperature):
    from molrl.collect import run_collect

    run = copy_of(finished_collect[temperature], tmp_path / "run")
    before = snapshot(run)
    cfg = collect_cfg(shared_data, run, *COLLECT_VARIANTS[key], temperature=temperature)
    if key in GREEDY_ONLY["collect"] and temperature > 0:
        with pytest.raises(ConfigError, match=rf"{key} was \S+, now \S+; start a new run"):
            run_collect(cfg)  # before: a re-run on another engine or device was accepted
    else:
        run_collect(cfg)
    assert snapshot(run) == before


def _stages_known(run: Path, tmp_path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The stage a run folder names, and the one ``molrl.records.locks.MADE_BEFORE`` knows it by without that file."""
    from molrl.records.locks import folder_stages
    from molrl.records.writes import STAGE

    before = copy_of(run, tmp_path / "before")
    (before / STAGE).unlink()
    return folder_stages(run), folder_stages(before)


def test_a_collect_run_names_its_stage_in_its_folder(finished_collect, tmp_path):
    assert _stages_known(finished_collect[1.0], tmp_path) == ({"collect": ".molrl_stage"}, {"collect": "traces.jsonl"})


def test_each_trace_records_the_engine_that_made_it_and_the_models_fingerprint(finished_collect):
    from molrl.traces.schema import read_traces

    metas = [t.meta["generation"] for _, t in read_traces(finished_collect[1.0] / "traces.jsonl")]
    assert metas and {m["engine"] for m in metas} == {"transformers"}  # the engine chosen, where auto was asked
    assert all(m["model_fingerprint"] == {} and m["sampling"]["temperature"] == 1.0 for m in metas)


# --- pipeline ---------------------------------------------------------------------------------------------------------

def test_a_finished_pipeline_rerun_changes_no_file(shared_data, tmp_path):
    from molrl.pipeline import run_pipeline
    from molrl.pipeline.config import PipelineConfig

    def pipeline(*overrides: str) -> PipelineConfig:
        return load_config(PipelineConfig, None, [
            "model=tiny:chatml", "stages=[eval]", "eval_models=[base]", f"output_dir={tmp_path / 'p'}",
            "eval.benchmarks=[aime24]", f"eval.data.aime24={shared_data / AIME}", "eval.limit=1", "eval.ks=[1]",
            "eval.sampling.n=1", "eval.sampling.max_new_tokens=4", "eval.engine=transformers", *overrides])

    run_pipeline(pipeline())
    before = snapshot(tmp_path / "p")
    run_pipeline(pipeline())
    run_pipeline(pipeline("eval.threads=1", "eval.sandbox.workers=3"))
    assert snapshot(tmp_path / "p") == before
    assert _stages_known(tmp_path / "p", tmp_path / "a") == ({"pipeline": ".molrl_stage"},
                                                             {"pipeline": "environment.json"})
    assert _stages_known(tmp_path / "p" / "eval" / "base", tmp_path / "b") == ({"eval": ".molrl_stage"},
                                                                                {"eval": "aime24/samples.jsonl"})
