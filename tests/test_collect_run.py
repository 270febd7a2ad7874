"""``run_collect`` end to end: tiny model on real HumanEval/MBPP, trainer-ready traces, lossless resume."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from collect_scripted import ScriptedGenerator

from molrl import cli
from molrl.collect import CollectConfig, run_collect
from molrl.episode import EpisodeConfig
from molrl.config.blocks import TaskSource
from molrl.episode.feedback import rederive_feedback
from molrl.episode.providers import build_providers
from molrl.collect.files import collect_files
from molrl.collect.run import finished_pairs
from molrl.errors import MolrlError
from molrl.engines.generation import SamplingConfig
from molrl.sandbox import SandboxConfig
from molrl.tasks import load_tasks
from molrl.tiny import build_tiny_tokenizer
from molrl.traces.schema import read_traces
from molrl.traces.tokenize import TokenizeConfig, tokenize_trace

REPO = Path(__file__).resolve().parents[1]


def _cfg(tmp_path, tasks, fmt, limit=None, **kw):
    # these tests name tasks by id (MBPP 1, HumanEval 0): every split (the default is train)
    kw.setdefault("data", TaskSource(path=tasks, format=fmt, split="all", limit=limit))
    kw.setdefault("episode", EpisodeConfig(max_turns=2))
    kw.setdefault("thinking", True)
    kw.setdefault("sampling", SamplingConfig(temperature=1.0, max_new_tokens=24))
    return CollectConfig(model="tiny:chatml", output_dir=tmp_path,
                         sandbox=SandboxConfig(workers=1, timeout_s=5), progress=False, **kw)


def _traces(path):
    reader = read_traces(path)
    traces = [t for _, t in reader]
    assert reader.rejects == []
    return traces


def _check_feedback_rederives(traces, tasks, cfg, tokenizer):
    """Every tool message is exactly the text its recorded observation gives."""
    by_id = {t.id: t for t in tasks}
    providers = build_providers(cfg.feedback, cfg, tokenizer)
    n = 0
    for trace in traces:
        derived = rederive_feedback(trace.messages, trace.meta["observations"], by_id[trace.meta["task_id"]], providers)
        tool = {i: m["content"] for i, m in enumerate(trace.messages) if m["role"] == "tool"}
        assert derived == tool
        n += len(tool)
    return n


@pytest.mark.parametrize("fmt,name", [("humaneval", "humaneval/HumanEval.jsonl.gz"), ("mbpp", "mbpp/mbpp.jsonl")])
def test_tiny_model_writes_traces_the_trainer_tokenises(tmp_path, shared_data, fmt, name):
    cfg = _cfg(tmp_path, shared_data / name, fmt, limit=2,
               sampling=SamplingConfig(n=2, temperature=1.0, max_new_tokens=24))
    out = run_collect(cfg)
    traces = _traces(out)
    # every pair ends up in the traces, or (random bytes: a stray </think> in the first turn) the rejects file
    assert out == tmp_path / "traces.jsonl"
    assert set(finished_pairs(collect_files(tmp_path))) == {(t.id, s) for t in load_tasks(cfg.data.path, fmt, limit=2)
                                                          for s in range(2)}
    assert {t.meta["task_split"] for t in traces} == {"prompt" if fmt == "mbpp" else "test"}
    assert len(traces) >= 2
    tok = build_tiny_tokenizer("chatml")
    for trace in traces:
        assert trace.meta["generation"]["model"] == "tiny:chatml"
        assert [a == "model" for a in trace.meta["authors"]] == [m["role"] == "assistant" for m in trace.messages]
        tokenized = tokenize_trace(trace, tok, TokenizeConfig(max_length=None, enable_thinking=True))
        assert tokenized.n_feedback > 0 and tokenized.n_decision > 0
    assert _check_feedback_rederives(traces, load_tasks(cfg.data.path, fmt, limit=2), cfg.episode, tok) > 0


def test_sandbox_feedback_rederives_and_tokenises_with_qwen3(tmp_path, shared_data, qwen3_tokenizer):
    """A scripted model on real HumanEval under the Qwen3 template: wrong code, then the reference solution."""
    tasks = load_tasks(shared_data / "humaneval/HumanEval.jsonl.gz", "humaneval", limit=3)
    scripts = {t.prompt: [f"<execute>\ndef {t.entry_point}(*args):\n    return None\nprint({t.entry_point}(1))\n</execute>",
                          f"<solution>\n{t.reference}\n</solution>"] for t in tasks}
    cfg = _cfg(tmp_path, shared_data / "humaneval/HumanEval.jsonl.gz", "humaneval", limit=3,
               episode=EpisodeConfig(), thinking=False)
    out = run_collect(cfg, generator=ScriptedGenerator(scripts), tokenizer=qwen3_tokenizer)
    traces = _traces(out)
    # HumanEval/2 has one test, so it holds none back, and the feedback showed it: solved, but no success
    assert [(t.meta["success"], t.meta["unsplit"], t.meta["verdict"]) for t in traces] == [
        (True, False, True), (True, False, True), (False, True, True)]
    # thinking off: the template's empty think block opens every recorded turn, as the model saw it
    assert all(m["content"].startswith("<think>\n\n</think>\n\n<") for t in traces for m in t.messages if m["role"] == "assistant")
    assert all(t.meta["observations"]["3"]["observation"]["exec"]["stdout"] == "None\n" for t in traces)
    assert _check_feedback_rederives(traces, tasks, cfg.episode, qwen3_tokenizer) == 6
    for trace in traces:
        tokenized = tokenize_trace(trace, qwen3_tokenizer, TokenizeConfig(enable_thinking=False))
        assert tokenized.n_feedback > 0


def test_a_lone_surrogate_in_a_result_is_written_not_fatal(tmp_path, shared_data):
    # MBPP task 1 asks for min_cost; this one returns chr(0xD800), which UTF-8 cannot encode. Before, the
    # trace writer raised UnicodeEncodeError and the run stopped with the episode neither written nor rejected.
    scripts = {"": ["<solution>\ndef min_cost(*args):\n    return chr(0xD800)\n</solution>"]}
    cfg = _cfg(tmp_path, shared_data / "mbpp/mbpp.jsonl", "mbpp", limit=1, episode=EpisodeConfig(max_turns=1))
    run_collect(cfg, generator=ScriptedGenerator(scripts), tokenizer=build_tiny_tokenizer("chatml"))
    (trace,) = _traces(tmp_path / "traces.jsonl")
    tests = trace.meta["observations"]["3"]["observation"]["grade"]["details"]["tests"]
    assert [t["got"] for t in tests] == [{"t": "str", "v": "\\ud800"}]  # its one shown test, as the visible text readers take
    assert "returned '\\ud800', expected 8" in trace.messages[-1]["content"]


def test_a_lone_surrogate_in_an_error_reaches_the_model_escaped(tmp_path, shared_data):
    # the error text "ValueError: \ud800" goes into the tool message; raw, no tokenizer can render the next turn
    scripts = {"": ["<solution>\ndef min_cost(*args):\n    raise ValueError(chr(0xD800))\n</solution>",
                    "<solution>\nx\n</solution>"]}
    cfg = _cfg(tmp_path, shared_data / "mbpp/mbpp.jsonl", "mbpp", limit=1, episode=EpisodeConfig(max_turns=2))
    run_collect(cfg, generator=ScriptedGenerator(scripts), tokenizer=build_tiny_tokenizer("chatml"))
    (trace,) = _traces(tmp_path / "traces.jsonl")
    assert trace.meta["turns"] == 2
    assert "failed: ValueError: \\ud800" in trace.messages[3]["content"]


def test_an_episode_that_cannot_be_written_is_a_counted_reject(tmp_path, shared_data, monkeypatch, caplog):
    # a value JSON cannot hold in the meta: the episode goes to the rejects file with the reason, the run goes on
    from molrl.episode import loop

    to_trace = loop.Episode.to_trace
    monkeypatch.setattr(loop.Episode, "to_trace", lambda ep, settings: _with_meta(to_trace(ep, settings), odd=object()))
    cfg = _cfg(tmp_path, shared_data / "mbpp/mbpp.jsonl", "mbpp", limit=2, episode=EpisodeConfig(max_turns=1))
    run_collect(cfg, generator=ScriptedGenerator({"": ["<solution>\nx\n</solution>"]}), tokenizer=build_tiny_tokenizer("chatml"))
    rejects = [json.loads(line) for line in (tmp_path / "traces.rejects.jsonl").read_text().splitlines()]
    assert [(r["task_id"], r["sample"]) for r in rejects] == [("1", 0), ("2", 0)]
    assert all("cannot be written as JSON (TypeError" in r["error"] for r in rejects)
    assert set(finished_pairs(collect_files(tmp_path))) == {("1", 0), ("2", 0)}  # counted as done: a resume does not replay them
    assert "2 episodes of this run have no trace" in caplog.text


def _with_meta(trace, **extra):
    trace.meta.update(extra)
    return trace


def test_rerun_skips_finished_pairs_and_adds_new_samples(tmp_path, shared_data):
    scripts = {"": ["<solution>\nx\n</solution>"]}
    cfg = _cfg(tmp_path, shared_data / "mbpp/mbpp.jsonl", "mbpp", limit=2, episode=EpisodeConfig(max_turns=1))
    tok = build_tiny_tokenizer("chatml")
    run_collect(cfg, generator=ScriptedGenerator(scripts), tokenizer=tok)
    gen = ScriptedGenerator(scripts)
    run_collect(cfg, generator=gen, tokenizer=tok)
    assert gen.calls == []  # nothing left to do
    run_collect(dataclasses.replace(cfg, sampling=dataclasses.replace(cfg.sampling, n=2)), generator=gen,
                tokenizer=tok)
    keys = [(t.meta["task_id"], t.meta["sample"]) for t in _traces(tmp_path / "traces.jsonl")]
    assert sorted(keys) == sorted({(k, s) for k, _ in keys for s in (0, 1)})
    assert len(keys) == 4


def test_resume_with_other_settings_is_refused(tmp_path, shared_data):
    cfg = _cfg(tmp_path, shared_data / "mbpp/mbpp.jsonl", "mbpp", limit=1, episode=EpisodeConfig(max_turns=1))
    run_collect(cfg, generator=ScriptedGenerator({"": ["<solution>\nx\n</solution>"]}), tokenizer=build_tiny_tokenizer("chatml"))
    assert (tmp_path / "config.yaml").exists()
    with pytest.raises(MolrlError, match="was made with other settings: episode.max_turns was 1, now 3"):
        run_collect(dataclasses.replace(cfg, episode=EpisodeConfig(max_turns=3)))


def test_torn_final_line_is_set_aside_and_collected_again(tmp_path):
    out = tmp_path / "traces.jsonl"
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
            "meta": {"task_id": "a", "sample": 0, "success": False, "turns": 1}}
    out.write_text(json.dumps(good) + "\n" + json.dumps(dict(good, meta={"task_id": "b", "sample": 0}))[:40])
    assert finished_pairs(collect_files(tmp_path)) == {("a", 0): (False, 1)}
    assert out.read_text() == json.dumps(good) + "\n"
    assert (tmp_path / "traces.jsonl.torn").read_text().startswith('{"messages"')


def test_kill_9_then_resume_loses_and_duplicates_nothing(tmp_path, shared_data):
    out = tmp_path / "traces.jsonl"
    args = [sys.executable, "-m", "molrl.cli", "collect", "--model", "tiny:chatml", "--format", "mbpp",
            "--tasks", str(shared_data / "mbpp/mbpp.jsonl"), "--out", str(tmp_path), "--limit", "12", "--max-turns", "1",
            "sampling.temperature=1", "sampling.max_new_tokens=8", "episode.batch_size=2",
            "sandbox.workers=1", "progress=false"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not out.exists() or len(out.read_bytes().splitlines()) < 4):
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    before = [(t.meta["task_id"], t.meta["sample"]) for t in _traces(out)]
    assert 4 <= len(before) < 12, "the kill should land mid-collection"
    assert cli.main(args[3:]) == 0  # the same command again, resumed (in this process: no second start-up)
    after = [(t.meta["task_id"], t.meta["sample"]) for t in _traces(out)]
    assert after[: len(before)] == before
    assert len(after) == len(set(after))
    assert len(finished_pairs(collect_files(tmp_path))) == 12  # traces plus episodes without a valid trace (rejects file)


def test_a_second_writer_of_the_same_file_is_refused(tmp_path, shared_data):
    import fcntl

    cfg = _cfg(tmp_path, shared_data / "mbpp/mbpp.jsonl", "mbpp", limit=1)
    with open(tmp_path / ".lock", "w") as held:  # the output folder's lock, as a run of any stage holds it
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(MolrlError, match=rf"{tmp_path} is being written by another run \(pid unknown\)"):
            run_collect(cfg)


def test_a_run_made_before_as_one_trace_file_resumes_where_it_lies(tmp_path, shared_data, caplog):
    """A run saved when collect wrote ``out: X.jsonl`` with ``X.jsonl.config.yaml`` beside it: the same config (its
    out read as output_dir X) finds it finished, and more samples go on in the same file."""
    import yaml

    from molrl.config import load_config

    scripts, tok = {"": ["<solution>\nx\n</solution>"]}, build_tiny_tokenizer("chatml")
    made = _cfg(tmp_path / "made", shared_data / "mbpp/mbpp.jsonl", "mbpp", limit=2, episode=EpisodeConfig(max_turns=1))
    run_collect(made, generator=ScriptedGenerator(scripts), tokenizer=tok)
    old = tmp_path / "old.jsonl"
    (tmp_path / "made" / "traces.jsonl").rename(old)
    saved = yaml.safe_load((tmp_path / "made" / "config.yaml").read_text())
    data = saved.pop("data")
    saved.update(out=str(old), tasks=data["path"], format=data["format"], jsonl=data["spec"], split=data["split"],
                 limit=data["limit"])
    del saved["output_dir"]
    (tmp_path / "old.jsonl.config.yaml").write_text(yaml.safe_dump(saved))
    before = old.read_text()
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump({k: v for k, v in saved.items() if k != "model"} | {"model": "tiny:chatml"}))
    cfg = load_config(CollectConfig, again)
    assert cfg.output_dir == tmp_path / "old"
    caplog.set_level("INFO")
    gen = ScriptedGenerator(scripts)
    assert run_collect(cfg, generator=gen, tokenizer=tok) == old and gen.calls == [] and old.read_text() == before
    assert "resuming it where it lies" in caplog.text
    run_collect(dataclasses.replace(cfg, sampling=dataclasses.replace(cfg.sampling, n=2)), generator=gen,
                tokenizer=tok)
    assert len(old.read_text().splitlines()) == 4 and not (tmp_path / "old").exists()


class _LookupTableGenerator:
    """Submits ``return None``, then a table of the expected values the feedback showed (finding 3's attack)."""

    def generate(self, prompts, sampling):
        import re

        out = []
        for prompt in prompts:
            name = re.search(r"function `(\w+)`", prompt).group(1)
            shown = re.findall(r"^- \w+\((.*)\) returned None, expected (.*)$", prompt, re.M)
            rows = [f"    if args == ({args},):\n        return {expected}" for args, expected in shown]
            out.append([f"<solution>\ndef {name}(*args):\n" + "\n".join(rows) + "\n    return None\n</solution>"])
        return out


def test_finding3_collect_success_is_the_held_back_verdict_and_success_only_drops_a_lookup_table(tmp_path, shared_data):
    cfg = _cfg(tmp_path, shared_data / "humaneval/HumanEval.jsonl.gz", "humaneval", limit=20,
               episode=EpisodeConfig(), thinking=False)
    run_collect(cfg, generator=_LookupTableGenerator(), tokenizer=build_tiny_tokenizer("chatml"))
    traces = [t for t in _traces(tmp_path / "traces.jsonl") if t.meta["held_back"]]
    assert len(traces) >= 15 and sum(t.meta["verdict"] is True for t in traces) >= 5  # shown tests "solved"...
    assert [t.meta["success"] for t in traces] == [False] * len(traces)  # ...the held-back ones never
    kept = tmp_path / "kept.jsonl"
    assert cli.main(["traces", "filter", str(tmp_path / "traces.jsonl"), str(kept), "--success-only"]) == 0
    assert all(not t.meta["held_back"] for _, t in read_traces(kept))  # only one-test tasks, flagged, may remain
