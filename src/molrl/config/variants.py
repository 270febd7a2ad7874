"""A stage's ``--describe``: every key with its default and meaning, the keys that act only under a setting grouped
under it.

``molrl.config.describe`` (the function) gives each key's lines (``key: default  # doc``, then ``    # ...``); ``describe_stage``
keeps the keys that always act first, in their order, then one group a row of ``molrl.config.idle.RULES`` that
covers the stage, headed ``# only with <setting>:`` (``# only with rollout.partial=true:``), as TRL's config groups
its options. A key appears once, under the first rule that covers it.
"""

from __future__ import annotations

from molrl.config import describe
from molrl.config.idle import RULES, rule_keys


def key_blocks(lines: list[str]) -> list[tuple[str, list[str]]]:
    """``describe``'s lines cut into (key, its lines) blocks: a block starts at a line that is not indented."""
    blocks: list[tuple[str, list[str]]] = []
    for line in lines:
        if line.startswith(" ") and blocks:
            blocks[-1][1].append(line)
        else:
            blocks.append((line.split(":", 1)[0], [line]))
    return blocks


def describe_stage(cls: type, stage: str) -> list[str]:
    """``describe(cls)`` with the keys that act only under a setting grouped under it, for ``stage``."""
    blocks = key_blocks(describe(cls))
    groups: dict[str, list[str]] = {}
    placed: dict[str, str] = {}
    for rule in RULES:
        if stage not in rule.stages:
            continue
        for key in rule_keys(rule, cls):
            if key not in placed:
                placed[key] = rule.where
                groups.setdefault(rule.where, [])
    always = [line for key, lines in blocks if key not in placed for line in lines]
    for key, lines in blocks:
        if key in placed:
            groups[placed[key]] += lines
    out = always
    for where, lines in groups.items():
        if lines:
            out += ["", f"# only with {where}:", *lines]
    return out
