"""Reports say what cut their results: the share of answers the token limit cut (eval's results.md, the pipeline
report, ``eval compare``), every stage's time with the base model's, and comparisons labelled by run name in one
unit (fractions)."""

from __future__ import annotations

import json
from pathlib import Path

from grpo_helpers import save_tiny_model
from molrl.config import load_config, save_config
from molrl.pipeline.config import MolRun, PipelineConfig, RlRun
from molrl.report import write_report


def _tasks(path: Path, n: int = 2) -> Path:
    path.write_text("".join(json.dumps({"id": f"t{i}", "prompt": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                            for i in range(n)))
    return path


def test_generated_answers_know_whether_the_token_limit_cut_them(tmp_path):
    from molrl.engines.generation import SamplingConfig, TransformersGenerator
    from molrl.models import load_model, load_tokenizer

    greedy = SamplingConfig(n=1, temperature=0.0, max_new_tokens=6)
    prompts = ["<|im_start|>user\nWhat is 1 + 1?<|im_end|>\n<|im_start|>assistant\n"] * 2
    cut = {}
    for name, eos_logit in (("ends at once", 30.0), ("never ends", -30.0)):
        model_dir = save_tiny_model(tmp_path / name, eos_logit=eos_logit)
        tokenizer = load_tokenizer(str(model_dir))
        generator = TransformersGenerator(load_model(str(model_dir)), tokenizer)
        completions = [c for (c,) in generator.generate(prompts, greedy)]
        lengths = [len(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in completions]
        cut[name] = ([c.truncated for c in completions], lengths)
    assert cut["ends at once"] == ([False, False], [0, 0])  # EOS first: an empty answer the model ended itself
    assert cut["never ends"][0] == [True, True] and all(n >= 5 for n in cut["never ends"][1])  # 6 tokens, then cut


def test_eval_records_the_cut_per_sample_and_warns_in_results_md(tmp_path):
    from molrl.eval.config import EvalConfig
    from molrl.eval.run import run_eval

    model = save_tiny_model(tmp_path / "model", eos_logit=-30.0)  # it never ends an answer by itself
    cfg = load_config(EvalConfig, None, [f"model={model}", "benchmarks=[qa]", f"data.qa={_tasks(tmp_path / 'qa.jsonl')}",
                                         "data.qa.spec.kind=math", "sampling.temperature=0", "sampling.max_new_tokens=6",
                                         "ks=[1]", f"output_dir={tmp_path / 'run'}"])
    out = run_eval(cfg)
    samples = [json.loads(line) for line in (out / "qa" / "samples.jsonl").read_text().splitlines()]
    assert [s["truncated"] for s in samples] == [True, True]
    assert json.loads((out / "results.json").read_text())["benchmarks"]["qa"]["truncated"] == 1.0
    md = (out / "results.md").read_text()
    assert "| qa | 2 | 2 | 0.000 | 0.000 | 0.000 | 1.000 |" in md  # pass@1, avg@1, maj@1, then the share cut
    assert "- **Warning**: qa: 2 of 2 samples (1.000) hit the limit of 6 new tokens before the answer ended" in md


def _fake_run(run_dir: Path, cut: dict[str, float]) -> PipelineConfig:
    """A finished pipeline run on disk: its config and each model's results.json (heldout: 50 problems)."""
    cfg = PipelineConfig(model=str(run_dir / "base_model"), mol_runs=[MolRun("mol")],
                         rl_runs=[RlRun("mol+grpo", start="mol")])
    save_config(cfg, run_dir / "config.yaml")
    for name, p in (("base", 0.16), ("mol", 0.30), ("mol+grpo", 0.08)):
        (run_dir / "eval" / name).mkdir(parents=True)
        result = {"sampling": {"max_new_tokens": 48},
                  "benchmarks": {"heldout": {"problems": 50, "samples": 50, "pass@1": p, "truncated": cut[name]}}}
        (run_dir / "eval" / name / "results.json").write_text(json.dumps(result))
    return cfg


def test_the_pipeline_report_shows_the_share_cut_and_warns_past_five_percent(tmp_path):
    _fake_run(tmp_path, {"base": 0.0, "mol": 0.04, "mol+grpo": 0.22})
    report = write_report(tmp_path).read_text()
    assert "0.080 ± 0.038 (50 × 1); 0.220 cut" in report  # sqrt(0.08 * 0.92 / 50) = 0.038
    assert "Answers cut at the token limit of 48 new tokens (share of samples): mol heldout 0.040, " \
           "mol+grpo heldout 0.220." in report
    # 0.22 of 50 samples is 11 answers; mol's 0.04 (2 answers) stays under the 5% warning
    assert "- **Warning**: mol+grpo, heldout: 11 of 50 samples (0.220) hit the limit of 48 new tokens" in report
    assert "**Warning**: mol," not in report


def test_the_report_says_when_no_answer_was_cut(tmp_path):
    _fake_run(tmp_path, {"base": 0.0, "mol": 0.0, "mol+grpo": 0.0})
    assert "No answer was cut at the token limit of 48 new tokens." in write_report(tmp_path).read_text()


def test_the_timing_table_holds_every_stage_and_the_base_model(tmp_path):
    from molrl.demo.base import write_making_time

    _fake_run(tmp_path, {"base": 0.0, "mol": 0.0, "mol+grpo": 0.0})
    (tmp_path / "base_model").mkdir()
    write_making_time(tmp_path / "base_model", 301.04)
    for stage, seconds in (("collect", 40.0), ("mol/mol", 120.5), ("grpo/mol+grpo", 290.0), ("eval/base", 3.2),
                           ("eval/mol", 3.1), ("eval/mol+grpo", 3.3)):
        (tmp_path / stage).mkdir(parents=True, exist_ok=True)
        (tmp_path / stage / "DONE").write_text(json.dumps({"seconds": seconds, "config": {}}))
    # this invocation skipped every finished stage: its own timings are near zero
    (tmp_path / "timings.json").write_text(json.dumps({"collect": 0.0, "mol/mol": 0.0, "grpo/mol+grpo": 0.0}))
    report = write_report(tmp_path).read_text()
    table = report[report.index("## Stage wall-clock times"):].split("\n\n")[1].splitlines()
    assert table[2:] == ["| base model (made before the pipeline) | 301.0 |", "| collect | 40.0 |", "| mol/mol | 120.5 |",
                         "| grpo/mol+grpo | 290.0 |", "| eval/base | 3.2 |", "| eval/mol | 3.1 |",
                         "| eval/mol+grpo | 3.3 |", "| total | 761.1 |"]  # 301.0 + 40 + 120.5 + 290 + 9.6


def test_compare_labels_columns_by_run_folder_in_fractions(tmp_path, capsys):
    from molrl.cli import main

    runs = []
    for parent, p, cut in (("a", 0.16, 0.0), ("b", 0.08, 0.22)):
        run = tmp_path / "runs" / parent / "eval"  # two runs of one folder name, labelled by whole paths
        run.mkdir(parents=True)
        result = {"label": str(tmp_path / "models" / parent / "checkpoint-final"), "sampling": {"max_new_tokens": 48},
                  "benchmarks": {"heldout": {"problems": 50, "samples": 50, "pass@1": p, "truncated": cut}}}
        (run / "results.json").write_text(json.dumps(result))
        runs.append(str(run))
    assert main(["eval", "compare", *runs, "--out", str(tmp_path / "cmp")]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[:3] == ["| benchmark | a/eval | b/eval |", "|---|---:|---:|", "| heldout | 0.160 | 0.080 |"]
    assert "- **Warning**: b/eval, heldout: 11 of 50 samples (0.220) hit the limit of 48 new tokens" in printed
