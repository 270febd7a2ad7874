"""The engine servers' client (``molrl.engines.server``) against fake vLLM servers: request format, load balancing,
failover, cancellation and adapter load/unload."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest

from fake_engine_server import SCRIPTED_VOCAB as VOCAB
from fake_engine_server import FakeEngineServer, scripted
from molrl.engines.server.client import RequestParams, ServerClient, check_chunk, completion_body
from molrl.engines.choice import server_address
from molrl.engines.server.generator import open_generator, row_seed
from molrl.engines.server.pool import NoServerLeft, ServerPool, least_loaded
from molrl.engines.server.sync import AdapterSync, check_base
from molrl.errors import MolrlError


@pytest.fixture
def servers():
    made: list[FakeEngineServer] = []

    def make(n: int = 1, **kwargs) -> list[FakeEngineServer]:
        made.extend(FakeEngineServer(**kwargs) for _ in range(n))
        return made[-n:]

    yield make
    for server in made:
        if not server.dead:
            server.stop()


def expected(model: str, last: int, n: int, seed: int = 0) -> list[int]:
    table = scripted(model, [last], {"seed": seed})
    return [next(table)[0] for _ in range(n)]


@pytest.mark.parametrize("outstanding, alive, chosen", [
    ([0, 0, 0], [True, True, True], 0),  # equals: the first
    ([2, 1, 3], [True, True, True], 1),  # the fewest
    ([2, 1, 3], [True, False, True], 0),  # the fewest among the live
    ([5, 5], [False, True], 1),
    ([0, 0], [False, False], None),  # none alive
])
def test_least_loaded_takes_the_live_server_with_fewest_outstanding(outstanding, alive, chosen):
    assert least_loaded(outstanding, alive) == chosen


def test_completion_body_sends_token_ids_and_asks_for_sampled_ids_and_logprobs():
    body = completion_body("molrl-x-1", [5, 6, 7], RequestParams(max_tokens=9, temperature=0.7, top_p=0.9, top_k=0,
                                                                 stop=("\n",), stop_token_ids=(2,), seed=11))
    assert body["prompt"] == [5, 6, 7] and body["model"] == "molrl-x-1" and body["n"] == 1
    assert (body["logprobs"], body["return_token_ids"], body["stream"]) == (0, True, True)
    assert (body["top_k"], body["seed"], body["stop_token_ids"], body["max_tokens"]) == (-1, 11, [2], 9)
    assert "seed" not in completion_body("m", [1], RequestParams(max_tokens=1, temperature=1.0))


def test_chunk_without_token_ids_reads_them_from_the_tokens_and_refuses_a_length_mismatch():
    chunk = {"choices": [{"logprobs": {"tokens": ["token_id:4", "token_id:9"], "token_logprobs": [-1.0, -2.0]},
                          "finish_reason": None}]}
    assert check_chunk(chunk, "http://a:1", VOCAB) == ([4, 9], [-1.0, -2.0], None)
    chunk["choices"][0]["logprobs"]["token_logprobs"] = [-1.0]
    with pytest.raises(MolrlError, match="http://a:1 sent a bad reply: 1 log-probs for 2 tokens"):
        check_chunk(chunk, "http://a:1", VOCAB)


@pytest.mark.parametrize("url", ["localhost:8000", "https://h:1", "http://:8000", "http://h:port"])
def test_a_url_that_is_not_http_host_port_is_refused_naming_it(url):
    with pytest.raises(MolrlError, match="engine_servers"):
        server_address(url)


def test_a_completion_streams_the_sampled_ids_and_their_logprobs(servers):
    (server,) = servers(1)
    client = ServerClient(server.url, VOCAB)
    reply = client.complete("base-model", [10, 20], RequestParams(max_tokens=4, temperature=1.0))
    assert reply.ids == expected("base-model", 20, 4) == [21, 22, 23, 24]
    assert reply.logps == pytest.approx([-0.1, -0.2, -0.3, -0.4])
    assert reply.finish_reason == "length"
    stopped = client.complete("base-model", [10], RequestParams(max_tokens=9, temperature=1.0, stop_token_ids=(13,)))
    assert stopped.ids == [11, 12, 13] and stopped.finish_reason == "stop"


def test_requests_spread_evenly_over_the_servers(servers):
    # each request streams for 1 s: on a loaded machine every one is sent while the others still stream, so the
    # least-loaded choice, not a request that ended early, decides where it goes
    a, b = servers(2, token_delay_s=0.2)
    pool = ServerPool([a.url, b.url], VOCAB)
    futures = [pool.submit("base-model", [i], RequestParams(max_tokens=5, temperature=1.0)) for i in range(8)]
    replies = pool.gather(futures)
    assert [r.ids for r in replies] == [expected("base-model", i, 5) for i in range(8)]
    assert (len(a.requests), len(b.requests)) == (4, 4)
    pool.close()


def test_a_server_that_dies_mid_step_is_named_and_its_requests_finish_on_the_other(servers, caplog):
    a, b = servers(2, token_delay_s=0.01)
    a.die_after_tokens = 3
    pool = ServerPool([a.url, b.url], VOCAB)
    with caplog.at_level(logging.WARNING, logger="molrl.engines.server.pool"):
        replies = pool.gather([pool.submit("base-model", [i], RequestParams(max_tokens=6, temperature=1.0))
                               for i in range(6)])
    assert [r.ids for r in replies] == [expected("base-model", i, 6) for i in range(6)]  # whole, resent from start
    assert all(r.finished for r in replies)
    down = [r.getMessage() for r in caplog.records if "is down" in r.getMessage()]
    assert len(down) == 1 and a.url in down[0] and b.url not in down[0]
    assert pool.alive == [False, True]
    pool.close()


def test_when_every_server_is_down_the_step_stops_with_one_line_naming_them(servers):
    a, b = servers(2)
    a.stop()
    b.stop()
    pool = ServerPool([a.url, b.url], VOCAB)
    with pytest.raises(NoServerLeft) as err:
        pool.gather([pool.submit("base-model", [1], RequestParams(max_tokens=2, temperature=1.0))])
    message = str(err.value)
    assert a.url in message and b.url in message and "resumes from the last checkpoint" in message
    assert "\n" not in message
    pool.close()


def test_gather_until_cancels_the_rest_keeping_their_tokens(servers):
    (server,) = servers(1, token_delay_s=0.01)
    pool = ServerPool([server.url], VOCAB)
    cancel = threading.Event()
    budgets = [2, 400, 400]
    futures = [pool.submit("base-model", [0], RequestParams(max_tokens=n, temperature=1.0), cancel) for n in budgets]
    seen: list[int] = []

    def finished(rows: list[int]) -> bool:
        seen.extend(rows)
        return 0 in seen

    replies = pool.gather_until(futures, cancel, finished)
    assert replies[0].finished and replies[0].ids == [1, 2]
    for reply in replies[1:]:
        assert not reply.finished and 0 < len(reply.ids) < 400  # stopped part-way, its tokens so far kept
        assert reply.ids == expected("base-model", 0, len(reply.ids))
        assert len(reply.logps) == len(reply.ids)
    pool.close()


def test_each_adapter_is_loaded_everywhere_and_the_previous_unloaded_once_no_request_uses_it(servers, tmp_path):
    a, b = servers(2, token_delay_s=0.02)
    pool = ServerPool([a.url, b.url], VOCAB)
    sync = AdapterSync(pool, tmp_path, "t")
    first = sync.next_name()
    sync.publish(first, lambda folder: folder.mkdir(parents=True))
    assert set(a.adapters) == set(b.adapters) == {first} and a.adapters[first] == str((tmp_path / first).resolve())
    running = pool.submit(first, [0], RequestParams(max_tokens=10, temperature=1.0))  # still sampling from the first
    second = sync.next_name()
    sync.publish(second, lambda folder: folder.mkdir(parents=True))
    assert first in a.adapters or first in b.adapters  # in use: kept
    assert running.result().ids == expected(first, 0, 10)  # the old adapter's request finished on it
    assert set(a.adapters) == set(b.adapters) == {second}  # then unloaded
    assert not (tmp_path / first).exists() and (tmp_path / second).is_dir()
    assert sync.current == second and (first, second) == ("molrl-t-1", "molrl-t-2")
    sync.close()
    assert a.adapters == b.adapters == {}
    pool.close()


def test_a_server_on_another_base_is_refused_naming_both(servers):
    (server,) = servers(1, base="/models/other")
    cards = ServerClient(server.url).models()
    assert check_base(server.url, cards, "/models/other") == "/models/other"
    with pytest.raises(MolrlError, match=r"serves /models/other, but this run's policy is on /models/mine"):
        check_base(server.url, cards, "/models/mine")


class Ids:
    """A tokenizer of single-character tokens, enough for the generator's decoding."""

    eos_token_id, pad_token_id = 0, 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % VOCAB for c in text]}

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))

    def __len__(self):
        return VOCAB


def test_the_generator_loads_the_adapter_seeds_each_row_and_unloads_on_close(servers, tmp_path):
    from molrl.engines.sampling import SamplingConfig

    a, b = servers(2)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 8, "target_modules": ["q_proj", "v_proj"]}')
    generator = open_generator([a.url, b.url], Ids(), "base-model", str(adapter))
    (name,) = a.adapters
    assert b.adapters == {name: str(adapter.resolve())}
    out = generator.generate(["A", "B"], SamplingConfig(n=2, temperature=1.0, max_new_tokens=3, seed=4))
    seeds = sorted(r["seed"] for r in a.requests + b.requests)
    assert seeds == sorted(row_seed(4, i, j) for i in range(2) for j in range(2)) and len(set(seeds)) == 4
    assert {r["model"] for r in a.requests + b.requests} == {name}
    first = expected(name, ord("A"), 3, seed=row_seed(4, 0, 0))
    assert out[0][0] == " ".join(map(str, first)) and len(out) == 2 and all(len(x) == 2 for x in out)
    generator.close()
    assert a.adapters == b.adapters == {}


def test_molrl_serve_starts_vllms_server_with_the_flags_a_run_needs(tmp_path):
    from molrl.commands.serve import model_dtype, serve_command

    argv, env = serve_command("runs/m", 8001, host="0.0.0.0", max_lora_rank=20, dtype="bfloat16", gpu=False,
                              python="py")
    assert argv[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    flags = " ".join(argv[3:])
    for flag in ("--model runs/m", "--host 0.0.0.0", "--port 8001", "--dtype bfloat16", "--enable-lora",
                 "--max-lora-rank 32",  # 20 rounded up to a rank vLLM takes
                 "--logprobs-mode processed_logprobs", "--generation-config vllm", "--no-enable-chunked-prefill"):
        assert flag in flags
    assert "--gpu-memory-utilization 0.3" in flags  # on a CPU, a share of the machine's memory
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True" and "VLLM_CPU_KVCACHE_SPACE" in env
    on_gpu, _ = serve_command("runs/m", 8001, gpu=True)
    assert "--enforce-eager" not in on_gpu and "--no-enable-chunked-prefill" not in on_gpu
    with pytest.raises(ValueError, match="up to 512"):
        serve_command("runs/m", 8001, max_lora_rank=513)
    (tmp_path / "config.json").write_text('{"torch_dtype": "bfloat16"}')
    assert model_dtype(str(tmp_path)) == "bfloat16" and model_dtype("HuggingFaceTB/SmolLM2-135M") == "auto"


@pytest.mark.parametrize("devices,parallel,expect", [
    (None, None, (None, 1)),  # every GPU the process sees, the model whole on one
    ("0", None, ("0", 1)),  # one server a GPU: one such line a GPU, each on its own port
    ("2,3", None, ("2,3", 2)),  # one server over two GPUs: split two ways
    ("0,1,2,3", 2, ("0,1,2,3", 2)),
])
def test_molrl_serve_places_a_server_on_the_gpus_it_names(devices, parallel, expect):
    from molrl.commands.serve import serve_command

    argv, env = serve_command("runs/m", 8001, gpu=True, devices=devices, tensor_parallel_size=parallel)
    split = int(argv[argv.index("--tensor-parallel-size") + 1]) if "--tensor-parallel-size" in argv else 1
    assert (env.get("CUDA_VISIBLE_DEVICES"), split) == expect


@pytest.mark.parametrize("devices,parallel", [("0,0", None), ("a", None), ("0,1", 3), (None, 0)])
def test_molrl_serve_refuses_devices_it_cannot_place_a_server_on(devices, parallel):
    from molrl.commands.serve import serve_command

    with pytest.raises(ValueError, match="--devices|--tensor-parallel-size"):
        serve_command("runs/m", 8001, gpu=True, devices=devices, tensor_parallel_size=parallel)


def test_molrl_serve_starts_one_server_per_gpu_each_on_its_devices(tmp_path):
    """Two ``molrl serve`` processes, one a GPU, start their servers (the fake one here) with the devices named, say
    ready once the server answers, and stop it on SIGTERM."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    here = Path(__file__).resolve().parent
    start = ("import sys, molrl.commands.serve as serve; serve.SERVER_MODULE = 'fake_engine_server'; "
             "from molrl.cli import main; sys.exit(main(sys.argv[1:]))")
    children = []
    for gpu in ("0", "1"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = dict(os.environ, FAKE_SERVER_RECORD=str(tmp_path / f"gpu{gpu}.json"),
                   PYTHONPATH=os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")]))
        children.append(subprocess.Popen(
            [sys.executable, "-c", start, "serve", "--model", "base-model", "--port", str(port), "--devices", gpu],
            env=env, stdout=subprocess.PIPE, text=True))
    try:
        for child in children:
            lines = [child.stdout.readline() for _ in range(2)]
            assert "engine_servers: [http://127.0.0.1:" in lines[0] and lines[1].rstrip().endswith("ready"), lines
    finally:
        for child in children:
            child.send_signal(signal.SIGTERM)
    assert [child.wait(timeout=60) for child in children] == [0, 0]
    for gpu in ("0", "1"):
        started = json.loads((tmp_path / f"gpu{gpu}.json").read_text())
        assert started["CUDA_VISIBLE_DEVICES"] == gpu and "--tensor-parallel-size" not in started["argv"]
