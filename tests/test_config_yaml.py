"""Config text is read by YAML 1.2's core schema, with its depth and size bounded (``molrl.config.yaml_io``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from molrl.cli import main
from molrl.config import load_config, to_dict
from molrl.config.yaml_io import MAX_YAML_DEPTH, MAX_YAML_NODES, parse_yaml

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("text,value", [
    ("1:30", "1:30"),  # YAML 1.1: the base-60 number 90
    ("-1:30:00", "-1:30:00"),
    ("1:30.5", "1:30.5"),
    ("yes", "yes"), ("no", "no"), ("on", "on"), ("off", "off"), ("y", "y"), ("n", "n"), ("Yes", "Yes"),  # 1.1 bools
    ("010", 10),  # 1.1: octal 8
    ("0o17", 15), ("0x1f", 31),
    ("1_000", "1_000"),  # 1.1: 1000
    ("2024-01-01", "2024-01-01"),  # 1.1: a date
    ("1e-4", 1e-4),  # 1.1: a string
    ("true", True), ("False", False), ("~", None), ("null", None), ("1.5", 1.5), ("-3", -3), (".inf", float("inf")),
])
def test_plain_scalars_resolve_by_the_yaml_1_2_core_schema(text, value):
    assert parse_yaml(f"key: {text}", "t.yaml") == {"key": value}


def test_a_base_60_number_in_a_file_is_refused_not_read_as_90(tmp_path, cli_logs, caplog):
    config = tmp_path / "run.yaml"
    config.write_text("train:\n  max_steps: 1:30\n")
    assert main(["mol", "--config", str(config)]) == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"{config}: train.max_steps must be an integer, got '1:30'; allowed: an integer in [1, 1000000000] or -1"]


@pytest.mark.parametrize("value", ["yes", "no", "on", "off"])
def test_a_yaml_1_1_boolean_word_is_refused_by_a_boolean_key(cli_logs, caplog, value):
    assert main(["mol", f"lora.enabled={value}"]) == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"defaults + command-line overrides: lora.enabled must be true or false, got '{value}'"]


@pytest.mark.parametrize("text", ["train:\n  seed: " + "[" * 5000 + "]" * 5000, "train: " + "{a: " * 5000 + "1" + "}" * 5000,
                                  "".join(" " * i + "a:\n" for i in range(500))])  # blocks: 500 deep in 125 KB
def test_yaml_nested_5000_deep_is_one_line_naming_the_file_and_the_limit(tmp_path, cli_logs, caplog, text):
    config = tmp_path / "deep.yaml"
    config.write_text(text)
    assert main(["mol", "--config", str(config)]) == 1
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith(f"{config}:") and f"deeper than {MAX_YAML_DEPTH} levels" in lines[0]


def test_an_override_nested_5000_deep_is_one_line(cli_logs, caplog):
    assert main(["mol", "train.seed=" + "[" * 5000 + "]" * 5000]) == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"override train.seed=...:1: nested deeper than {MAX_YAML_DEPTH} levels; a config is a few levels deep"]


def test_aliases_that_expand_past_the_size_limit_are_one_line(tmp_path, cli_logs, caplog):
    """Ten aliases of ten, seven times over: 10**8 values once expanded, from a file of 300 bytes."""
    config = tmp_path / "laughs.yaml"
    config.write_text("a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{new}: &{new} [{', '.join(['*' + old] * 10)}]\n" for old, new in zip("abcdefg", "bcdefgh")))
    assert main(["mol", "--config", str(config)]) == 1
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith(f"{config}:") and f"more than {MAX_YAML_NODES} values" in lines[0]


def test_an_override_of_over_a_mebibyte_is_one_line(cli_logs, caplog):
    assert main(["mol", "output_dir=" + "x" * ((1 << 20) + 1)]) == 1
    assert [r.getMessage() for r in caplog.records] == [
        "override output_dir=...: over 1 MiB of text; a config is a small YAML document"]


def test_merge_keys_still_merge_and_an_explicit_key_overrides_them():
    assert parse_yaml("base: &b {seed: 1, rank: 4}\nrun:\n  <<: *b\n  seed: 2\n", "t.yaml")["run"] == {
        "seed": 2, "rank": 4}


def _stage_class(name: str) -> type:
    from molrl.collect.config import CollectConfig
    from molrl.eval.config import EvalConfig
    from molrl.mol.config import MolConfig
    from molrl.pipeline.config import PipelineConfig
    from molrl.rl.config import RlConfig

    stages = {"pipeline": PipelineConfig, "mol": MolConfig, "rl": RlConfig, "eval": EvalConfig,
              "collect": CollectConfig}
    return next(cls for stage, cls in stages.items() if name.startswith(stage))


def _yaml_1_1(text: str, name: str):
    """How configs were read before: PyYAML's safe loader (YAML 1.1 resolvers)."""
    return yaml.load(text, Loader=yaml.SafeLoader)


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_resolves_as_it_did_under_yaml_1_1(path, monkeypatch):
    cls = _stage_class(path.name)
    required = ["model=tiny:chatml", "data.path=tasks.jsonl"] if path.name.startswith("collect") else []
    now = to_dict(load_config(cls, path, required))
    monkeypatch.setattr("molrl.config.parse_yaml", _yaml_1_1)
    assert now == to_dict(load_config(cls, path, required))


def test_the_old_reading_of_the_same_values_differs(monkeypatch, tmp_path):
    """The comparison above can fail: under YAML 1.1 this file resolves to other values."""
    from molrl.mol.config import MolConfig

    config = tmp_path / "mol.yaml"
    config.write_text("train:\n  seed: 010\n")
    now = load_config(MolConfig, config).train.seed
    monkeypatch.setattr("molrl.config.parse_yaml", _yaml_1_1)
    assert (now, load_config(MolConfig, config).train.seed) == (10, 8)
