"""Every integer flag of every subcommand refuses a value below its floor before anything runs.

The flags are found by walking the real parser: each integer flag either declares its floor as its type
(``molrl.cli.count``: 1 or more, ``natural``: 0 or more) or sets a config key whose declared range checks it.
"""

from __future__ import annotations

import argparse
import logging

import pytest

from molrl.cli import build_parser, count, main, natural

ARGS = {
    ("traces", "stats"): ["traces", "stats", "t.jsonl", "--tokenizer", "tok"],
    ("traces", "show"): ["traces", "show", "t.jsonl", "--tokenizer", "tok"],
    ("traces", "filter"): ["traces", "filter", "in.jsonl", "out.jsonl"],
    ("collect",): ["collect", "--model", "tiny:chatml", "--tasks", "tasks.jsonl", "--out", "out"],
    ("eval",): ["eval", "--model", "tiny:chatml"],
    ("sandbox", "run"): ["sandbox", "run", "p.py"],
    ("sandbox", "serve"): ["sandbox", "serve"],
    ("demo",): ["demo"],
    ("serve",): ["serve", "--model", "m"],
}
"""Per subcommand, the arguments it needs besides the flag under test."""

FLAG_KEYS = {
    ("collect", "--samples"): "sampling.n", ("collect", "--max-turns"): "episode.max_turns",
    ("collect", "--limit"): "data.limit", ("eval", "--limit"): "limit", ("eval", "--n"): "sampling.n",
    ("eval", "--max-new-tokens"): "sampling.max_new_tokens", ("eval", "--turns"): "--turns 0",
    ("sandbox", "--memory-mb"): "memory_mb=0",
}
"""Plain integer flags, and what their refusal of 0 names: the config key whose range checks them."""


def integer_flags() -> list[tuple[tuple[str, ...], str, object]]:
    """(subcommand path, flag, its type) of every integer flag of every subcommand."""
    found = []

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    if name not in ("grpo",):  # an alias of rl, the same parser
                        walk(sub, (*path, name))
            elif action.type in (int, count, natural):
                found.append((path, action.option_strings[-1], action.type))

    walk(build_parser(), ())
    return found


def test_the_walk_finds_every_integer_flag():
    flags = {(path, flag) for path, flag, _ in integer_flags()}
    assert {(("demo",), "--seeds"), (("eval",), "--n"), (("traces", "show"), "--index")} <= flags
    assert {path for path, _ in flags} <= set(ARGS)


@pytest.fixture
def nothing_runs(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.py").write_text("print(1)\n")
    for target in ("molrl.eval.run.run_eval", "molrl.collect.run.run_collect", "molrl.demo.run.run_demo",
                   "molrl.study.run.run_study", "molrl.sandbox.SandboxPool"):
        monkeypatch.setattr(target, lambda *a, **k: pytest.fail("it ran with a flag below its floor"))


@pytest.mark.parametrize("path,flag,kind", integer_flags(), ids=lambda v: v if isinstance(v, str) else None)
def test_every_integer_flag_refuses_a_value_below_its_floor(nothing_runs, cli_logs, caplog, capsys, path, flag, kind):
    if kind is int:  # checked by the range of the config key it sets
        assert main([*ARGS[path], flag, "0"]) == 1
        lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(lines) == 1 and FLAG_KEYS[(path[0], flag)] in lines[0], lines
        return
    low = 1 if kind is count else 0
    for value in {low - 1, -1}:
        with pytest.raises(SystemExit) as exit_:
            main([*ARGS[path], flag, str(value)])
        assert exit_.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1].endswith(
            f"error: argument {flag}: {value}: give {low} or more")


def test_demo_seeds_0_is_refused_as_seeds_minus_1_is(nothing_runs, capsys):
    for value in ("0", "-1"):
        with pytest.raises(SystemExit):
            main(["demo", "--seeds", value])
        assert capsys.readouterr().err.splitlines()[-1] == f"molrl demo: error: argument --seeds: {value}: give 1 or more"
