"""The adapter sync as a cluster's trainer processes see it (``molrl.engines.server.sync``): the main process saves and
loads each adapter on every server; another process, with a pool of its own, waits until the servers list it, and a
server that died meanwhile is taken out of that process's pool too, not the end of its run."""

from __future__ import annotations

import threading
import time

import pytest

from fake_engine_server import SCRIPTED_VOCAB as VOCAB
from fake_engine_server import FakeEngineServer
from molrl.engines.server.pool import NoServerLeft, ServerPool
from molrl.engines.server.sync import AdapterSync


@pytest.fixture
def two():
    made = [FakeEngineServer(), FakeEngineServer()]
    yield made
    for server in made:
        if not server.dead:
            server.stop()


def test_another_process_waits_for_the_adapter_and_leaves_out_a_server_that_died(two, tmp_path):
    a, b = two
    main_pool, other_pool = ServerPool([a.url, b.url], VOCAB), ServerPool([a.url, b.url], VOCAB)
    main, other = AdapterSync(main_pool, tmp_path, "t"), AdapterSync(other_pool, tmp_path, "t")
    name = main.next_name()
    assert other.next_name() == name  # every process counts alike

    def publish_late():
        time.sleep(0.5)
        main.publish(name, lambda folder: folder.mkdir(parents=True))
        b.stop()  # dies once loaded: the main process has not met it down yet, the other one will

    thread = threading.Thread(target=publish_late)
    start = time.monotonic()
    thread.start()
    other.follow(name)
    thread.join()
    assert time.monotonic() - start >= 0.5 and other.current == name and not other.owner
    assert a.adapters == {name: str((tmp_path / name).resolve())}
    assert other_pool.alive == [True, False] and "waiting for adapter" in other_pool.down[b.url]
    for pool in (main_pool, other_pool):
        pool.close()


def test_another_process_whose_servers_are_all_down_stops_in_one_line(two, tmp_path):
    a, b = two
    pool = ServerPool([a.url, b.url], VOCAB)
    a.stop()
    b.stop()
    with pytest.raises(NoServerLeft) as err:
        AdapterSync(pool, tmp_path, "t").follow("molrl-t-1")
    assert a.url in str(err.value) and b.url in str(err.value) and "\n" not in str(err.value)
    pool.close()


@pytest.mark.parametrize("keep_behind", [0, 1])
def test_with_several_processes_the_adapter_another_still_samples_from_stays_loaded_until_two_loads_on(
        keep_behind, tmp_path):
    from molrl.engines.server.client import RequestParams

    server = FakeEngineServer(token_delay_s=0.05)
    main_pool, other_pool = ServerPool([server.url], VOCAB), ServerPool([server.url], VOCAB)
    main, other = AdapterSync(main_pool, tmp_path, "t", keep_behind), AdapterSync(other_pool, tmp_path, "t")
    names = [main.next_name() for _ in range(3)]
    for _ in names:
        other.next_name()
    try:
        main.publish(names[0], lambda folder: folder.mkdir(parents=True))
        other.follow(names[0])
        # the other process's rows for the next step, submitted under the first adapter (one-step-off), still sampling
        pending = other_pool.submit(names[0], [0], RequestParams(max_tokens=12, temperature=1.0))
        deadline = time.monotonic() + 60
        while server.in_flight == 0:  # the request has reached the server (under load its thread may start late)
            assert time.monotonic() < deadline and not pending.done(), "the request never reached the server"
            time.sleep(0.01)
        main.publish(names[1], lambda folder: folder.mkdir(parents=True))  # the main process has no request on it
        kept_while_sampled = names[0] in server.adapters
        assert len(pending.result().ids) == 12
        if keep_behind == 0:  # one process: the previous adapter goes at once (the hazard several processes would meet)
            assert not kept_while_sampled and set(server.adapters) == {names[1]}
            return
        assert kept_while_sampled and set(server.adapters) == {names[0], names[1]}
        main.publish(names[2], lambda folder: folder.mkdir(parents=True))
        assert set(server.adapters) == {names[1], names[2]} and not (tmp_path / names[0]).exists()
        main.close()
        assert server.adapters == {} and not any((tmp_path / n).exists() for n in names)
    finally:
        for pool in (main_pool, other_pool):
            pool.close()
        server.stop()
