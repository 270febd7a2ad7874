"""Every place a name becomes a folder (an adapter saved for the servers and removed once unloaded, under
``engine_sync_dir``; a pipeline's MoL and RL runs, under its run directory, whose names also name the adapter an RL
run starts from and the models eval scores; a benchmark eval scores, under its output) refuses a name that would leave
the folder it is put in, in one line, before anything is written, sent to a server or deleted
(``molrl.records.writes.plain_name``)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from molrl.engines.server.sync import AdapterSync
from molrl.errors import MolrlError
from molrl.pipeline.config import MolRun, PipelineConfig, RlRun


class _NoServers:
    """A pool that fails the test if anything reaches a server."""

    def call_everywhere(self, *args, **kwargs):
        raise AssertionError("a server was asked to load or unload an adapter")

    def when_unused(self, *args, **kwargs):
        raise AssertionError("an adapter was handed to the unload")


def _publish(root: Path, name: str) -> None:
    AdapterSync(_NoServers(), root / "sync", "t").publish(name, lambda folder: folder.mkdir(parents=True))


def _drop(root: Path, name: str) -> None:
    (root / "escape").mkdir()  # what a removal outside the sync dir would delete
    AdapterSync(_NoServers(), root / "sync", "t").drop(name)


def _mol_run(root: Path, name: str) -> None:
    PipelineConfig(model="m", output_dir=root / "run", mol_runs=[MolRun(name=name)], rl_runs=[])


def _rl_run(root: Path, name: str) -> None:
    PipelineConfig(model="m", output_dir=root / "run", rl_runs=[RlRun(name=name, start="mol")])


def _benchmark(root: Path, name: str) -> None:
    from molrl.eval.config import EvalConfig

    EvalConfig(model="tiny:chatml", benchmarks=[name], data={name: str(root / "tasks.jsonl")},
               output_dir=root / "eval")


PLACES: dict[str, Callable[[Path, str], None]] = {
    "an adapter saved under engine_sync_dir": _publish,
    "an adapter removed from engine_sync_dir": _drop,
    "a pipeline's MoL run": _mol_run,
    "a pipeline's RL run": _rl_run,
    "a benchmark eval scores": _benchmark,
}

ESCAPES = ["../escape", "sync/../../escape", "/tmp/escape", "..", ".", "", "a\\..\\escape", "a\0b"]


@pytest.mark.parametrize("name", ESCAPES, ids=repr)
@pytest.mark.parametrize("place", PLACES)
def test_a_name_that_would_leave_its_folder_is_refused_in_one_line(place, name, tmp_path):
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises((MolrlError, ValueError)) as err:
        PLACES[place](tmp_path, name)
    message = str(err.value)
    assert repr(name) in message and "plain folder name" in message and "\n" not in message
    if place == "an adapter removed from engine_sync_dir":
        assert (tmp_path / "escape").is_dir()  # before: ../escape, as an adapter's name, was deleted
        before.append("escape")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written anywhere


@pytest.mark.parametrize("name", ["mol+grpo", "mol_kl0.1-norep", "ce..feedback", "base+mt_grpo_echo_kl"])
def test_the_names_runs_are_given_are_plain(name, tmp_path):
    cfg = PipelineConfig(model="m", output_dir=tmp_path / "run", mol_runs=[MolRun(name=name)],
                         rl_runs=[RlRun(name="rl", start=name)])
    assert [r.name for r in cfg.mol_runs] == [name]
