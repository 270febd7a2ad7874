"""A lone surrogate (``"\\ud800"`` in JSON) is a bad line in every reader of user JSON lines.

No tokenizer and no UTF-8 file takes a lone surrogate. Before, ``traces stats``, ``mol`` and ``rl`` died in
the tokenizer with a TypeError and no file:line, and ``traces filter`` / ``traces convert --from openai``
copied the line into their output. ``molrl.records.jsonl.Line.json`` now rejects such a record, wherever the
surrogate sits (a key or a value, at any depth), and each command treats it as it treats any bad line.

A conversation given through the library is held to the same rule: ``Trace.validate`` refuses it, and every
encoder (``tokenize_trace``, ``encode_chat``, ``chat_prompt``, ``tokenize_tail``) names it on every tokenizer, where
before they passed it to the tokenizer and died with a TypeError.

The class is enumerated four ways: every string position of a record (unit), every message given to every encoder
on every tokenizer (library), every command that reads user JSON lines (CLI), and the source itself (every ``json.loads`` outside ``molrl.records.jsonl`` is listed with
why it reads no user records, so a new reader cannot bypass the check).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

import pytest

from molrl.cli import main
from molrl.errors import DataError
from molrl.records.jsonl import json_line, read_lines
from molrl.tasks import load_tasks
from molrl.tiny import build_tiny_tokenizer

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "configs/data/mol_tiny_traces.jsonl"

pytestmark = pytest.mark.usefixtures("cli_logs")


def string_positions(value: Any, where: str = "") -> Iterator[tuple[str, bool]]:
    """(path, is_key) of every key and every string value in a parsed record."""
    if isinstance(value, str):
        yield where, False
    elif isinstance(value, dict):
        for key, inner in value.items():
            yield f"{where}.{key}" if where else key, True
            yield from string_positions(inner, f"{where}.{key}" if where else key)
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from string_positions(inner, f"{where}[{index}]")


def inject(value: Any, target: str, is_key: bool, char: str, where: str = "") -> Any:
    """``value`` with ``char`` appended to the key or string value at path ``target``."""
    if isinstance(value, str):
        return value + char if where == target and not is_key else value
    if isinstance(value, dict):
        out = {}
        for key, inner in value.items():
            path = f"{where}.{key}" if where else key
            out[key + char if is_key and path == target else key] = inject(inner, target, is_key, char, path)
        return out
    if isinstance(value, list):
        return [inject(inner, target, is_key, char, f"{where}[{i}]") for i, inner in enumerate(value)]
    return value


def with_surrogate(line: str, char: str = "\ud800") -> str:
    """``line`` with a lone surrogate appended to its last string value (``json.dumps`` writes ``\\ud800``)."""
    record = json.loads(line)
    positions = [p for p, is_key in string_positions(record) if not is_key]
    return json.dumps(inject(record, positions[-1], False, char))


def write_lines(path: Path, lines: list[str], bad: int) -> Path:
    """``lines`` with a lone surrogate in line ``bad`` (1-based)."""
    lines = list(lines)
    lines[bad - 1] = with_surrogate(lines[bad - 1])
    path.write_text("\n".join(lines) + "\n")
    return path


def one_line_error(capsys, caplog, path: Path, line: int) -> str:
    """The text the user saw; asserts it names file:line, the lone surrogate and the fix, and no traceback."""
    captured = capsys.readouterr()
    seen = captured.out + captured.err + caplog.text
    assert re.search(rf"{re.escape(str(path))}:{line}: lone surrogate U\+D800 in \S+ at character \d+; fix the file",
                     seen), seen
    assert "Traceback" not in seen and "TypeError" not in seen
    return seen


# ------------------------------------------------------------------------------------------ the reader


def test_finding_12_lone_surrogate_in_every_key_and_value_is_a_bad_line(tmp_path):
    record = json.loads(TRACES.read_text().splitlines()[0])
    positions = list(string_positions(record))
    assert len(positions) > 10 and any(k for _, k in positions) and any("[" in p for p, _ in positions)
    for char in ("\ud800", "\udbff", "\udc00", "\udfff"):
        for target, is_key in positions:
            path = tmp_path / "t.jsonl"
            path.write_text(json.dumps(inject(record, target, is_key, char)) + "\n")
            (line,) = read_lines(path)
            with pytest.raises(DataError) as err:
                line.json()
            where = f"a key of {target.rpartition('.')[0] or 'the record'}" if is_key else target
            assert err.value.line == 1
            assert f"lone surrogate U+{ord(char):04X} in {where} at character" in err.value.message


@pytest.mark.parametrize("text", ["\U0001F600", "\\ud800", "plain", "caf\u00e9"])
def test_finding_12_text_that_is_not_a_lone_surrogate_reads_back(tmp_path, text):
    # a surrogate pair is one character; an escaped backslash before "ud800" is six characters of text
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"content": text}) + "\n" + json.dumps({"content": text}, ensure_ascii=False) + "\n")
    assert [line.json() for line in read_lines(path)] == [{"content": text}] * 2


def test_finding_12_written_surrogates_read_back_as_visible_text(tmp_path):
    # what a program printed (chr(0xD800)) is written so that the reader takes it, as the text \ud800
    path = tmp_path / "t.jsonl"
    path.write_text(json_line({"out": "a\ud800b", "pair": "\ud83d\ude00"}) + "\n")
    (line,) = read_lines(path)
    assert line.json() == {"out": "a\\ud800b", "pair": "\\ud83d\\ude00"}


# ------------------------------------------------------------------------------------------ task files


def _task_lines(shared_data, fmt: str) -> tuple[Path, list[str]]:
    import gzip

    path = {"mbpp": shared_data / "mbpp/mbpp.jsonl", "humaneval": shared_data / "humaneval/HumanEval.jsonl.gz",
            "math500": shared_data / "math500/test.jsonl", "aime": shared_data / "aime24/test.jsonl"}[fmt]
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return path, [next(handle).rstrip("\n") for _ in range(3)]


@pytest.mark.parametrize("fmt", ["mbpp", "humaneval", "math500", "aime", "jsonl"])
def test_finding_12_task_file_with_a_lone_surrogate_names_its_line(shared_data, tmp_path, fmt):
    if fmt == "jsonl":
        lines = [json.dumps({"id": str(i), "prompt": f"What is {i}+1?", "answer": str(i + 1)}) for i in range(3)]
    else:
        lines = _task_lines(shared_data, fmt)[1]
    clean = tmp_path / "ok.jsonl"
    clean.write_text("\n".join(lines) + "\n")
    assert len(load_tasks(clean, fmt)) == 3
    path = write_lines(tmp_path / "tasks.jsonl", lines, 2)
    with pytest.raises(DataError) as err:
        load_tasks(path, fmt)
    assert str(err.value).startswith(f"{path}:2: lone surrogate U+D800 in ")


# ------------------------------------------------------------------------------------------ every command


def test_finding_12_traces_stats(tmp_path, capsys, caplog):
    tok = tmp_path / "tok"
    build_tiny_tokenizer("chatml").save_pretrained(tok)
    path = write_lines(tmp_path / "traces.jsonl", TRACES.read_text().splitlines(), 3)
    code = main(["traces", "stats", str(path), "--tokenizer", str(tok), "--json", str(tmp_path / "s.json")])
    one_line_error(capsys, caplog, path, 3)
    counts = json.loads((tmp_path / "s.json").read_text())[0]
    assert code == 0 and (counts["traces"], counts["rejects"]) == (7, 1)


def test_finding_12_traces_show_skips_the_bad_line(tmp_path, capsys, caplog):
    tok = tmp_path / "tok"
    build_tiny_tokenizer("chatml").save_pretrained(tok)
    path = write_lines(tmp_path / "traces.jsonl", TRACES.read_text().splitlines(), 1)
    code = main(["traces", "show", str(path), "--tokenizer", str(tok), "--index", "0",
                 "--html", str(tmp_path / "t.html")])
    seen = one_line_error(capsys, caplog, path, 1)
    assert code == 0 and f"{path}:2: " in seen  # index 0 is the first valid trace, on line 2


def test_finding_12_traces_filter_keeps_the_line_out_of_its_output(tmp_path, capsys, caplog):
    path = write_lines(tmp_path / "traces.jsonl", TRACES.read_text().splitlines(), 2)
    out = tmp_path / "out.jsonl"
    code = main(["traces", "filter", str(path), str(out)])
    one_line_error(capsys, caplog, path, 2)
    assert code == 0 and len(out.read_text().splitlines()) == 7
    assert "\\ud800" not in out.read_text()
    (reject,) = [json.loads(line) for line in Path(f"{out}.rejects.jsonl").read_text().splitlines()]
    assert reject["line"] == 2 and "lone surrogate" in reject["error"]


@pytest.mark.parametrize("fmt", ["openai", "mint", "tora"])
def test_finding_12_traces_convert_keeps_the_line_out_of_its_output(shared_data, tmp_path, capsys, caplog, fmt):
    if fmt == "openai":
        lines = TRACES.read_text().splitlines()
    elif fmt == "mint":
        source = shared_data / "traces/mint/gpt-3.5-turbo-0613_F_gpt-4-0613_PHF_no_GT-textual__mbpp.jsonl"
        lines = source.read_text().splitlines()[:3]
    else:
        lines = [json.dumps({"question": f"What is {i}+1?", "gt": str(i + 1), "code": [
            f"```python\nprint({i}+1)\n```\n```output\n{i + 1}\n```\nThe answer is \\boxed{{{i + 1}}}."]})
            for i in range(3)]
    name = "gpt-3.5-turbo-0613_F_gpt-4-0613_PHF_no_GT-textual__mbpp.jsonl" if fmt == "mint" else "in.jsonl"
    path = write_lines(tmp_path / name, lines, 2)
    out = tmp_path / "out.jsonl"
    code = main(["traces", "convert", "--from", fmt, str(path), str(out)])
    one_line_error(capsys, caplog, path, 2)
    assert code == 0 and len(out.read_text().splitlines()) == len(lines) - 1
    assert "\\ud800" not in out.read_text()


def test_finding_12_mol(tmp_path, capsys, caplog):
    path = write_lines(tmp_path / "traces.jsonl", TRACES.read_text().splitlines(), 4)
    code = main(["mol", "--config", str(REPO / "configs/mol_tiny.yaml"), f"output_dir={tmp_path / 'run'}",
                 f"data.traces=[{path}]", "train.max_steps=1", "train.report_to=[none]"])
    one_line_error(capsys, caplog, path, 4)
    assert code == 1


def test_finding_12_rl_task_file(shared_data, tmp_path, capsys, caplog):
    path = write_lines(tmp_path / "mbpp.jsonl", _task_lines(shared_data, "mbpp")[1], 2)
    code = main(["rl", "--config", str(REPO / "configs/rl_tiny.yaml"), f"output_dir={tmp_path / 'run'}",
                 f"data.path={path}", "data.format=mbpp", "train.max_steps=1", "train.report_to=[none]"])
    one_line_error(capsys, caplog, path, 2)
    assert code == 1


def test_finding_12_eval_task_file(shared_data, tmp_path, capsys, caplog):
    path = write_lines(tmp_path / "aime.jsonl", _task_lines(shared_data, "aime")[1], 3)
    preds = tmp_path / "p.jsonl"
    preds.write_text("".join(json.dumps({"id": json.loads(line)["id"], "completion": "1"}) + "\n"
                             for line in _task_lines(shared_data, "aime")[1]))
    code = main(["eval", "--benchmarks", "aime24", "--data", f"aime24={path}", "--predictions", str(preds),
                 "--out", str(tmp_path / "run")])
    one_line_error(capsys, caplog, path, 3)
    assert code == 1


def test_finding_12_eval_predictions(shared_data, tmp_path, capsys, caplog):
    data = shared_data / "aime24/test.jsonl"
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    lines = [json.dumps({"id": r["id"], "completion": f"\\boxed{{{r['answer']}}}"}) for r in rows]
    path = write_lines(tmp_path / "preds.jsonl", lines, 5)
    code = main(["eval", "--benchmarks", "aime24", "--data", f"aime24={data}", "--predictions", str(path),
                 "--out", str(tmp_path / "run")])
    one_line_error(capsys, caplog, path, 5)
    assert code == 1


# ------------------------------------------------------------------------------------------ the library

SURROGATES = ("\ud800", "\udbff", "\udc00", "\udfff")
"""The ends of the high and low surrogate ranges."""


def _messages(at: int, char: str) -> list[dict[str, str]]:
    """A trace's messages (system, user, assistant, tool, assistant) with ``char`` inside message ``at``."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "print(2+2)"}, {"role": "tool", "content": "Output: 4"},
                {"role": "assistant", "content": "The answer is 4."}]
    messages[at] = {**messages[at], "content": messages[at]["content"][:2] + char + messages[at]["content"][2:]}
    return messages


def _encoders():
    """Every way a conversation given through the library becomes token ids, by name."""
    from molrl.traces.schema import Trace
    from molrl.traces.spans import chat_prompt, encode_chat, tokenize_tail
    from molrl.traces.tokenize import tokenize_trace

    return {"tokenize_trace": lambda tok, m: tokenize_trace(Trace(messages=m), tok),
            "encode_chat": lambda tok, m: encode_chat(tok, m[:4]),
            "chat_prompt": lambda tok, m: chat_prompt(tok, m[:4]),
            "tokenize_tail": lambda tok, m: tokenize_tail(tok, m, 2, add_generation_prompt=True)}


def _tokenizers(shared_data_dir: Path) -> dict[str, Any]:
    tokenizers = {name: build_tiny_tokenizer(name) for name in ("chatml", "llama3")}
    qwen3 = shared_data_dir / "qwen3_tokenizer"
    if qwen3.is_dir():
        from transformers import AutoTokenizer

        tokenizers["qwen3"] = AutoTokenizer.from_pretrained(str(qwen3))
    return tokenizers


def test_finding_12_trace_validate_refuses_a_lone_surrogate_in_every_message_as_the_readers_do():
    from molrl.traces.schema import Trace, TraceError

    for char in SURROGATES:
        for at in range(5):
            with pytest.raises(TraceError) as err:
                Trace(messages=_messages(at, char)).validate()
            assert str(err.value).startswith(f"lone surrogate U+{ord(char):04X} in messages[{at}].content at character 3; ")


def test_finding_12_every_encoder_names_a_lone_surrogate_on_every_tokenizer():
    from molrl.traces.schema import TraceError
    from tests.conftest import SHARED_DATA

    tokenizers = _tokenizers(SHARED_DATA)
    for tok_name, tok in tokenizers.items():
        for name, encode in _encoders().items():
            encode(tok, _messages(0, ""))  # the same messages without the surrogate encode
            for at in (1, 3):  # the user's task, the tool's feedback: read by every encoder
                for char in SURROGATES:
                    with pytest.raises(TraceError, match=rf"^lone surrogate U\+{ord(char):04X} in messages\[{at}\]"
                                                         r"\.content at character 3; a lone surrogate is not text"):
                        encode(tok, _messages(at, char))
    assert {"chatml", "llama3"} <= set(tokenizers)


# ------------------------------------------------------------------------------------------ the source

OTHER_JSON_READS = {
    "sandbox/runtime/worker.py": "the job pipe from the parent process",
    "sandbox/runtime/task.py": "the job pipe from the parent process",
    "sandbox/slot.py": "the worker's result pipe",
    "sandbox/remote/harness.py": "a run_code server's reply: the harness's result line",
    "sandbox/remote/client.py": "a sandbox server's reply, checked by molrl.sandbox.remote.protocol before it is read",
    "sandbox/remote/server.py": "a request to the sandbox server, checked job by job (protocol.job_error)",
    "sandbox/remote/harness_program.py": "the job on the harness's stdin, its embedded runtime, its judge's verdicts",
    "sandbox/remote/harness_child.py": "the job message from the harness",
    "graders/math_worker.py": "the grading worker's pipe",
    "episode/critique.py": "an HTTP reply from the critique endpoint",
    "content.py": "a tokenizer's own serialisation",
    "task_types.py": "a task serialised by Task.to_json for a dataset column",
    "report.py": "results.json / stage markers / env.json this program wrote",
    "eval/report.py": "results.json this program wrote",
    "records/rerun.py": "trainer_state.json that transformers wrote",
    "rl/rollouts/partial.py": "the rollout state this program wrote",
    "engines/export.py": "adapter_config.json that peft wrote",
    "engines/adapters.py": "adapter_config.json that peft wrote",
    "models.py": "a model folder's config.json / adapter_config.json",
    "pipeline/__init__.py": "stage markers this program wrote",
    "demo/chain_measure.py": "world properties this program wrote",
    "demo/base.py": "a demo base's marker this program wrote (made_before, the one reading of them)",
    "study/headline.py": "forgetting.json this program wrote",
    "rl/adapter_lora.py": "adapter_config.json that peft wrote",
    "records/provenance.py": "a provenance record this program is about to write, checked by the reader's schema",
    "records/provenance_schema.py": "molrl_provenance.json / trained_on.json, read within bounds (a malformed one: one line)",
    "eval/run.py": "results.json this program wrote",
    "commands/serve.py": "the model folder's config.json (its dtype)",
    "engines/server/client.py": "a vLLM server's HTTP replies",
    "engines/server/policy.py": "merged_from.json this program wrote beside a merged base",
    "mol/base_cache.py": "the base-target cache's key.json / manifest.json this program wrote",
}
"""Modules that parse JSON other than user records, each with what it parses."""


def test_finding_12_every_json_parse_of_user_records_goes_through_the_one_reader():
    src = REPO / "src/molrl"
    parsing = {str(p.relative_to(src)) for p in src.rglob("*.py")
               if re.search(r"\bjson\.loads?\(", p.read_text()) and p.name != "jsonl.py"}
    assert parsing - set(OTHER_JSON_READS) == set(), "read user JSON lines with molrl.records.jsonl.read_lines"
    assert set(OTHER_JSON_READS) - parsing == set(), "an entry for a module that parses no JSON any more"
