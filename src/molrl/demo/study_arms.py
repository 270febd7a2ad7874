"""The study's arms (``molrl demo --study``): the runs each claim compares, by name, and their sizes."""

from __future__ import annotations

SOURCES = {"own": "", "expert": "-expert"}
"""Trace sources and the suffix of their MoL run names."""
LOSSES = ("mol", "ce", "ce_feedback")
"""The MoL loss ablation."""
EPOCHS = {"0": "base", "1": "mol_1ep", "3": "mol", "demo": "mol_demo"}
"""MoL lengths (epochs, or the demo's own step count) and the run each GRPO run starts from."""
ALGORITHMS = {"grpo": "mol_demo+grpo", "dr_grpo": "mol_demo+dr_grpo"}
"""GRPO vs Dr.GRPO: the runs compared."""
REWARDS = {"staged": "mol_demo+grpo_code_staged", "binary": "mol_demo+grpo_code_binary"}
"""Code reward modes (``reward.code_mode``) and their GRPO runs on the code-answer problems."""
REWARD_START = "mol_demo"
"""The MoL run both reward runs start from."""
CODE = "code"
"""The held-out code-answer benchmark's name."""
CODE_TOKENS = 64
"""Most tokens of a code answer (the statement, then ``def solve(): return 274`` in a fence: up to 59)."""
