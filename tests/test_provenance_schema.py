"""A provenance record arrives from outside (a copy, a download, a hand edit) and is read against a bounded schema
(``molrl.records.provenance_schema``): every malformed shape is one line naming the file, where in the record, and the fix;
never a traceback, never a record read as "trained on nothing"."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from molrl.errors import MolrlError
from molrl.records.provenance import LEGACY, PROVENANCE, Provenance, TrainedTask, read_provenance, write_provenance
from molrl.records import provenance_schema as schema

KEY = "0123456789abcdef"
GOOD = {"base": {"model": "tiny:chatml", "path": "/m", "fingerprint": "f" * 64},
        "lineage": [{"stage": "mol", "config": "c" * 64, "date": "2026-01-01T00:00:00+00:00"}],
        "tasks": [{"benchmark": "humaneval", "split": "test", "id": "HumanEval/0", "key": KEY}],
        "keys": [KEY], "texts": {KEY: ["solve this task. def has_close_elements(numbers, threshold)"]}}
"""A record with one value at every place the schema names."""

FIELD_PATHS = {
    "base": ("base",), "base.model": ("base", "model"), "base.path": ("base", "path"),
    "base.fingerprint": ("base", "fingerprint"), "lineage": ("lineage",), "lineage[0]": ("lineage", 0),
    "lineage[0].stage": ("lineage", 0, "stage"), "lineage[0].config": ("lineage", 0, "config"),
    "lineage[0].date": ("lineage", 0, "date"), "tasks": ("tasks",), "tasks[0]": ("tasks", 0),
    "tasks[0].benchmark": ("tasks", 0, "benchmark"), "tasks[0].split": ("tasks", 0, "split"),
    "tasks[0].id": ("tasks", 0, "id"), "tasks[0].key": ("tasks", 0, "key"), "keys": ("keys",),
    "keys[0]": ("keys", 0), "texts": ("texts",), f"texts[{KEY}]": ("texts", KEY),
    f"texts[{KEY}][0]": ("texts", KEY, 0),
}
"""Every place of the schema, by the name an error gives it."""
ALLOWED = {"base": {"object"}, "lineage": {"list"}, "lineage[0]": {"object"}, "tasks": {"list"},
           "tasks[0]": {"object"}, "tasks[0].split": {"string", "null"}, "tasks[0].key": {"null"}, "keys": {"list"},
           "texts": {"object"}, f"texts[{KEY}]": {"list"}}
"""The JSON types each place takes (a string elsewhere; a key's or stage's string must also be a valid one)."""
VALUES: dict[str, Any] = {"null": None, "boolean": True, "number": 7, "string": "MOL", "list": [], "object": {}}


def _write(folder: Path, content: str | bytes, name: str = PROVENANCE) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
    return path


def _refused(folder: Path, path: Path, why: str) -> str:
    with pytest.raises(MolrlError) as err:
        read_provenance(folder)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{path}: "), message
    assert why in message, message
    return message


def _replaced(where: tuple, value: Any) -> dict:
    data = copy.deepcopy(GOOD)
    target = data
    for step in where[:-1]:
        target = target[step]
    target[where[-1]] = value
    return data


def test_the_good_record_reads_and_the_places_cover_the_schema(tmp_path):
    _write(tmp_path, json.dumps(GOOD))
    record = read_provenance(tmp_path)
    assert record.tasks == [TrainedTask("humaneval", "test", "HumanEval/0", KEY)] and record.texts == GOOD["texts"]
    named = {part for name in FIELD_PATHS for part in re.findall(r"[a-z]+", name)}
    assert set(schema.FIELDS + schema.BASE_FIELDS + schema.STEP_FIELDS + schema.TASK_FIELDS) <= named


WRONG_TYPES = [(name, kind) for name in FIELD_PATHS for kind in VALUES
               if kind not in ALLOWED.get(name, {"string"}) and not (name == "tasks[0].key" and kind == "string")]


@pytest.mark.parametrize("name,kind", WRONG_TYPES, ids=[f"{n}={k}" for n, k in WRONG_TYPES])
def test_a_wrong_type_at_any_place_is_one_line_naming_it(name, kind, tmp_path):
    path = _write(tmp_path, json.dumps(_replaced(FIELD_PATHS[name], VALUES[kind])))
    _refused(tmp_path, path, f"{name} is ")


MALFORMED = {
    "deep nesting": ("[" * 100_000, "nested deeper than a JSON parser follows"),
    "deep nesting in a field": (json.dumps({**GOOD, "keys": [[[[[[KEY]]]]]]}), "keys[0] is a list"),
    "a list at the top": (json.dumps([GOOD]), "the file is a list; expected an object"),
    "a string at the top": (json.dumps("mol"), "the file is a string"),
    "null at the top": ("null", "the file is null"),
    "a number at the top": ("3", "the file is a number"),
    "empty file": ("", "not JSON"),
    "cut short": (json.dumps(GOOD)[:-9], "not JSON"),
    "two records": (json.dumps(GOOD) + json.dumps(GOOD), "not JSON"),
    "not UTF-8": (json.dumps(GOOD).encode().replace(b"tiny", b"t\xffny"), "not UTF-8 (byte"),
    "UTF-16": (json.dumps(GOOD).encode("utf-16"), "not UTF-8"),
    "a byte-order mark": (b"\xef\xbb\xbf" + json.dumps(GOOD).encode(), "not JSON"),
    "NaN": (json.dumps(GOOD).replace('"tiny:chatml"', "NaN"), "NaN is not a number a record holds"),
    "Infinity": (json.dumps(GOOD).replace('"tiny:chatml"', "-Infinity"), "-Infinity is not a number"),
    "a key twice": ('{"keys": [], ' + json.dumps(GOOD)[1:], "the key 'keys' appears twice"),
    "a lone surrogate": (json.dumps(GOOD).replace("tiny:chatml", "tiny\\ud800"), "base.model holds a lone surrogate"),
    "a huge number": (json.dumps(GOOD).replace('"HumanEval/0"', "9" * 5000), "not JSON"),
    "an unknown field": (json.dumps({**GOOD, "trained": True}), "the file has the field 'trained'"),
    "an unknown base field": (json.dumps(_replaced(("base", "commit"), "x")), "base has the field 'commit'"),
    "an unknown step field": (json.dumps(_replaced(("lineage", 0, "seed"), 1)), "lineage[0] has the field 'seed'"),
    "an unknown stage": (json.dumps(_replaced(("lineage", 0, "stage"), "MOL")), "lineage[0].stage is 'MOL'"),
    "a key not 16 hex digits": (json.dumps(_replaced(("keys", 0), "HumanEval/0")), "keys[0] is 'HumanEval/0'"),
    "a text key not a key": (json.dumps(_replaced(("texts",), {"k": []})), "texts key 'k'"),
    "a name too long": (json.dumps(_replaced(("base", "model"), "m" * 5000)), "base.model is 5000 characters"),
    "a text too long": (json.dumps(_replaced(("texts", KEY, 0), "t" * (schema.MAX_TEXT + 1))),
                        f"is {schema.MAX_TEXT + 1} characters"),
    **{f"no {name}": (json.dumps({k: v for k, v in GOOD.items() if k != name}), f"has no '{name}' field")
       for name in schema.FIELDS[:-1]},
    **{f"no lineage[0].{name}": (json.dumps({**GOOD, "lineage": [{k: v for k, v in GOOD["lineage"][0].items()
                                                                     if k != name}]}), f"has no '{name}' field")
       for name in schema.STEP_FIELDS},
    **{f"no tasks[0].{name}": (json.dumps({**GOOD, "tasks": [{k: v for k, v in GOOD["tasks"][0].items()
                                                                 if k != name}]}), f"has no '{name}' field")
       for name in ("benchmark", "id")},
}
"""Every malformed shape besides a wrong type: (file content, what the line says)."""


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_record_is_one_line_naming_the_file_and_the_fix(case, tmp_path):
    content, why = MALFORMED[case]
    message = _refused(tmp_path, _write(tmp_path, content), why)
    assert message.endswith("or delete it to treat the weights as unknown")


def test_a_record_over_the_size_bound_is_refused_unread(tmp_path):
    path = tmp_path / PROVENANCE
    with path.open("wb") as handle:  # sparse: the bound is checked before the bytes are parsed
        handle.truncate(schema.MAX_BYTES + 1)
    _refused(tmp_path, path, f"larger than {schema.MAX_BYTES >> 20} MiB")


def test_a_record_without_texts_reads_as_one_made_before_them(tmp_path):
    _write(tmp_path, json.dumps({k: v for k, v in GOOD.items() if k != "texts"}))
    assert read_provenance(tmp_path).texts == {}


LEGACY_MALFORMED = {
    "deep nesting": ('{"benchmarks": ' * 50_000, "nested deeper"),
    "benchmarks a list": (json.dumps({"benchmarks": ["mbpp"]}), "benchmarks is a list"),
    "ids a string": (json.dumps({"benchmarks": {"mbpp": {"test": "11"}}}), "benchmarks.mbpp.test is a string"),
    "an id a list": (json.dumps({"benchmarks": {"mbpp": {"test": [["11"]]}}}), "benchmarks.mbpp.test[0] is a list"),
    "an id a boolean": (json.dumps({"benchmarks": {"mbpp": {"test": [True]}}}), "is true (a boolean)"),
    "a split null": (json.dumps({"benchmarks": {"mbpp": None}}), "benchmarks.mbpp is null"),
    "not UTF-8": (b'{"benchmarks": {"\xff": {}}}', "not UTF-8"),
    "no benchmarks": ("{}", "has no 'benchmarks' field"),
}


@pytest.mark.parametrize("case", sorted(LEGACY_MALFORMED))
def test_a_malformed_trained_on_json_is_one_line(case, tmp_path):
    content, why = LEGACY_MALFORMED[case]
    path = _write(tmp_path, content, LEGACY)
    (tmp_path / "adapter").mkdir()
    with pytest.raises(MolrlError) as err:
        read_provenance(tmp_path / "adapter")
    assert str(err.value).startswith(f"{path}: not a trained_on record (") and why in str(err.value)


def test_what_is_written_is_what_the_reader_takes_texts_cut_to_the_bound(tmp_path):
    from molrl.records.provenance import made

    record = made("mol", "c", "tiny:chatml", [], [TrainedTask("mbpp", "test", "11", KEY)], [KEY],
                  {KEY: ["x" * (schema.MAX_TEXT + 5), "y"]})
    write_provenance(tmp_path, record)
    assert read_provenance(tmp_path).texts == {KEY: ["x" * schema.MAX_TEXT, "y"]}


def test_a_record_past_the_size_bound_is_refused_before_it_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr("molrl.records.provenance.MAX_BYTES", 1000)
    record = Provenance(lineage=GOOD["lineage"], keys=[KEY], texts={KEY: ["t" * 2000]})
    with pytest.raises(MolrlError, match=rf"^{tmp_path / PROVENANCE}: the record of what these weights trained on "
                                         r"cannot be written: the keys and texts of 1 tasks take 2,\d+ bytes, over "
                                         r"the 1,000 a record holds; train on fewer distinct tasks per run$"):
        write_provenance(tmp_path, record)
    assert not (tmp_path / PROVENANCE).exists()


def test_a_record_the_reader_would_refuse_is_never_written(tmp_path):
    record = Provenance(base={"model": "m\ud800"}, lineage=GOOD["lineage"])
    with pytest.raises(MolrlError, match=rf"^{tmp_path / PROVENANCE}: the record of what these weights trained on "
                                         r"would not read back \(base.model holds a lone surrogate, which no text "
                                         r"file holds\); fix the input it names and run again$"):
        write_provenance(tmp_path, record)
    assert not (tmp_path / PROVENANCE).exists()


def test_an_unknown_lineage_stage_is_never_made():
    from molrl.records.provenance import step_record

    with pytest.raises(ValueError, match="lineage stage 'sft' is not one of mol, rl, export, gguf, trained"):
        step_record("sft", "c")


@pytest.mark.parametrize("content", ["[" * 100_000, json.dumps({**GOOD, "lineage": "mol"}),
                                     json.dumps(_replaced(("tasks", 0, "key"), ["a"]))],
                         ids=["100000 [", "lineage a string", "a key a list"])
def test_eval_on_a_malformed_record_exits_with_one_line(content, tmp_path, shared_data, capsys):
    """The three shapes once a RecursionError, an AttributeError and a TypeError traceback."""
    from molrl.cli import main

    path = _write(tmp_path / "adapter", content)
    rc = main(["eval", "--model", "tiny:chatml", "--adapter", str(tmp_path / "adapter"), "--benchmarks", "humaneval",
               "--data", f"humaneval={shared_data / 'humaneval/HumanEval.jsonl.gz'}", "--limit", "1",
               "--out", str(tmp_path / "eval")])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    (line,) = [line for line in err.splitlines() if str(path) in line]
    assert "not a molrl provenance record (" in line
