"""Typed configs: YAML + dotted overrides, with errors that name the key and the file."""

from dataclasses import dataclass, field
from typing import Literal

import pytest

from molrl.config import ConfigError, describe, load_config, save_config


@dataclass
class Lora:
    rank: int = 64
    """LoRA rank."""
    dropout: float = 0.0
    """Dropout on the adapter input."""


@dataclass
class Stage:
    mode: Literal["mol", "ce"] = "mol"
    """Loss mode."""
    lr: float = 1e-4
    """Learning rate."""
    tags: list[str] = field(default_factory=list)
    """Free-form tags."""
    out: str | None = None
    """Output directory."""
    lora: Lora = field(default_factory=Lora)
    """Adapter settings."""


def test_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("mode: ce\nlora:\n  rank: 8\n")
    cfg = load_config(Stage, path, ["lora.dropout=0.1", "lr=3e-5", "tags=a,b"])
    assert (cfg.mode, cfg.lora.rank, cfg.lora.dropout, cfg.lr, cfg.tags) == ("ce", 8, 0.1, 3e-5, ["a", "b"])


def test_unknown_key_names_key_and_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("lora:\n  rnak: 8\n")
    with pytest.raises(ConfigError, match=r"c\.yaml.*unknown key 'lora\.rnak'"):
        load_config(Stage, path)


def test_an_unknown_key_that_lives_inside_a_section_names_it():
    with pytest.raises(ConfigError, match=r"unknown key 'rank'; did you mean 'lora\.rank'\?; known keys in <top>"):
        load_config(Stage, None, ["rank=8"])
    with pytest.raises(ConfigError, match=r"unknown key 'rnak'; known keys"):
        load_config(Stage, None, ["rnak=8"])


def test_wrong_type_names_key(tmp_path):
    with pytest.raises(ConfigError, match="lora.rank must be an integer"):
        load_config(Stage, None, ["lora.rank=big"])
    with pytest.raises(ConfigError, match="mode='sft'; expected one of"):
        load_config(Stage, None, ["mode=sft"])


def test_round_trip(tmp_path):
    cfg = load_config(Stage, None, ["out=runs/x", "lora.rank=4"])
    save_config(cfg, tmp_path / "resolved.yaml")
    assert load_config(Stage, tmp_path / "resolved.yaml") == cfg


def test_describe_lists_field_docs():
    lines = describe(Stage)
    assert "lora.rank: 64  # LoRA rank." in lines


def test_describe_prints_whole_help():
    from molrl.rl.config import RlConfig

    from molrl.config import field_docs

    lines = describe(RlConfig)
    first, second, *rest = field_docs(RlConfig)["engine"].splitlines()  # a doc of several lines
    at = next(i for i, line in enumerate(lines) if line.startswith("engine: 'auto'  # "))
    assert lines[at] == f"engine: 'auto'  # {first}"
    # the doc's second line (before: dropped) goes on under the key it belongs to
    assert lines[at + 1] == f"    # {second}" and rest and lines[at + 2] == f"    # {rest[0]}"


def _renamed_keys() -> list[tuple[str, str, str, str]]:
    """(stage, old key, new key, a value its conversion takes) of every ``RENAMED_KEYS`` entry of every config class a stage reaches (sections,
    and the entries of a mapping of sections, entered), dotted from the stage's top; ``*`` written out as ``qa``."""
    import dataclasses
    import typing

    from molrl.collect.config import CollectConfig
    from molrl.config.renames import unoptional
    from molrl.eval.config import EvalConfig
    from molrl.mol.config import MolConfig
    from molrl.pipeline.config import PipelineConfig
    from molrl.rl.config import RlConfig

    found = []

    def walk(stage: str, cls: type, prefix: str) -> None:
        for old, (new, convert) in getattr(cls, "RENAMED_KEYS", {}).items():
            value = next(text for text, v in (("400", 400), ("x-old", "x-old"), ("x-old.jsonl", "x-old.jsonl"))
                         if _converts(convert, v))
            found.append((stage, prefix + old.replace("*", "qa"), prefix + new.replace("*", "qa"), value))
        for name, tp in typing.get_type_hints(cls).items():
            tp = unoptional(tp)
            if typing.get_origin(tp) is dict:  # eval's data.NAME: an entry named qa
                tp, name = typing.get_args(tp)[-1], f"{name}.qa"
            if dataclasses.is_dataclass(tp):
                walk(stage, tp, f"{prefix}{name}.")

    for stage, cls in {"mol": MolConfig, "rl": RlConfig, "eval": EvalConfig, "collect": CollectConfig,
                       "pipeline": PipelineConfig}.items():
        walk(stage, cls, "")
    return found


def _converts(convert, value) -> bool:
    try:
        convert(value)
    except (TypeError, ValueError):
        return False
    return True


def test_every_renamed_key_given_under_both_names_on_the_command_line_is_refused(cli_logs, caplog):
    from molrl.cli import main

    pairs = _renamed_keys()
    assert {("rl", "policy.base", "model.path"), ("rl", "use_vllm", "engine"), ("pipeline", "grpo", "rl"),
            ("eval", "custom.qa", "data.qa.spec"), ("collect", "tasks", "data.path")} <= {p[:3] for p in pairs}
    for stage, old, new, value in pairs:
        for first, second in ((f"{old}={value}", f"{new}=w-other"), (f"{new}=w-other", f"{old}={value}")):
            caplog.clear()
            assert main([stage, first, second]) == 1, (first, second)
            assert [r.getMessage() for r in caplog.records] == [
                f"command-line overrides: {old} is the old name of {new} and both are set; keep {new}"], (first, second)


def test_an_old_and_a_new_name_with_one_value_on_the_command_line_are_read_once():
    from molrl.rl.config import RlConfig

    assert load_config(RlConfig, None, ["use_vllm=true", "engine=vllm"]).engine == "vllm"
    assert load_config(RlConfig, None, ["model.path=tiny:chatml", "policy.base=tiny:chatml"]).model.path == "tiny:chatml"
