"""The adapter sync as a cluster's trainer processes see it (``molrl.engine_server.sync``): the main process saves and
loads each adapter on every server; another process, with a pool of its own, waits until the servers list it, and a
server that died meanwhile is taken out of that process's pool too, not the end of its run."""

from __future__ import annotations

import threading
import time

import pytest

from fake_engine_server import FakeEngineServer
from molrl.engine_server.pool import NoServerLeft, ServerPool
from molrl.engine_server.sync import AdapterSync


@pytest.fixture
def two():
    made = [FakeEngineServer(), FakeEngineServer()]
    yield made
    for server in made:
        if not server.dead:
            server.stop()


def test_another_process_waits_for_the_adapter_and_leaves_out_a_server_that_died(two, tmp_path):
    a, b = two
    main_pool, other_pool = ServerPool([a.url, b.url]), ServerPool([a.url, b.url])
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
    pool = ServerPool([a.url, b.url])
    a.stop()
    b.stop()
    with pytest.raises(NoServerLeft) as err:
        AdapterSync(pool, tmp_path, "t").follow("molrl-t-1")
    assert a.url in str(err.value) and b.url in str(err.value) and "\n" not in str(err.value)
    pool.close()
