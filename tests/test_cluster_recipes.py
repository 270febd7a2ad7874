"""The cluster recipes (examples/cluster/) run the commands of the local rehearsal (scripts/cluster_local.sh): the same
``molrl serve`` line for each server, the same ``molrl sandbox serve`` line for each sandbox server and the same
``accelerate launch ... molrl rl`` line for the trainers, only the launcher around them differs; and those lines are
ones molrl serve, molrl sandbox serve, accelerate and molrl rl take."""

from __future__ import annotations

import argparse
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
REHEARSAL = REPO / "scripts/cluster_local.sh"
RECIPES = {"slurm": REPO / "examples/cluster/slurm.sbatch", "skypilot": REPO / "examples/cluster/skypilot.yaml"}
OPERATORS = {">", ">>", "&", "&&", "||", "|", ";", "2>&1"}
"""Shell words that end a command (a redirect, a pipe, a list)."""


def script_text(path: Path) -> str:
    """The shell a file runs: a script as it is, a SkyPilot YAML's setup and run blocks."""
    if path.suffix == ".yaml":
        task = yaml.safe_load(path.read_text())
        return task["setup"] + "\n" + task["run"]
    return path.read_text()


def commands(text: str, head: str) -> list[list[str]]:
    """Every command in ``text`` that starts with the words ``head``, as its words (continuation lines joined, quotes
    read as the shell reads them, up to the first redirect or list operator)."""
    found = []
    for line in text.replace("\\\n", " ").splitlines():
        at = line.find(head)
        if at < 0 or line.lstrip().startswith("#"):
            continue
        words = shlex.split(line[at:].rstrip().rstrip("'"))
        cut = next((i for i, w in enumerate(words) if w in OPERATORS or w.startswith(">")), len(words))
        found.append(words[:cut])
    return found


def one(path: Path, head: str) -> list[str]:
    found = commands(script_text(path), head)
    assert len(found) == 1, f"{path.name}: {len(found)} commands start with {head!r}"
    return found[0]


@pytest.mark.parametrize("head", ["molrl serve", "molrl sandbox serve", "accelerate launch"])
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_a_recipe_runs_the_rehearsals_command(recipe, head):
    assert one(RECIPES[recipe], head) == one(REHEARSAL, head)


@pytest.mark.parametrize("path", [REHEARSAL, *RECIPES.values()], ids=lambda p: p.name)
def test_the_scripts_parse_as_bash(path, tmp_path):
    script = tmp_path / "script.sh"
    script.write_text(script_text(path))
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def substituted(words: list[str], values: dict[str, str]) -> list[str]:
    """``words`` with each shell setting replaced by its value in ``values`` (every one must be known)."""
    out = []
    for word in words:
        for name in sorted(values, key=len, reverse=True):
            word = word.replace(name, values[name])
        assert "$" not in word, f"{word}: a setting the test does not know"
        out.append(word)
    return out


def test_the_server_line_is_one_molrl_serve_takes():
    from molrl.commands import serve

    parser = argparse.ArgumentParser()
    serve.register(parser.add_subparsers())
    values = {"$MODEL": "runs/m", "$PORT": "8001", "$HOST": "0.0.0.0", "$RANK": "16", "$MEMORY": "0.1"}
    args = parser.parse_args(substituted(one(REHEARSAL, "molrl serve")[1:], values))
    assert args.func is serve.handle
    assert (args.model, args.port, args.host, args.max_lora_rank, args.memory) == ("runs/m", 8001, "0.0.0.0", 16, 0.1)


def test_the_sandbox_server_line_is_one_molrl_sandbox_serve_takes():
    from molrl.commands import sandbox

    parser = argparse.ArgumentParser()
    sandbox.register(parser.add_subparsers())
    values = {"$SANDBOX_PORT": "8301", "$HOST": "0.0.0.0", "$SANDBOX_WORKERS": "4"}
    args = parser.parse_args(substituted(one(REHEARSAL, "molrl sandbox serve")[1:], values))
    assert args.func is sandbox.serve_pool
    assert (args.port, args.host, args.workers) == (8301, "0.0.0.0", 4)


def test_the_trainer_line_is_one_accelerate_and_molrl_rl_take(tmp_path):
    from accelerate.commands.launch import launch_command_parser

    from molrl.config import load_config
    from molrl.rl.config import RlConfig

    values = {"$ACCELERATE_CONFIG": "configs/accelerate/cpu_2proc.yaml", "$TRAINERS": "2", "$MACHINES": "1",
              "$MACHINE_RANK": "0", "$MAIN_NODE": "127.0.0.1", "$MAIN_PORT": "29512", "$CONFIG": "configs/rl_tiny.yaml",
              "$MODEL": "tiny:chatml", "$OUT": str(tmp_path), "$STEPS": "2", "$SYNC_DIR": str(tmp_path / "sync"),
              "$SERVERS": "http://127.0.0.1:8001,http://127.0.0.1:8002",
              "$SANDBOXES": "http://127.0.0.1:8301,http://127.0.0.1:8302"}
    launch = launch_command_parser().parse_args(substituted(one(REHEARSAL, "accelerate launch")[2:], values))
    assert (launch.num_processes, launch.num_machines, launch.module) == (2, 1, True)
    assert launch.training_script == "molrl.cli" and launch.training_script_args[0] == "rl"
    rl = launch.training_script_args[1:]
    assert rl[0] == "--config"
    cfg = load_config(RlConfig, REPO / rl[1], rl[2:])
    assert cfg.engine == "vllm_server" and len(cfg.engine_servers) == 2 and cfg.train.max_steps == 2
    assert cfg.engine_sync_dir == str(tmp_path / "sync") and cfg.model.path == "tiny:chatml"
    assert cfg.sandbox.backend == "remote" and cfg.sandbox.servers == ["http://127.0.0.1:8301", "http://127.0.0.1:8302"]
