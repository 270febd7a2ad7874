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

    lines = describe(RlConfig)
    at = next(i for i, line in enumerate(lines) if line.startswith("algorithm: 'dr_grpo'  # grpo: "))
    # the doc's second line (before: dropped) names the other two algorithms, under the key it belongs to
    assert lines[at + 1].startswith("    # opd: on-policy distillation") and "ppo: a learned critic" in lines[at + 1]
    assert lines[at + 2].startswith("opd.")
