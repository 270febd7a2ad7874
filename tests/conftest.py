"""Shared fixtures: tiny in-process models, and the real data that sits beside the checkout."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)
# every stage's thread policy (molrl.cpu.use_threads) fixes one thread too: the same float sums on every run
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("MOLRL_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real benchmark, trace and tokenizer files (MOLRL_SHARED_DATA, default ../shared/data)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data not found at {SHARED_DATA}; set MOLRL_SHARED_DATA")
    return SHARED_DATA


@pytest.fixture(scope="session")
def qwen3_tokenizer(shared_data):
    """The real Qwen3 tokenizer with its chat template."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(shared_data / "qwen3_tokenizer"))


@pytest.fixture
def tiny_pair():
    """A fresh tiny Qwen3 model and byte-level ChatML tokenizer."""
    from molrl.tiny import build_tiny_pair

    return build_tiny_pair("chatml")


@pytest.fixture
def cli_logs(monkeypatch):
    """Keep pytest's log capture under ``molrl.cli.main``, which otherwise installs its own handlers."""
    monkeypatch.setattr("molrl.cli.setup_logging", lambda verbose=False: None)
