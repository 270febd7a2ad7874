"""The shared JSON-lines reader: compression by magic bytes, byte-order marks, bad bytes, torn tails."""

from __future__ import annotations

import bz2
import gzip
import json

import pytest

from molrl.errors import DataError, MolrlError
from molrl.records.jsonl import read_lines, read_records, repair_torn_tail

RECORDS = [{"id": 1, "text": "caf\u00e9 \u2028 line"}, {"id": 2, "text": "x"}]
PLAIN = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in RECORDS).encode("utf-8")


def _records(path) -> list:
    return [line.json() for line in read_lines(path)]


@pytest.mark.parametrize("compress", [gzip.compress, bz2.compress], ids=["gzip", "bzip2"])
def test_compressed_file_is_read_whatever_its_name(tmp_path, compress):
    path = tmp_path / "data.jsonl"  # no .gz: only the magic bytes tell
    path.write_bytes(compress(PLAIN))
    assert _records(path) == RECORDS


def test_byte_order_mark_is_skipped(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + PLAIN + b"\xef\xbb\xbf" + b'{"id": 3}\n')  # also where files were joined
    assert _records(path) == RECORDS + [{"id": 3}]


def test_separator_inside_a_string_does_not_split_the_record(tmp_path):
    path = tmp_path / "sep.jsonl"
    path.write_bytes(PLAIN)
    assert [line.number for line in read_lines(path)] == [1, 2]  # U+2028 in record 1 is not a line end


def test_invalid_utf8_names_line_and_column_and_says_what_to_do(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(PLAIN + '{"id": 3, "text": "café"}\n'.encode("latin-1"))
    with pytest.raises(DataError) as err:
        _records(path)
    assert str(err.value) == (f"{path}:3: not UTF-8 text (byte 0xe9 at column 23); save the file as UTF-8 "
                              "(e.g. iconv -f latin1 -t utf-8 IN > OUT) or fix the line")


def test_zstd_file_is_refused_with_the_fix(tmp_path):
    path = tmp_path / "z.jsonl"
    path.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 16)
    with pytest.raises(MolrlError, match=r"z.jsonl: is zstd-compressed: zstd -d it and pass the .jsonl file inside"):
        _records(path)


def test_gzip_cut_short_is_one_error_naming_the_file(tmp_path):
    path = tmp_path / "cut.jsonl"
    path.write_bytes(gzip.compress(PLAIN * 50)[:-30])
    with pytest.raises(DataError, match=r"cut.jsonl:\d+: the compressed data is damaged or cut short"):
        _records(path)


def test_read_records_drops_a_torn_last_line_with_a_warning(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(PLAIN + b'{"step": 3, "lo')
    assert read_records(path) == RECORDS
    assert f"{path}:3: skipping the last line, cut off mid-write" in caplog.text


def test_read_records_drops_a_last_line_torn_inside_a_utf8_character(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(PLAIN + '{"text": "é'.encode("utf-8")[:-1])
    assert read_records(path) == RECORDS


def test_read_records_refuses_a_torn_line_in_the_middle(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(DataError, match=rf"^{path}:2: malformed JSON .*; fix or delete the line$"):
        read_records(path)


def test_repair_torn_tail_sets_the_line_aside(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_bytes(PLAIN + b'{"id": 3, "te')
    repair_torn_tail(path)
    assert path.read_bytes() == PLAIN
    assert (tmp_path / "log.jsonl.torn").read_bytes() == b'{"id": 3, "te\n'
