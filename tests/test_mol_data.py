"""MoL data: the domain:general sampler, the collator, and traces read through the real tokeniser."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from molrl.errors import DataError
from molrl.mol.data import MolCollator, RatioSampler, load_examples

REPO = Path(__file__).resolve().parents[1]


def test_sampler_holds_domain_general_ratio_in_every_window():
    is_general = [False] * 12 + [True] * 5
    order = list(RatioSampler(is_general, ratio=(2, 1), seed=3))
    # One epoch = every domain example once, plus 12 * 1/2 = 6 general draws (5 general examples cycled).
    assert len(order) == 18
    assert Counter(i for i in order if i < 12) == Counter(range(12))
    kinds = ["g" if is_general[i] else "d" for i in order]
    for start in range(0, 18, 3):  # each run of 3 holds 2 domain and 1 general
        assert kinds[start: start + 3].count("g") == 1


def test_sampler_order_depends_only_on_seed_and_epoch():
    is_general = [False] * 10 + [True] * 3
    a, b = RatioSampler(is_general, seed=1), RatioSampler(is_general, seed=1)
    assert list(a) == list(b)
    b.set_epoch(1)
    assert list(a) != list(b)
    assert list(RatioSampler(is_general, seed=2)) != list(a)


def test_sampler_without_general_examples_is_a_permutation():
    order = list(RatioSampler([False] * 7, ratio=(1, 1), seed=0))
    assert sorted(order) == list(range(7))


def test_collator_right_pads_and_masks_padding():
    batch = MolCollator(pad_token_id=9)([
        {"input_ids": [1, 2, 3], "feedback_mask": [0, 1, 0], "decision_mask": [0, 0, 1], "is_general": False},
        {"input_ids": [4], "feedback_mask": [0], "decision_mask": [1], "is_general": True},
    ])
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 9, 9]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["decision_mask"].tolist() == [[0, 0, 1], [1, 0, 0]]
    assert batch["is_general"].tolist() == [False, True]


def test_load_examples_counts_traces_without_feedback(tmp_path):
    from molrl.tiny import build_tiny_tokenizer

    path = tmp_path / "t.jsonl"
    lines = (REPO / "configs/data/mol_tiny_traces.jsonl").read_text().splitlines()[:2]
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    extra = [{"messages": chat, "meta": {"kind": "domain"}}, {"messages": chat, "meta": {"kind": "general"}}]
    path.write_text("\n".join(lines + [json.dumps(e) for e in extra]) + "\n")
    examples, stats = load_examples([str(path)], build_tiny_tokenizer("chatml"), max_length=4096)
    # Kept and counted: the domain trace without tool messages adds nothing to the CE term.
    assert (stats.traces, stats.general, stats.without_feedback, stats.without_decision) == (4, 1, 1, 0)
    assert [ex["is_general"] for ex in examples] == [False, False, False, True]


def test_load_examples_names_file_and_line_of_a_bad_record(tmp_path):
    from molrl.tiny import build_tiny_tokenizer

    path = tmp_path / "bad.jsonl"
    good = (REPO / "configs/data/mol_tiny_traces.jsonl").read_text().splitlines()[0]
    path.write_text(good + "\n{not json\n")
    with pytest.raises(DataError, match=r"bad\.jsonl:2"):
        load_examples([str(path)], build_tiny_tokenizer("chatml"), max_length=4096)


def test_real_qwen3_tokenizer_labels_shipped_traces(qwen3_tokenizer):
    examples, stats = load_examples([str(REPO / "configs/data/mol_tiny_traces.jsonl")], qwen3_tokenizer, 4096)
    assert stats.traces == 8 and stats.without_feedback == 0 and stats.without_decision == 0
    ex = examples[0]
    feedback_text = qwen3_tokenizer.decode([t for t, m in zip(ex["input_ids"], ex["feedback_mask"]) if m])
    assert feedback_text.strip() == "Observation:\n5"



def _tool_integrated_record(i: int) -> dict:
    """A whole tool-integrated completion kept as one assistant message: no tool message at all."""
    text = f"Let me compute.\n```python\nprint({i} + 1)\n```\n```output\n{i + 1}\n```\nThe answer is {i + 1}."
    return {"messages": [{"role": "user", "content": f"What is {i} + 1?"}, {"role": "assistant", "content": text}]}


def test_mol_refuses_traces_without_any_feedback_token_before_training(tmp_path, caplog):
    from molrl.errors import MolrlError
    from molrl.mol.config import MolConfig
    from molrl.mol.run import run_mol

    path = tmp_path / "tora.jsonl"
    path.write_text("".join(json.dumps(_tool_integrated_record(i)) + "\n" for i in range(4)))
    cfg = MolConfig(model="tiny:chatml", output_dir=tmp_path / "run")
    cfg.data.traces = [str(path)]
    with pytest.raises(MolrlError, match=r"tora\.jsonl: none of the 4 domain traces has a feedback token, so "
                                         r"loss\.mode=mol has nothing to learn .* --from tora"):
        run_mol(cfg)
    assert f"{path}: none of its 4 domain traces has a feedback token" in caplog.text  # the per-file warning
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "run/metrics.jsonl").exists()


def test_empty_trace_file_among_others_is_a_warning_naming_it(tmp_path, caplog):
    from molrl.tiny import build_tiny_tokenizer

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    shipped = str(REPO / "configs/data/mol_tiny_traces.jsonl")
    _, stats = load_examples([shipped, str(empty)], build_tiny_tokenizer("chatml"), max_length=4096)
    assert stats.traces == 8
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [f"{empty}: no trace records (the file is empty or blank); check the path, or re-run the "
                        "step that writes it"]


def test_huge_trace_line_is_cut_at_max_length_with_a_warning(tmp_path, caplog):
    from molrl.tiny import build_tiny_tokenizer

    record = json.loads((REPO / "configs/data/mol_tiny_traces.jsonl").read_text().splitlines()[0])
    tool = next(m for m in record["messages"] if m["role"] == "tool")
    tool["content"] += "\n" + "x = [1, 2, 3]  # runaway output\n" * 200_000  # a 6 MB line
    path = tmp_path / "huge.jsonl"
    path.write_text(json.dumps(record) + "\n")
    examples, stats = load_examples([str(path)], build_tiny_tokenizer("chatml"), max_length=512)
    assert len(examples[0]["input_ids"]) == 512 and stats.truncated == 1
    assert f"{path}:1: truncated at 512 tokens inside feedback message" in caplog.text
