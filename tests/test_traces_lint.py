"""``molrl traces lint`` and ``traces filter --drop-model-feedback``: decision turns that write the environment's reply
themselves after their action, found, counted per file, and left out on request."""

from __future__ import annotations

import json
import logging

import pytest

from molrl.cli import main
from molrl.traces import read_traces
from molrl.traces.lint import lint_file, model_feedback, trace_model_feedback

ACTION = "<thought> Run it. </thought>\n<execute>\nprint(f(2))\n</execute>"


@pytest.fixture(autouse=True)
def keep_pytest_log_capture(monkeypatch):
    """The CLI installs its own log handlers; keep pytest's so caplog sees its lines."""
    monkeypatch.setattr("molrl.cli.setup_logging", lambda verbose=False: None)


@pytest.mark.parametrize("after, label", [
    ("\n\nObservation:\n[Executed Successfully with Output]\n\nAssistant:\n<solution>x</solution>",
     "Observation:"),  # Llama-3-70B's
    ("\n\nOutput:\n4\n", "Output:"),  # CodeActAgent's
    ("\nobservation :\n4", "observation :"),  # any case, a space before the colon
    ("\nObservation\uff1a4", "Observation\uff1a"),  # full-width colon
    ("\n  Expert feedback:\nlooks right", "Expert feedback:"),  # MINT's feedback label, indented
    ("\nError:\nNameError", "Error:"),  # molrl's own feedback label
    ("\n```output\n4\n```", "```output"),  # ToRA's output block
])
def test_a_turn_that_writes_the_environments_label_after_its_action_is_found(after, label):
    text = ACTION + after
    offset, found = model_feedback(text)
    assert found == label and text[offset:].lstrip(" \t").startswith(label)
    assert text[offset - 1] == "\n"  # where the line opens


@pytest.mark.parametrize("text", [
    ACTION,  # stops after its action: the environment answers
    ACTION + "\nThe output should be 4.",  # prose after it, not a label
    "<thought> Output: a list of ints. </thought>\n" + ACTION,  # the label before the action is the model's reasoning
    "Observation: I need a loop.\nI will answer without running anything.",  # no action at all
    ACTION.replace("</execute>", "") + "\nObservation:\n4",  # an action never closed is no action
    ACTION + "\nMy observation: it prints 4",  # the word inside a line, not opening it
])
def test_a_turn_without_the_environments_voice_after_an_action_is_not(text):
    assert model_feedback(text) is None


def test_only_decision_turns_are_read():
    messages = [{"role": "user", "content": ACTION + "\nObservation:\n1"},
                {"role": "assistant", "content": ACTION},
                {"role": "tool", "content": "Observation:\n4"},
                {"role": "assistant", "content": ACTION + "\nObservation:\n4"}]
    assert [(hit.message, hit.label) for hit in trace_model_feedback(messages)] == [(3, "Observation:")]


def _trace(*turns: str) -> dict:
    messages = [{"role": "user", "content": "Task: write f"}]
    for turn in turns:
        messages += [{"role": "assistant", "content": turn}, {"role": "tool", "content": "Observation:\nok"}]
    return {"messages": messages, "meta": {"success": True}}


def _write(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_lint_counts_turns_and_traces_per_file(tmp_path, caplog):
    _write(tmp_path / "a.jsonl", [_trace(ACTION + "\nObservation:\n4", ACTION + "\nOutput:\n4"), _trace(ACTION)])
    _write(tmp_path / "b.jsonl", [_trace(ACTION)])
    counts = lint_file(tmp_path / "a.jsonl")
    assert (counts.traces, counts.decision_turns, counts.model_feedback_turns, counts.model_feedback_traces) == \
        (2, 3, 2, 1)
    assert counts.examples[0] == (f"{tmp_path / 'a.jsonl'}:1: message 1 (assistant) writes 'Observation:' at "
                                  f"character {len(ACTION) + 2}, after its action")
    with caplog.at_level(logging.INFO):
        assert main(["traces", "lint", str(tmp_path)]) == 0
    assert f"{tmp_path / 'a.jsonl'}:1: message 1 (assistant) writes 'Observation:'" in caplog.text
    assert "... and 1 more such turns" in caplog.text and "--drop-model-feedback" in caplog.text


def test_filter_says_how_many_and_drops_them_on_request(tmp_path, caplog):
    src = tmp_path / "in.jsonl"
    _write(src, [_trace(ACTION + "\nObservation:\n4"), _trace(ACTION), _trace(ACTION), {"messages": [
        {"role": "user", "content": "t"}, {"role": "assistant", "content": ACTION + "\nObservation:\n4"}]}])
    with caplog.at_level(logging.INFO):
        assert main(["traces", "filter", str(src), str(tmp_path / "kept.jsonl"), "--min-feedback-turns", "1"]) == 0
    # counted among the 3 traces the other filters keep (the one without feedback is not among them)
    assert "model-written feedback: 1 of 3 traces have a decision turn" in caplog.text
    assert len(list(read_traces(tmp_path / "kept.jsonl"))) == 3
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert main(["traces", "filter", str(src), str(tmp_path / "dropped.jsonl"), "--min-feedback-turns", "1",
                     "--drop-model-feedback"]) == 0
    assert "1 model-written feedback" in caplog.text and "; left out (--drop-model-feedback)" in caplog.text
    assert [t.messages[1]["content"] for _, t in read_traces(tmp_path / "dropped.jsonl")] == [ACTION, ACTION]


def test_mint_traces_counts(shared_data, tmp_path):
    # the shared MINT files as `traces convert` writes them: Llama-3-70B writes `Observation:` and CodeActAgent
    # `Output:` after its <execute> block, with output it made up; GPT-4 and GPT-3.5 never do
    out = tmp_path / "traces"
    assert main(["traces", "convert", "--from", "mint", str(shared_data / "traces/mint"), str(out)]) == 0
    counts = {path.name.split("_F_")[0] + "/" + path.stem.split("__")[1]: lint_file(path)
              for path in sorted(out.glob("*.jsonl"))}
    turns = {name: (c.model_feedback_turns, c.decision_turns, c.model_feedback_traces, c.traces)
             for name, c in counts.items() if c.model_feedback_turns}
    assert turns == {"CodeActAgent-Mistral-7b-v0.1/humaneval": (60, 118, 31, 45),
                     "CodeActAgent-Mistral-7b-v0.1/mbpp": (34, 365, 18, 91),
                     "Meta-Llama-3-70B-Instruct/humaneval": (53, 118, 45, 45),
                     "Meta-Llama-3-70B-Instruct/math": (78, 365, 72, 100),
                     "Meta-Llama-3-70B-Instruct/mbpp": (105, 322, 89, 91)}
    assert sum(c.traces for c in counts.values()) == 944
