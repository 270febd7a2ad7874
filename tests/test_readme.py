"""The README says what runs: its real-run walkthrough runs as written (a tiny model in place of Qwen3-8B, a few
of each input file, steps shrunk by overrides appended to each command), and it gives the demo the times
``molrl demo --help`` gives."""

from __future__ import annotations

import gzip
import itertools
import re
import shlex
from pathlib import Path

import pytest

from molrl.cli import main
from molrl.traces.schema import read_traces

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MODEL = "/models/Qwen3-8B"
SHRINK = {  # appended to each command: a tiny model on CPU, one step, a token or two (never in the README)
    "mol": ["dtype=float32", "train.bf16=false", "train.gradient_checkpointing=false", "train.max_steps=1",
            "train.grad_accumulation=1", "data.max_length=4096", "lora.rank=4", "lora.alpha=8",
            "train.report_to=[none]"],
    "rl": ["model.dtype=float32", "engine=transformers", "train.gradient_checkpointing=false", "train.max_steps=1",
           "sampling.n=2", "prompts_per_step=1", "train.micro_batch_size=2", "sampling.max_new_tokens=8",
           "data.limit=2", "sandbox.workers=1", "eval.data.limit=1", "eval.sampling.max_new_tokens=4",
           "eval.kl_prompts=1", "train.report_to=[none]"],
    "eval": ["--limit", "1", "--n", "1", "--max-new-tokens", "8"],
}


def bash_block(heading: str) -> list[list[str]]:
    """The commands of the first bash block after ``heading``: continued lines joined, comments dropped."""
    text = README.read_text()
    start = text.index("```bash\n", text.index(heading)) + len("```bash\n")
    block = text[start:text.index("\n```", start)].replace("\\\n", " ")
    return [argv for line in block.splitlines() if (argv := shlex.split(line, comments=True))]


def first_lines(source: Path, dest: Path, n: int) -> None:
    """The first ``n`` records of a JSONL file (gzipped like its source)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if source.suffix == ".gz" else open
    with opener(source, "rt") as fh:
        lines = list(itertools.islice(fh, n))
    with opener(dest, "wt") as out:
        out.writelines(lines)


def test_readme_real_run_block_runs_as_written(shared_data, tmp_path, monkeypatch, cli_logs):
    # the block's inputs: MINT's result files and the benchmark files; everything else the block writes itself
    first_lines(shared_data / "traces/mint/gpt-4-0613_F_None__mbpp.jsonl",
                tmp_path / "mint_outputs/gpt-4-0613_F_None__mbpp.jsonl", 4)
    for name, source in {"mbpp.jsonl": "mbpp/mbpp.jsonl", "math500.jsonl": "math500/test.jsonl",
                         "aime24.jsonl": "aime24/test.jsonl", "aime25.jsonl": "aime25/test.jsonl",
                         "HumanEval.jsonl.gz": "humaneval/HumanEval.jsonl.gz"}.items():
        first_lines(shared_data / source, tmp_path / "data" / name, 3)
    # MBPP: RL trains on its train split (tasks 601-974) and eval scores its test split (11-510), task 16 among them:
    # MINT's first MBPP trace is on it (its task 0), so the filter leaves that trace out
    mbpp = (shared_data / "mbpp/mbpp.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "data/mbpp.jsonl").write_text("".join(mbpp[10:13] + mbpp[15:16] + mbpp[600:603]))
    (tmp_path / "configs").symlink_to(REPO / "configs")
    monkeypatch.chdir(tmp_path)

    commands = bash_block("### A real run on Qwen3-8B")
    assert [argv[:2] for argv in commands] == [["molrl", "traces"]] * 4 + [["molrl", "mol"], ["molrl", "rl"],
                                                                           ["molrl", "eval"]]
    for argv in commands:
        # the traces commands read Qwen3's own tokenizer; the training stages a tiny model in its place
        model = str(shared_data / "qwen3_tokenizer") if argv[1] == "traces" else "tiny:chatml"
        argv = [model if arg == MODEL else arg.replace(f"={MODEL}", f"={model}") for arg in argv[1:]]
        assert main([*argv, *SHRINK.get(argv[0], [])]) == 0, argv

    assert (tmp_path / "mask.html").is_file() and (tmp_path / "traces.jsonl").stat().st_size > 0
    trained = [t.meta["task_id"] for _, t in read_traces(tmp_path / "traces.jsonl")]
    assert 0 not in trained and trained  # MINT's task 0 is MBPP 16, a test task eval scores
    assert (tmp_path / "runs/rl_qwen3_8b/adapter/adapter_config.json").is_file()
    assert (tmp_path / "runs/eval/results.json").is_file()


def test_demo_help_and_readme_give_the_same_run_times(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    shown = capsys.readouterr().out
    readme = " ".join(README.read_text().split())
    # every "about N minutes" of the help's example lines appears in the README
    minutes = set(re.findall(r"about (\d+) minutes", shown))
    assert minutes and minutes <= set(re.findall(r"about (\d+) minutes", readme)), (minutes, shown)
