"""Two RL runs given one ``engine_sync_dir`` (``engine=vllm_server``): what they would share there is refused in one
line or kept apart. While one runs, a second on the same folder is refused, naming the first's pid, before anything
loads (``molrl.rl.run``); the adapters each run loads are named apart by a tag of its own, and each removes only its
own (``molrl.engines.server.sync``); a ``merge_new`` base left there is used only by a run merged from the same model
and adapter (``molrl.engines.server.policy``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fake_engine_server import SCRIPTED_VOCAB as VOCAB
from fake_engine_server import FakeEngineServer
from molrl.config import load_config
from molrl.engines.server.pool import ServerPool
from molrl.engines.server.sync import AdapterSync
from molrl.errors import MolrlError
from molrl.rl.config import RlConfig
from molrl.records.locks import folder_lock

REPO = Path(__file__).resolve().parents[1]


def _cfg(tmp_path: Path, *overrides: str) -> RlConfig:
    return load_config(RlConfig, REPO / "configs" / "rl_tiny.yaml",
                       ["engine=vllm_server", "engine_servers=[http://127.0.0.1:9]", *overrides])


def test_a_second_run_on_a_sync_dir_in_use_is_refused_in_one_line(tmp_path):
    from molrl.rl.run import run_rl

    sync, out = tmp_path / "shared", tmp_path / "second"
    with folder_lock(sync, "use another one"):  # the first run's hold on it
        with pytest.raises(MolrlError) as err:
            run_rl(_cfg(tmp_path, f"engine_sync_dir={sync}", f"output_dir={out}"))
    # before: the second run went on, its adapters saved beside the first's
    assert str(err.value) == (f"{sync} is being written by another run (pid {os.getpid()}); wait for it to end, or "
                              "give each run its own engine_sync_dir (unset, it is engine_sync under output_dir)")
    assert not (out / "config.yaml").exists()  # refused before anything


def test_the_adapters_of_two_runs_on_one_sync_dir_are_kept_apart(tmp_path):
    server = FakeEngineServer()
    pool = ServerPool([server.url], VOCAB)
    try:
        first, second = AdapterSync(pool, tmp_path, "1a2b3c4d"), AdapterSync(pool, tmp_path, "5e6f7a8b")
        names = [first.next_name(), second.next_name()]
        assert names[0] != names[1]
        for sync, name in zip((first, second), names):
            sync.publish(name, lambda folder: folder.mkdir(parents=True))
        first.close()  # the first run ends: its adapter goes, the second's stays loaded and saved
        assert set(server.adapters) == {names[1]} and sorted(p.name for p in tmp_path.iterdir()) == [names[1]]
    finally:
        pool.close()
        server.stop()


def _adapter(folder: Path, weights: bytes) -> Path:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 4, "target_modules": ["q_proj"]}))
    (folder / "adapter_model.safetensors").write_bytes(weights)
    return folder


@pytest.mark.parametrize("left", ["merged from this run's adapter", "merged from another adapter",
                                  "merged before records were kept"])
def test_a_merged_base_in_a_shared_sync_dir_serves_only_a_run_merged_from_the_same(left, tmp_path):
    from molrl.engines.server.policy import MERGED_FROM, merged_from, served_base
    from molrl.rl.engine import policy_spec

    mine, other = _adapter(tmp_path / "mine", b"mine"), _adapter(tmp_path / "other", b"other")
    sync = tmp_path / "sync"
    base = sync / "merged_base"
    base.mkdir(parents=True)
    (base / "config.json").write_text("{}")  # what the run that merged it left: the servers serve it
    cfg = policy_spec(_cfg(tmp_path, "model.path=tiny:chatml", f"model.adapter={mine}", "model.adapter_mode=merge_new"))
    if left != "merged before records were kept":
        made = merged_from("tiny:chatml", mine if left == "merged from this run's adapter" else other)
        (base / MERGED_FROM).write_text(json.dumps(made))
    if left != "merged from another adapter":
        assert served_base(cfg, sync, main=True) == str(base.resolve())
        return
    with pytest.raises(MolrlError) as err:  # before: the servers sampled from the other run's merged model
        served_base(cfg, sync, main=True)
    error = str(err.value)
    assert error.startswith(f"{base.resolve()}: merged by another run from {other}, not this run's {mine}")
    assert "give this run its own engine_sync_dir" in error and "\n" not in error
