"""Every door a trace comes through tags its task by content, and eval's test tasks can be left out of training:
importers and collect tag, ``traces stats`` counts the overlap, ``traces filter`` and MoL's data leave them out,
RL records what it trains on, and the shipped pipeline configs exclude them by default."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from molrl.cli import main
from molrl.errors import MolrlError
from molrl.task_types import Task
from molrl.tasks.index import BENCHMARK_TASK, TASK_KEY, BenchmarkIndex, problem_parts, task_content_key
from molrl.tasks.loaders import load_tasks
from molrl.traces.importers import import_file
from molrl.traces.schema import read_traces

REPO = Path(__file__).resolve().parents[1]
MBPP_16 = {"task_id": 16, "text": "Write a function to find sequences of lowercase letters joined with an underscore.",
           "code": "import re\ndef text_lowercase_underscore(text):\n    return 'Found a match!' if re.search('^[a-z]+_[a-z]+$', text) else 'Not matched!'",
           "test_list": ["assert text_lowercase_underscore(\"aab_cbbbc\")==('Found a match!')",
                         "assert text_lowercase_underscore(\"aab_Abbbc\")==('Not matched!')",
                         "assert text_lowercase_underscore(\"Aaab_abbbc\")==('Not matched!')"]}
MBPP_700 = {"task_id": 700, "text": "Write a function to count the number of elements in a list which are within a "
            "specific range.", "code": "def count_range_in_list(li, min, max):\n    return sum(min <= x <= max for x in li)",
            "test_list": ["assert count_range_in_list([10,20,30,40,40,40,70,80,99],40,100)==6",
                          "assert count_range_in_list(['a','b','c','d','e','f'],'a','e')==5",
                          "assert count_range_in_list([7,8,9,15,17,19,45],15,20)==3"]}


@pytest.fixture
def mbpp_file(tmp_path) -> Path:
    """An MBPP file of two tasks: 16 (test split) and 700 (train split)."""
    path = tmp_path / "mbpp.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (MBPP_16, MBPP_700)))
    return path


def _openai_file(tmp_path: Path, mbpp_file: Path) -> Path:
    """OpenAI-format traces: MBPP 16 and 700 posed under ids and wrappers of their own, and a task of nobody's."""
    tasks = load_tasks(mbpp_file, "mbpp")
    rows = [{"id": f"mine-{i}", "messages": [{"role": "system", "content": "You write Python."},
                                               {"role": "user", "content": f"Please help.\n\n{t.prompt}\n\nThanks!"},
                                               {"role": "assistant", "content": "def f(): pass"}]}
            for i, t in enumerate(tasks)]
    rows.append({"messages": [{"role": "user", "content": "Reverse a string."}, {"role": "assistant", "content": "s[::-1]"}]})
    path = tmp_path / "openai.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_openai_importer_tags_each_trace_by_content_under_its_own_ids(tmp_path, mbpp_file):
    from molrl.tasks.index import BenchmarkIndex

    index = BenchmarkIndex.from_files({"mbpp": mbpp_file})
    traces = [t for _, t in import_file(_openai_file(tmp_path, mbpp_file), "openai", index=index).traces]
    assert [t.meta.get(BENCHMARK_TASK, {}).get("id") for t in traces] == ["16", "700", None]
    assert [t.meta.get(BENCHMARK_TASK, {}).get("split") for t in traces] == ["test", "train", None]
    tasks = load_tasks(mbpp_file, "mbpp")
    assert [t.meta[TASK_KEY] for t in traces] == [task_content_key(tasks[0]), task_content_key(tasks[1]),
                                                  problem_parts("Reverse a string.").key]


def test_convert_cli_tags_real_mint_traces_with_their_mbpp_test_tasks(shared_data, tmp_path):
    out = tmp_path / "mint.jsonl"
    source = shared_data / "traces/mint/gpt-4-0613_F_None__mbpp.jsonl"
    assert main(["traces", "convert", "--from", "mint", str(source), str(out),
                 "--benchmarks", f"mbpp={shared_data / 'mbpp/mbpp.jsonl'}"]) == 0
    found = [t.meta[BENCHMARK_TASK] for _, t in read_traces(out)]
    assert len(found) == 91 and {(f["benchmark"], f["split"]) for f in found} == {("mbpp", "test")}
    assert len({f["id"] for f in found}) == 91  # MINT's ids 0-90 are MBPP's 16-491


def test_collected_traces_carry_their_task_and_its_key(mbpp_file):
    from molrl.episode import EpisodeConfig, start_episode

    task = load_tasks(mbpp_file, "mbpp", split="all")[0]
    meta = start_episode(task, 0, EpisodeConfig()).to_trace({}).meta
    assert meta[BENCHMARK_TASK] == {"benchmark": "mbpp", "split": "test", "id": "16", "key": task_content_key(task)}
    own = Task(id="x", prompt="Reverse a string.", kind="math", answer="a")
    assert start_episode(own, 0, EpisodeConfig()).to_trace({}).meta[TASK_KEY] == task_content_key(own)


def test_stats_prints_the_overlap_per_benchmark_split(shared_data, tmp_path, mbpp_file, capsys):
    out = tmp_path / "traces.jsonl"
    assert main(["traces", "convert", "--from", "openai", str(_openai_file(tmp_path, mbpp_file)),
                 str(out)]) == 0  # converted without an index: stats matches them itself
    capsys.readouterr()
    assert main(["traces", "stats", str(out), "--tokenizer", str(shared_data / "qwen3_tokenizer"),
                 "--benchmarks", f"mbpp={mbpp_file}"]) == 0
    table = capsys.readouterr().out
    row = next(line for line in table.splitlines() if "traces.jsonl" in line and "1 (1)" in line)
    assert [cell.strip() for cell in row.strip("│┃ ").split("│")] == ["traces.jsonl", "3", "1 (1)", "1 (1)", "1"]
    assert "mbpp/test" in table and "mbpp/train" in table


def test_filter_excludes_eval_test_tasks_and_says_how_many(tmp_path, mbpp_file, caplog, cli_logs):
    converted = tmp_path / "traces.jsonl"
    assert main(["traces", "convert", "--from", "openai", str(_openai_file(tmp_path, mbpp_file)), str(converted)]) == 0
    out = tmp_path / "kept.jsonl"
    with caplog.at_level(logging.INFO, logger="molrl.traces"):
        assert main(["traces", "filter", str(converted), str(out), "--exclude-benchmarks", f"mbpp={mbpp_file}"]) == 0
    assert [t.meta.get("id") for _, t in read_traces(out)] == ["mine-1", None]  # MBPP 700 (train) stays
    assert "--exclude-benchmarks: left out 1 of 3 traces whose task is one eval scores (mbpp/test 1); 2 remain" \
        in caplog.text


def test_a_bad_benchmark_option_is_refused_in_one_line(tmp_path, mbpp_file, capsys):
    converted = tmp_path / "traces.jsonl"
    assert main(["traces", "convert", "--from", "openai", str(_openai_file(tmp_path, mbpp_file)), str(converted)]) == 0
    assert main(["traces", "filter", str(converted), str(tmp_path / "o.jsonl"), "--exclude-benchmarks", "gsm8k=x"]) != 0
    assert "--exclude-benchmarks 'gsm8k=x': expected NAME=PATH" in capsys.readouterr().err


def _tiny_traces(tmp_path: Path, mbpp_file: Path) -> Path:
    """Domain traces with feedback on MBPP 16 (test) and 700 (train), as a tokenizer-ready file."""
    rows = []
    for task in load_tasks(mbpp_file, "mbpp"):
        rows.append({"messages": [{"role": "user", "content": task.prompt},
                                  {"role": "assistant", "content": "<execute>print(1)</execute>"},
                                  {"role": "tool", "content": "1"},
                                  {"role": "assistant", "content": "<solution>def f(): pass</solution>"}],
                     "meta": {"kind": "domain"}})
    path = tmp_path / "mol.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_mol_data_leaves_out_eval_test_tasks_and_records_every_key(tmp_path, mbpp_file, caplog):
    from molrl.mol.data import load_examples
    from molrl.tiny import build_tiny_tokenizer

    traces = _tiny_traces(tmp_path, mbpp_file)
    tasks = load_tasks(mbpp_file, "mbpp")
    with caplog.at_level(logging.INFO):
        examples, stats = load_examples([str(traces)], build_tiny_tokenizer("chatml"), 4096,
                                        exclude_benchmarks={"mbpp": str(mbpp_file)})
    assert len(examples) == 1 and stats.excluded == {"mbpp/test": 1}
    assert stats.task_keys == [task_content_key(tasks[1])]
    assert stats.benchmark_tasks == [("mbpp", "train", "700", task_content_key(tasks[1]))]
    assert "data.exclude_benchmarks: left out 1 of 2 traces whose task is one eval scores (mbpp/test 1); 1 remain" \
        in caplog.text
    _, everything = load_examples([str(traces)], build_tiny_tokenizer("chatml"), 4096)
    assert everything.task_keys == sorted(task_content_key(t) for t in tasks)  # without the option: all kept


def test_mol_data_names_a_missing_benchmark_file(tmp_path, mbpp_file):
    from molrl.mol.data import load_examples
    from molrl.tiny import build_tiny_tokenizer

    with pytest.raises(MolrlError, match=r"data.exclude_benchmarks.mbpp=MBPP_TEST.jsonl: no such file"):
        load_examples([str(_tiny_traces(tmp_path, mbpp_file))], build_tiny_tokenizer("chatml"), 4096,
                      exclude_benchmarks={"mbpp": "MBPP_TEST.jsonl"})


def test_rl_prompts_record_the_keys_and_benchmark_tasks_they_train_on(mbpp_file):
    from molrl.rl.data import build_prompt_rows
    from molrl.tiny import build_tiny_tokenizer

    tasks = load_tasks(mbpp_file, "mbpp", split="all")
    _, summary = build_prompt_rows(tasks, build_tiny_tokenizer("chatml"), enable_thinking=False,
                                   max_prompt_length=4096)
    assert summary.task_keys == sorted(task_content_key(t) for t in tasks)
    assert summary.benchmark_tasks == [("mbpp", "test", "16", task_content_key(tasks[0])),
                                       ("mbpp", "train", "700", task_content_key(tasks[1]))]


@pytest.mark.parametrize("name", ["pipeline_qwen3_4b.yaml", "pipeline_qwen3_8b.yaml"])
def test_shipped_qwen_pipelines_leave_eval_test_tasks_out_of_mol(name, tmp_path, mbpp_file):
    from molrl.pipeline.config import load_pipeline_config, mol_config

    cfg = load_pipeline_config(REPO / "configs" / name, ["model=m", f"eval.data.mbpp={mbpp_file}"])
    assert cfg.exclude_eval_tasks
    mol = mol_config(cfg, cfg.mol_runs[0], ["traces.jsonl"], tmp_path)
    assert mol.data.exclude_benchmarks == {"math500": "MATH500.jsonl", "aime24": "AIME24.jsonl",
                                           "aime25": "AIME25.jsonl", "humaneval": "HumanEval.jsonl.gz",
                                           "mbpp": str(mbpp_file)}
    off = load_pipeline_config(REPO / "configs" / name, ["model=m", "exclude_eval_tasks=false"])
    assert mol_config(off, off.mol_runs[0], ["traces.jsonl"], tmp_path).data.exclude_benchmarks == {}


@pytest.mark.parametrize("name", ["pipeline_qwen3_4b.yaml", "pipeline_qwen3_8b.yaml"])
def test_shipped_qwen_pipelines_on_the_shared_mint_traces_train_on_no_eval_test_task(name, shared_data, tmp_path,
                                                                                     caplog, cli_logs):
    """The shipped Qwen pipelines, given the real MINT traces (converted as their comment says) and the real benchmark
    files, hand MoL no trace whose task eval then scores: every kept trace's key is outside the eval test keys."""
    from molrl.mol.data import load_examples
    from molrl.pipeline.config import load_pipeline_config, mol_config
    from molrl.tasks.index import BenchmarkIndex
    from molrl.tiny import build_tiny_tokenizer

    traces = tmp_path / "mint"
    assert main(["traces", "convert", "--from", "mint", str(shared_data / "traces/mint"), str(traces)]) == 0
    files = {"math500": shared_data / "math500/test.jsonl", "aime24": shared_data / "aime24/test.jsonl",
             "aime25": shared_data / "aime25/test.jsonl", "humaneval": shared_data / "humaneval/HumanEval.jsonl.gz",
             "mbpp": shared_data / "mbpp/mbpp.jsonl"}
    cfg = load_pipeline_config(REPO / "configs" / name, ["model=m", *(f"eval.data.{k}={v}" for k, v in files.items())])
    mol = mol_config(cfg, cfg.mol_runs[0], sorted(str(p) for p in traces.glob("*.jsonl")), tmp_path)
    with caplog.at_level(logging.INFO):
        _, stats = load_examples(mol.data.traces, build_tiny_tokenizer("chatml"), mol.data.max_length,
                                 exclude_benchmarks=mol.data.exclude_benchmarks)
    index = BenchmarkIndex.from_files(files)
    tested = {key for key, matches in index.by_key.items() if any(m.split == "test" for m in matches)}
    assert stats.task_keys and not set(stats.task_keys) & tested
    per_file = {"mbpp/test": 91, "humaneval/test": 45, "math500/test": 7}
    assert stats.excluded == {k: n * len(list(traces.glob("*__mbpp.jsonl"))) for k, n in per_file.items()}
    assert "empty or blank" not in caplog.text and "are tasks eval scores, left out" in caplog.text


WRAPPINGS = {
    "as given": lambda p: p,
    "a sentence before": lambda p: "Solve this task.\n" + p,
    "a sentence after": lambda p: p + "\nExplain your answer.",
    "a heading": lambda p: "## Task\n\n" + p,
    "fenced between prose": lambda p: "Here is the problem:\n```python\n" + p + "\n```\nGood luck.",
    "a system preamble": lambda p: "You are a helpful assistant.\n\n" + p,
    "zero-width spaces": lambda p: p.replace(" ", " \u200b"),
    "quoted line by line": lambda p: "> " + p.replace("\n", "\n> "),  # past the rule for code: neither way knows it
}
"""Ways a trace poses a benchmark problem; the first five after ``as given`` once each trained a model eval scored."""


def _benchmark_problems(shared_data: Path) -> dict[str, Task]:
    """HumanEval/0 and MBPP 11 (test split), by the name of their benchmark."""
    humaneval = load_tasks(shared_data / "humaneval/HumanEval.jsonl.gz", "humaneval")[0]
    mbpp = load_tasks(shared_data / "mbpp/mbpp.jsonl", "mbpp", split="test")[0]
    return {"humaneval": humaneval, "mbpp": mbpp}


def _both_ways(folder: Path, shared_data: Path, users: dict[str, str], metas: dict[str, dict] | None = None,
               suites: dict[str, list[Task]] | None = None) -> dict[str, tuple[set[str], dict[str, int]]]:
    """Per group of traces (``users``: ``GROUP|NAME`` -> first message): what ``traces filter --exclude-benchmarks``
    leaves out of the group (by NAME), and what eval refuses (per benchmark) with the record MoL makes from the
    group's traces."""
    from molrl.mol.config import MolConfig
    from molrl.mol.data import load_examples
    from molrl.mol.run import provenance
    from molrl.records.provenance import read_provenance, trained_overlap, write_provenance
    from molrl.tiny import build_tiny_tokenizer
    from molrl.traces.schema import write_traces

    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"id": name, "messages": [{"role": "user", "content": text},
                                      {"role": "assistant", "content": "<execute>\nprint(1)\n</execute>"},
                                      {"role": "tool", "content": "Observation:\n1"},
                                      {"role": "assistant", "content": "<solution>\npass\n</solution>"}],
             **({"meta": metas[name]} if metas and name in metas else {})} for name, text in users.items()]
    (folder / "raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    traces, kept = folder / "traces.jsonl", folder / "kept.jsonl"
    assert main(["traces", "convert", "--from", "openai", str(folder / "raw.jsonl"), str(traces)]) == 0
    files = {"humaneval": shared_data / "humaneval/HumanEval.jsonl.gz", "mbpp": shared_data / "mbpp/mbpp.jsonl"}
    assert main(["traces", "filter", str(traces), str(kept), "--exclude-benchmarks",
                 ",".join(f"{k}={v}" for k, v in files.items())]) == 0
    left_out = set(users) - {t.meta.get("id") for _, t in read_traces(kept)}
    known = {name: load_tasks(path, name, split="all") for name, path in files.items()}
    problems = suites or {name: [task] for name, task in _benchmark_problems(shared_data).items()}
    found = {}
    for group in sorted({name.split("|")[0] for name in users}):
        mine = folder / group.replace(" ", "_")
        write_traces(mine / "traces.jsonl", [t for _, t in read_traces(traces) if t.meta["id"].startswith(group + "|")])
        _, stats = load_examples([str(mine / "traces.jsonl")], build_tiny_tokenizer("chatml"), 4096)
        write_provenance(mine, provenance(MolConfig(), stats))  # the record MoL writes from these traces
        dropped = {name.split("|")[1] for name in left_out if name.startswith(group + "|")}
        found[group] = (dropped, trained_overlap(read_provenance(mine), problems, known))
    return found


@pytest.fixture(scope="module")
def wrapped(tmp_path_factory, shared_data) -> dict[str, tuple[set[str], dict[str, int]]]:
    """Each wrapping of HumanEval/0 and MBPP 11, filtered and trained on (a record per wrapping)."""
    problems = _benchmark_problems(shared_data)
    users = {f"{wrapping}|{name}": make(task.prompt) for wrapping, make in WRAPPINGS.items()
             for name, task in problems.items()}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("molrl.cli.setup_logging", lambda verbose=False: None)
        return _both_ways(tmp_path_factory.mktemp("wrapped"), shared_data, users)


@pytest.mark.parametrize("wrapping", sorted(WRAPPINGS))
def test_what_exclusion_leaves_out_eval_refuses_for_every_wrapping(wrapping, wrapped):
    dropped, refused = wrapped[wrapping]
    assert set(refused) == dropped  # one rule decides both
    if wrapping != "quoted line by line":  # before: MoL recorded the wrapped text's key, and eval scored the problem
        assert refused == {"humaneval": 1, "mbpp": 1}


def test_rl_on_wrapped_problems_of_one_s_own_file_is_refused_as_exclusion_leaves_them_out(shared_data):
    from molrl.records.provenance import made, trained_on, trained_overlap

    problems = _benchmark_problems(shared_data)
    for wrapping in sorted(WRAPPINGS):
        own = [Task(id=f"mine-{name}", prompt=WRAPPINGS[wrapping](task.prompt), kind="code", meta={})
               for name, task in problems.items()]
        record = made("rl", "cfg", "tiny:chatml", [], *trained_on(own))
        index = BenchmarkIndex.from_files({"humaneval": shared_data / "humaneval/HumanEval.jsonl.gz",
                                           "mbpp": shared_data / "mbpp/mbpp.jsonl"})
        dropped = {m.benchmark for m in map(index.match, (t.prompt for t in own)) if m is not None}
        assert set(trained_overlap(record, {n: [t] for n, t in problems.items()})) == dropped, wrapping


def test_a_trace_s_benchmark_tag_counts_as_trained_on_over_its_content(shared_data, tmp_path, cli_logs):
    tag = {"benchmark_task": {"benchmark": "humaneval", "split": "test", "id": "HumanEval/0",
                              "key": problem_parts("Reverse a string.").key}}  # the key of the content it holds
    collected = {"benchmark": "mbpp", "task_id": 11}  # collect's fields, the split left out: the id names it
    (dropped, refused), = _both_ways(tmp_path, shared_data, {"t|humaneval": "Reverse a string.",
                                                            "t|mbpp": "Sort a list."},
                                     {"t|humaneval": tag, "t|mbpp": collected}).values()
    assert dropped == {"humaneval", "mbpp"} and refused == {"humaneval": 1, "mbpp": 1}  # before: both scored


def test_a_train_task_s_twin_in_the_test_split_is_told_apart_by_its_key_both_ways(shared_data, tmp_path, cli_logs):
    """MBPP 602 (train) poses 217's (test) statement with another test: trained on 602 as given, 217 is scored; posed
    in a wrapper, containment cannot tell them apart, and both ways take it for 217."""
    mbpp = {t.id: t for t in load_tasks(shared_data / "mbpp/mbpp.jsonl", "mbpp", split="all")}
    suites = {"mbpp": [mbpp["217"]]}
    traces = {"given|mbpp": mbpp["602"].prompt, "wrapped|mbpp": "Solve this task.\n" + mbpp["602"].prompt}
    found = _both_ways(tmp_path, shared_data, traces, suites=suites)
    assert found == {"given": (set(), {}), "wrapped": ({"mbpp"}, {"mbpp": 1})}
