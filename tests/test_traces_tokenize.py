"""Role masks on hand-written traces, for the real Qwen3 template and a tiny Llama-3-style one.

Each expected mask is written out by hand as runs of (role, text): T template, P prompt,
D decision, F feedback. Comparing runs is an exact per-token check: token boundaries come from
the tokenizer alone, so two labelings with equal runs have equal masks.
"""

from __future__ import annotations

import pytest

from molrl.tiny import build_tiny_tokenizer
from molrl.traces import TokenizeConfig, Trace, TraceError, tokenize_trace

LETTER = {"template": "T", "prompt": "P", "decision": "D", "feedback": "F"}

THINKING = Trace([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Add 2 and 3."},
    {"role": "assistant", "content": "<think>\nUse python.\n</think>\n\n<execute>print(2+3)</execute>"},
    {"role": "tool", "content": "Observation:\n5"},
    {"role": "assistant", "content": "<think>\nIt printed 5.\n</think>\n\nThe answer is <solution>5</solution>"},
])

PLAIN = Trace([
    {"role": "user", "content": "Add 2 and 3."},
    {"role": "assistant", "content": "<execute>print(2+3)</execute>"},
    {"role": "tool", "content": "Observation:\n5"},
    {"role": "assistant", "content": "The answer is <solution>5</solution>"},
])

# A second user query makes Qwen3 drop the <think> block of the first assistant turn.
DROPPED_THINK = Trace([
    {"role": "user", "content": "Q1"},
    {"role": "assistant", "content": "<think>\nR1\n</think>\n\nA1"},
    {"role": "tool", "content": "obs"},
    {"role": "user", "content": "Q2"},
    {"role": "assistant", "content": "<think>\nR2\n</think>\n\nA2"},
])


def runs(tokenized, tokenizer) -> list[tuple[str, str]]:
    """Consecutive tokens with the same role, decoded: [(letter, text), ...]."""
    out: list[tuple[str, list[int]]] = []
    for tok, role in zip(tokenized.input_ids, tokenized.roles()):
        if out and out[-1][0] == LETTER[role]:
            out[-1][1].append(tok)
        else:
            out.append((LETTER[role], [tok]))
    return [(letter, tokenizer.decode(ids, skip_special_tokens=False)) for letter, ids in out]


@pytest.fixture(scope="module")
def llama3_tokenizer():
    return build_tiny_tokenizer("llama3")


def test_qwen3_thinking_trace_masks(qwen3_tokenizer):
    got = runs(tokenize_trace(THINKING, qwen3_tokenizer), qwen3_tokenizer)
    assert got == [
        ("T", "<|im_start|>system\n"),
        ("P", "You are terse."),
        ("T", "<|im_end|>\n<|im_start|>user\n"),
        ("P", "Add 2 and 3."),
        ("T", "<|im_end|>\n<|im_start|>assistant\n"),
        ("D", "<think>\nUse python.\n</think>\n\n<execute>print(2+3)</execute><|im_end|>"),
        ("T", "\n<|im_start|>user\n<tool_response>\n"),
        ("F", "Observation:\n5"),
        ("T", "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"),
        ("D", "<think>\nIt printed 5.\n</think>\n\nThe answer is <solution>5</solution><|im_end|>"),
        ("T", "\n"),
    ]


def test_qwen3_plain_trace_empty_think_is_template(qwen3_tokenizer):
    # Qwen3 inserts an empty think block into the last assistant turn; by default it is template.
    got = runs(tokenize_trace(PLAIN, qwen3_tokenizer), qwen3_tokenizer)
    assert got == [
        ("T", "<|im_start|>user\n"),
        ("P", "Add 2 and 3."),
        ("T", "<|im_end|>\n<|im_start|>assistant\n"),
        ("D", "<execute>print(2+3)</execute><|im_end|>"),
        ("T", "\n<|im_start|>user\n<tool_response>\n"),
        ("F", "Observation:\n5"),
        ("T", "\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        ("D", "The answer is <solution>5</solution><|im_end|>"),
        ("T", "\n"),
    ]


def test_qwen3_empty_think_as_decision_when_asked(qwen3_tokenizer):
    cfg = TokenizeConfig(empty_think_is_decision=True)
    got = runs(tokenize_trace(PLAIN, qwen3_tokenizer, cfg), qwen3_tokenizer)
    assert got[-3:] == [
        ("T", "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"),
        ("D", "<think>\n\n</think>\n\nThe answer is <solution>5</solution><|im_end|>"),
        ("T", "\n"),
    ]


def test_qwen3_thinking_off_labels_full_trace_identically(qwen3_tokenizer):
    # enable_thinking only changes Qwen3's generation prompt, which a full trace does not use.
    on = tokenize_trace(PLAIN, qwen3_tokenizer, TokenizeConfig(enable_thinking=True))
    off = tokenize_trace(PLAIN, qwen3_tokenizer, TokenizeConfig(enable_thinking=False))
    assert (off.input_ids, off.decision_mask, off.feedback_mask) == (on.input_ids, on.decision_mask, on.feedback_mask)


def test_qwen3_dropped_think_of_earlier_turn(qwen3_tokenizer):
    got = runs(tokenize_trace(DROPPED_THINK, qwen3_tokenizer), qwen3_tokenizer)
    assert got == [
        ("T", "<|im_start|>user\n"),
        ("P", "Q1"),
        ("T", "<|im_end|>\n<|im_start|>assistant\n"),
        ("D", "A1<|im_end|>"),  # "<think>\nR1\n</think>" is not in the rendering at all
        ("T", "\n<|im_start|>user\n<tool_response>\n"),
        ("F", "obs"),
        ("T", "\n</tool_response><|im_end|>\n<|im_start|>user\n"),
        ("P", "Q2"),
        ("T", "<|im_end|>\n<|im_start|>assistant\n"),
        ("D", "<think>\nR2\n</think>\n\nA2<|im_end|>"),
        ("T", "\n"),
    ]


def test_qwen3_per_token_masks_and_labels(qwen3_tokenizer):
    trace = Trace([
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "ok"},
        {"role": "tool", "content": "done"},
        {"role": "assistant", "content": "bye"},
    ])
    tok = tokenize_trace(trace, qwen3_tokenizer)
    pieces = [qwen3_tokenizer.decode([i]) for i in tok.input_ids]
    assert list(zip(pieces, "".join(LETTER[r] for r in tok.roles()))) == [
        ("<|im_start|>", "T"), ("user", "T"), ("\n", "T"), ("hi", "P"), ("<|im_end|>", "T"), ("\n", "T"),
        ("<|im_start|>", "T"), ("assistant", "T"), ("\n", "T"), ("ok", "D"), ("<|im_end|>", "D"), ("\n", "T"),
        ("<|im_start|>", "T"), ("user", "T"), ("\n", "T"), ("<tool_response>", "T"), ("\n", "T"), ("done", "F"),
        ("\n", "T"), ("</tool_response>", "T"), ("<|im_end|>", "T"), ("\n", "T"),
        ("<|im_start|>", "T"), ("assistant", "T"), ("\n", "T"), ("<think>", "T"), ("\n\n", "T"), ("</think>", "T"),
        ("\n\n", "T"), ("bye", "D"), ("<|im_end|>", "D"), ("\n", "T"),
    ]
    trained = [i for i, d, f in zip(tok.input_ids, tok.decision_mask, tok.feedback_mask) if d or f]
    assert [x for x in tok.labels if x != -100] == trained
    assert tok.labels.count(-100) == len(pieces) - 5  # ok, <|im_end|>, done, bye, <|im_end|>


def test_llama3_thinking_trace_masks(llama3_tokenizer):
    got = runs(tokenize_trace(THINKING, llama3_tokenizer), llama3_tokenizer)
    assert got == [
        ("T", "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"),
        ("P", "You are terse."),
        ("T", "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"),
        ("P", "Add 2 and 3."),
        ("T", "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"),
        ("D", "<think>\nUse python.\n</think>\n\n<execute>print(2+3)</execute><|eot_id|>"),
        ("T", "<|start_header_id|>ipython<|end_header_id|>\n\n"),
        ("F", "Observation:\n5"),
        ("T", "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"),
        ("D", "<think>\nIt printed 5.\n</think>\n\nThe answer is <solution>5</solution><|eot_id|>"),
    ]


def test_llama3_plain_trace_masks_with_trimmed_content(llama3_tokenizer):
    # The Llama-3 template trims contents: surrounding whitespace is not part of any message.
    trace = Trace([
        {"role": "user", "content": "  Add 2 and 3.\n"},
        {"role": "assistant", "content": "<execute>print(2+3)</execute>\n"},
        {"role": "tool", "content": "\nObservation:\n5\n"},
        {"role": "assistant", "content": "The answer is <solution>5</solution>"},
    ])
    got = runs(tokenize_trace(trace, llama3_tokenizer, TokenizeConfig(enable_thinking=False)), llama3_tokenizer)
    assert got == [
        ("T", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"),
        ("P", "Add 2 and 3."),
        ("T", "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"),
        ("D", "<execute>print(2+3)</execute><|eot_id|>"),
        ("T", "<|start_header_id|>ipython<|end_header_id|>\n\n"),
        ("F", "Observation:\n5"),
        ("T", "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"),
        ("D", "The answer is <solution>5</solution><|eot_id|>"),
    ]


def test_llama3_token_counts(llama3_tokenizer):
    # Byte-level: one token per byte of message text, one per special token.
    tok = tokenize_trace(PLAIN, llama3_tokenizer)
    # decision: "<execute>print(2+3)</execute>" 29 + eot 1; "The answer is <solution>5</solution>" 36 + eot 1
    assert (tok.n_decision, tok.n_feedback, tok.n_prompt) == (29 + 1 + 36 + 1, len("Observation:\n5"), len("Add 2 and 3."))
    assert tok.n_tokens == tok.n_decision + tok.n_feedback + tok.n_prompt + tok.n_template


def test_trailing_whitespace_before_end_of_turn_is_decision(qwen3_tokenizer):
    # Qwen3 keeps assistant content verbatim: the model wrote "ok\n" and then <|im_end|>.
    trace = Trace([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok\n"},
                   {"role": "tool", "content": "x"}, {"role": "assistant", "content": "<think>\nr\n</think>\n\nbye"}])
    got = runs(tokenize_trace(trace, qwen3_tokenizer), qwen3_tokenizer)
    assert got[2:4] == [("T", "<|im_end|>\n<|im_start|>assistant\n"), ("D", "ok\n<|im_end|>")]


def test_unknown_role_dropped_by_template_is_an_error(qwen3_tokenizer):
    # Bypass schema validation to show the tokenizer itself refuses a silent loss.
    trace = Trace([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"},
                   {"role": "observation", "content": "5"}, {"role": "assistant", "content": "bye"}])
    with pytest.raises(TraceError, match=r"message 2 \(observation\) is missing from the rendering"):
        tokenize_trace(trace, qwen3_tokenizer)


def test_unknown_role_raised_by_template_is_an_error(llama3_tokenizer):
    trace = Trace([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"},
                   {"role": "observation", "content": "5"}, {"role": "assistant", "content": "bye"}])
    with pytest.raises(TraceError, match="chat template rejected the trace: unknown role observation"):
        tokenize_trace(trace, llama3_tokenizer)


def test_no_feedback_is_an_error(qwen3_tokenizer):
    trace = Trace([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}])
    with pytest.raises(TraceError, match="no feedback tokens"):
        tokenize_trace(trace, qwen3_tokenizer)
    assert tokenize_trace(trace, qwen3_tokenizer, TokenizeConfig(require_feedback=False)).n_feedback == 0


def test_too_long_is_dropped(llama3_tokenizer):
    n = tokenize_trace(PLAIN, llama3_tokenizer).n_tokens
    with pytest.raises(TraceError, match=f"trace has {n} tokens, over max_length {n - 1}"):
        tokenize_trace(PLAIN, llama3_tokenizer, TokenizeConfig(max_length=n - 1))


def test_truncation_inside_feedback_is_reported(llama3_tokenizer):
    # Cut after "Observation:" (12 of the 14 feedback bytes): the note names the feedback message.
    full = tokenize_trace(PLAIN, llama3_tokenizer)
    first_feedback = full.feedback_mask.index(True)
    cut = first_feedback + 12
    tok = tokenize_trace(PLAIN, llama3_tokenizer, TokenizeConfig(max_length=cut, truncation="truncate"))
    assert tok.n_tokens == cut and tok.truncated and tok.n_feedback == 12
    assert tok.notes == [f"truncated at {cut} tokens inside feedback message 2 (tool): kept 12 of its 14 tokens"]
    assert tok.input_ids == full.input_ids[:cut]


def test_malformed_think_block_is_an_error(qwen3_tokenizer):
    trace = Trace([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a</think>b</think>c"},
                   {"role": "tool", "content": "x"}, {"role": "assistant", "content": "bye"}])
    with pytest.raises(TraceError, match=r"message 1 \(assistant\): expected at most one <think>"):
        tokenize_trace(trace, qwen3_tokenizer)


def test_kind_comes_from_meta(llama3_tokenizer):
    trace = Trace(PLAIN.messages, meta={"kind": "general"})
    assert tokenize_trace(trace, llama3_tokenizer).kind == "general"
    assert tokenize_trace(PLAIN, llama3_tokenizer).kind == "domain"


# Other template families: any Hugging Face chat template works, not only ChatML.
GEMMA_LIKE = (  # no system role: the system prompt is merged into the first user turn
    "{{ bos_token }}{% if messages[0].role == 'system' %}{% set sys = messages[0].content + '\\n\\n' %}"
    "{% set msgs = messages[1:] %}{% else %}{% set sys = '' %}{% set msgs = messages %}{% endif %}"
    "{% for m in msgs %}{% if m.role == 'assistant' %}<start_of_turn>model\n{{ m.content | trim }}<end_of_turn>\n"
    "{% else %}<start_of_turn>user\n{{ (sys if loop.first else '') + m.content | trim }}<end_of_turn>\n"
    "{% endif %}{% endfor %}"
)
MISTRAL_LIKE = (
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }}[/INST]"
    "{% elif m.role == 'tool' %}[TOOL_RESULTS] {{ m.content }}[/TOOL_RESULTS]"
    "{% elif m.role == 'assistant' %}{{ ' ' + m.content }}{{ eos_token }}{% endif %}{% endfor %}"
)


def test_gemma_like_template_with_merged_system_prompt():
    tok = build_tiny_tokenizer("llama3")
    tok.add_tokens(["<start_of_turn>", "<end_of_turn>"], special_tokens=True)
    tok.chat_template = GEMMA_LIKE
    trace = Trace([{"role": "system", "content": "You are terse."}, *PLAIN.messages])
    assert runs(tokenize_trace(trace, tok), tok) == [
        ("T", "<|begin_of_text|><start_of_turn>user\n"),
        ("P", "You are terse."),
        ("T", "\n\n"),
        ("P", "Add 2 and 3."),
        ("T", "<end_of_turn>\n<start_of_turn>model\n"),
        ("D", "<execute>print(2+3)</execute><end_of_turn>"),
        ("T", "\n<start_of_turn>user\n"),
        ("F", "Observation:\n5"),
        ("T", "<end_of_turn>\n<start_of_turn>model\n"),
        ("D", "The answer is <solution>5</solution><end_of_turn>"),
        ("T", "\n"),
    ]


def test_mistral_like_template():
    tok = build_tiny_tokenizer("llama3")
    tok.chat_template = MISTRAL_LIKE
    assert runs(tokenize_trace(PLAIN, tok), tok) == [
        ("T", "<|begin_of_text|>[INST] "),
        ("P", "Add 2 and 3."),
        ("T", "[/INST] "),
        ("D", "<execute>print(2+3)</execute><|eot_id|>"),
        ("T", "[TOOL_RESULTS] "),
        ("F", "Observation:\n5"),
        ("T", "[/TOOL_RESULTS] "),
        ("D", "The answer is <solution>5</solution><|eot_id|>"),
    ]


@pytest.mark.parametrize("rewrite", ["upper", "lower"])
def test_template_that_rewrites_content_is_an_error(rewrite):
    tok = build_tiny_tokenizer("llama3")
    tok.chat_template = MISTRAL_LIKE.replace("[TOOL_RESULTS] {{ m.content }}", f"[TOOL_RESULTS] {{{{ m.content | {rewrite} }}}}")
    with pytest.raises(TraceError, match=r"message 2 \(tool\): the chat template changed its text beyond whitespace"):
        tokenize_trace(PLAIN, tok)


class CountingTokenizer:
    """The tokenizer, recording how many characters each encoding call was given."""

    def __init__(self, tokenizer):
        self.tokenizer, self.sizes = tokenizer, []

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)

    def __call__(self, text, *args, **kwargs):
        self.sizes.append(len(text))
        return self.tokenizer(text, *args, **kwargs)


def huge_trace(chars: int) -> Trace:
    """A trace whose one tool message (a runaway traceback) holds ``chars`` characters."""
    line = "Traceback line 17: ValueError in module x: 3.14159\n"
    return Trace([
        {"role": "user", "content": "Run it."},
        {"role": "assistant", "content": "<execute>run()</execute>"},
        {"role": "tool", "content": line * (chars // len(line))},
        {"role": "assistant", "content": "It failed."},
    ])


def test_huge_trace_is_cut_before_tokenising(llama3_tokenizer):
    counting = CountingTokenizer(llama3_tokenizer)
    tok = tokenize_trace(huge_trace(8_000_000), counting, TokenizeConfig(max_length=256, truncation="truncate"))
    # 256 tokens need a few thousand characters; the tokenizer never sees more than 64 KB of 8 MB.
    assert max(counting.sizes) < 65_536
    assert tok.n_tokens == 256 and tok.truncated
    assert tok.notes[0].startswith("truncated at 256 tokens inside feedback message 2 (tool): kept ")
    assert tok.notes[0].endswith("(and more: only the trace's start was tokenised)")


def test_huge_trace_over_max_length_is_dropped_without_tokenising_it(llama3_tokenizer):
    counting = CountingTokenizer(llama3_tokenizer)
    with pytest.raises(TraceError, match=r"trace has more than \d+ tokens \(8,0\d\d,\d{3} characters\), over max_length "
                                         r"256; raise max_length or set truncation=truncate"):
        tokenize_trace(huge_trace(8_000_000), counting, TokenizeConfig(max_length=256))
    assert max(counting.sizes) < 65_536


def test_huge_trace_without_max_length_is_refused_with_the_fix(llama3_tokenizer):
    counting = CountingTokenizer(llama3_tokenizer)
    with pytest.raises(TraceError, match=r"renders to 8,0\d\d,\d{3} characters, more than the 4,000,000 .* "
                                         r"--max-length N --truncation truncate"):
        tokenize_trace(huge_trace(8_000_000), counting, TokenizeConfig(max_length=None))
    assert counting.sizes == []


def _varied_text(chars: int, seed: int = 0) -> str:
    """Words, numbers, code, runs of spaces and non-ASCII text, so that token lengths vary widely."""
    import random

    rng = random.Random(seed)
    pieces = ["def f(x):\n", "    return x ** 2", " " * 37, "\u00e9t\u00e9 ", "\u4f60\u597d", "1234567890", "\n\n",
              "assert f(3) == 9", "=" * 80, "Error: ", "\U0001F600", "a" * 300]
    out: list[str] = []
    while sum(map(len, out)) < chars:
        out.append(rng.choice(pieces))
    return "".join(out)


@pytest.mark.parametrize("tokenizer_name", ["llama3_tokenizer", "qwen3_tokenizer"])
@pytest.mark.parametrize("max_length", [40, 700, 5000])
def test_cut_before_tokenising_keeps_exactly_the_tokens_of_the_whole_text(request, tokenizer_name, max_length):
    tokenizer = request.getfixturevalue(tokenizer_name)
    trace = Trace([
        {"role": "user", "content": _varied_text(3000, seed=1)},
        {"role": "assistant", "content": "<execute>f(3)</execute>"},
        {"role": "tool", "content": _varied_text(200_000, seed=2)},
        {"role": "assistant", "content": "done"},
    ])
    loose = dict(require_decision=False, require_feedback=False)
    whole = tokenize_trace(trace, tokenizer, TokenizeConfig(max_length=None, **loose))
    cut = tokenize_trace(trace, tokenizer, TokenizeConfig(max_length=max_length, truncation="truncate", **loose))
    assert whole.n_tokens > 2 * max_length  # only a prefix was tokenised for the cut version
    assert cut.input_ids == whole.input_ids[:max_length]
    assert cut.roles() == whole.roles()[:max_length]
