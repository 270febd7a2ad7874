"""collect's and eval's flags are shorthands of config keys, as ``model=PATH`` is of ``model.path``: each flag of each
command's table sets its key (the same resolved config as the key), a flag and its key given different values are
refused in one line naming both, and a command runs from keys alone."""

from __future__ import annotations

import logging

import pytest

from molrl.cli import build_parser, main
from molrl.collect.config import CollectConfig
from molrl.commands import collect, eval as eval_command
from molrl.commands.flags import flag_items, refuse_clashes
from molrl.config import load_config
from molrl.errors import ConfigError
from molrl.eval.config import EvalConfig

COMMANDS = {"collect": (collect.FLAGS, CollectConfig, ["model=m", "data.path=t.jsonl"]),
            "eval": (eval_command.FLAGS, EvalConfig, [])}
"""Each command: its flag table, its config class and the keys it cannot load without."""

VALUES = {"model": ("tiny:llama3", "tiny:chatml"), "adapter": ("ad", "other"), "tasks": ("a.jsonl", "b.jsonl"),
          "format": ("mbpp", "humaneval"), "out": ("runs/a", "runs/b"), "samples": ("3", "4"),
          "max_turns": ("3", "4"), "limit": ("2", "5"), "benchmarks": ("mbpp", "humaneval"), "n": ("2", "3"),
          "max_new_tokens": ("64", "32"), "mode": ("interactive", "single")}
"""Two values each flag takes, neither its key's default."""

CASES = [(command, attr, key) for command, (table, _, _) in COMMANDS.items() for attr, key in table.items()]


def _items(command: str, argv: list[str]) -> list[str]:
    """The ``key=value`` overrides a command builds from the flags of ``argv``."""
    args = build_parser().parse_args([command, *argv])
    if command == "eval":
        return eval_command.flag_overrides(args)
    return [item for _, item in flag_items(collect.FLAGS, args)]


def test_every_value_list_covers_every_flag():
    assert {attr for _, attr, _ in CASES} == set(VALUES)


@pytest.mark.parametrize("command,attr,key", CASES)
def test_a_flag_sets_its_key(command, attr, key):
    _, cls, required = COMMANDS[command]
    value = VALUES[attr][0]
    items = _items(command, [f"--{attr.replace('_', '-')}", value])
    by_flag = load_config(cls, None, [*required, *items])
    assert by_flag == load_config(cls, None, [*required, f"{key}={value}"])
    assert by_flag != load_config(cls, None, required)  # the value is not the default: the flag did something


@pytest.mark.parametrize("command,attr,key", CASES)
def test_a_flag_and_its_key_with_different_values_are_refused_naming_both(command, attr, key):
    table, cls, _ = COMMANDS[command]
    flag, (value, other) = f"--{attr.replace('_', '-')}", VALUES[attr]
    args = build_parser().parse_args([command, flag, value, f"{key}={other}"])
    with pytest.raises(ConfigError, match=f"{flag} {value} and {key}={other} set {key}"):
        refuse_clashes(cls, flag_items(table, args), args.overrides)
    args = build_parser().parse_args([command, flag, value, f"{key}={value}"])
    refuse_clashes(cls, flag_items(table, args), args.overrides)  # the same value twice is one setting


@pytest.mark.parametrize("argv,said", [
    (["--turns", "3", "mode=single"], "--turns 3 and mode=single set mode"),
    (["--turns", "3", "episode.max_turns=2"], "--turns 3 and episode.max_turns=2 set episode.max_turns"),
    (["--thinking", "thinking=false"], "--thinking and thinking=false set thinking"),
    (["--data", "x=a.jsonl", "data.x=b.jsonl"], "--data x=a.jsonl and data.x=b.jsonl set data.x.path"),
    (["--predictions", "x=a.jsonl", "predictions.x=b.jsonl"], "--predictions x=a.jsonl and predictions.x=b.jsonl"),
    (["--model", "a", "model={path: b}"], "--model a and model={path: b} set model.path"),
])
def test_evals_written_out_flags_refuse_their_keys_with_other_values(argv, said):
    with pytest.raises(ConfigError, match=said.replace("{", r"\{").replace("}", r"\}")):
        eval_command.flag_overrides(build_parser().parse_args(["eval", *argv]))


def test_a_flag_and_an_old_name_of_its_key_with_different_values_are_refused():
    args = build_parser().parse_args(["collect", "--samples", "3", "samples=4"])
    with pytest.raises(ConfigError, match="--samples 3 and samples=4 set sampling.n to different values"):
        refuse_clashes(CollectConfig, flag_items(collect.FLAGS, args), args.overrides)


def test_collect_runs_from_keys_alone_and_refuses_a_clash_before_it_runs(tmp_path, monkeypatch, cli_logs, caplog):
    tasks = tmp_path / "t.jsonl"
    tasks.write_text('{"id": "a", "prompt": "1+1?", "answer": "2"}\n')
    ran = []
    monkeypatch.setattr("molrl.collect.run.run_collect", lambda cfg: ran.append(cfg))
    keys = ["model=tiny:chatml", f"data.path={tasks}", "data.spec.kind=math", f"output_dir={tmp_path / 'out'}"]
    assert main(["collect", *keys]) == 0
    assert main(["collect", "--model", "tiny:chatml", "--tasks", str(tasks), "--out", str(tmp_path / "out"),
                 "data.spec.kind=math"]) == 0
    assert ran[0] == ran[1] and ran[0].output_dir == tmp_path / "out"
    caplog.set_level(logging.WARNING)
    assert main(["collect", *keys, "--out", str(tmp_path / "elsewhere")]) == 1 and len(ran) == 2
    assert f"--out {tmp_path / 'elsewhere'} and output_dir={tmp_path / 'out'} set output_dir" in caplog.text
