"""Show a tokenised trace with every token coloured by its role (a mask linter), in a terminal or as HTML."""

from __future__ import annotations

import html
from typing import Any

from molrl.traces.tokenize import TokenizedTrace

COLOURS = {"prompt": "#3b82f6", "decision": "#16a34a", "feedback": "#d97706", "template": "#9ca3af"}
LEGEND = {
    "prompt": "prompt (system/user)",
    "decision": "decision (model-written)",
    "feedback": "feedback (environment)",
    "template": "template",
}


def segments(tokenized: TokenizedTrace, tokenizer: Any) -> list[tuple[str, str, int, int]]:
    """``(text, role, message, n_tokens)`` runs of consecutive tokens with the same role and message."""
    runs: list[tuple[str, int, list[int]]] = []
    for tok, role, msg in zip(tokenized.input_ids, tokenized.roles(), tokenized.token_message):
        if runs and runs[-1][0] == role and runs[-1][1] == msg:
            runs[-1][2].append(tok)
        else:
            runs.append((role, msg, [tok]))
    return [(tokenizer.decode(ids, skip_special_tokens=False), role, msg, len(ids)) for role, msg, ids in runs]


def to_rich(tokenized: TokenizedTrace, tokenizer: Any):
    """A ``rich.text.Text`` of the trace, each run coloured by role."""
    from rich.text import Text

    text = Text()
    for chunk, role, _msg, _n in segments(tokenized, tokenizer):
        style = COLOURS[role] + (" dim" if role == "template" else "")
        text.append(chunk, style=style)
    return text


def legend_rich():
    """A one-line legend of the role colours."""
    from rich.text import Text

    text = Text()
    for role, label in LEGEND.items():
        text.append(f"■ {label}  ", style=COLOURS[role])
    return text


def to_html(tokenized: TokenizedTrace, tokenizer: Any, title: str) -> str:
    """A standalone HTML page of the trace, each run coloured by role, with counts and a legend."""
    body = []
    for chunk, role, msg, n in segments(tokenized, tokenizer):
        where = f"message {msg}" if msg >= 0 else "template"
        body.append(
            f'<span class="{role}" title="{role} · {where} · {n} tokens">{html.escape(chunk)}</span>'
        )
    legend = " ".join(f'<span class="{r} key">{html.escape(label)}</span>' for r, label in LEGEND.items())
    counts = (
        f"{tokenized.n_tokens} tokens: {tokenized.n_prompt} prompt, {tokenized.n_decision} decision, "
        f"{tokenized.n_feedback} feedback, {tokenized.n_template} template"
    )
    css = "\n".join(f".{r} {{ color: {c}; }}" for r, c in COLOURS.items())
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }}
pre {{ white-space: pre-wrap; font-family: monospace; font-size: 13px; line-height: 1.4; }}
.key {{ margin-right: 1.5em; font-weight: bold; }}
{css}
.template {{ opacity: 0.7; }}
.decision, .feedback {{ font-weight: 600; }}
</style></head><body>
<h3>{html.escape(title)}</h3>
<p>{legend}</p><p>{html.escape(counts)}</p>
<pre>{''.join(body)}</pre>
</body></html>
"""
