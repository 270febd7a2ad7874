"""Hostile engine replies against every engine path: the client refuses each where it arrives, in one line naming the
server and what it sent; the request goes to another server, or the step stops and a re-run resumes; nothing a lying
server sent is graded or trained on. The hostile replies are ``fake_engine_server.HOSTILE``, the paths ``KINDS``; the
gate's and the canary's own rule for log-probs no engine path should hand them is tested last."""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import pytest

from fake_engine_server import HOSTILE, SCRIPTED_VOCAB, FakeEngineServer, ModelAnswer, scripted
from grpo_helpers import save_tiny_model, toy_config
from molrl import cli
from molrl.engines.server.client import BadReply, RequestParams, ServerClient, check_models
from molrl.engines.server.pool import NoServerLeft, ServerPool
from molrl.errors import MolrlError

FINITE = r"a sampled token's log-prob is a finite number at most 0"
SAYS = {
    "not_json": r'a chunk that is not JSON: \{"choices": \[\{"token_ids": \[1',
    "not_an_object": r"a chunk that is not a JSON object: \[1, 2, 3\]",
    "choice_not_an_object": r'choices\[0\]="token_id:\d+", not an object',
    "ids_not_integers": r'choices\[0\]\.token_ids\[0\]="\d+", not an integer token id',
    "logprobs_not_a_list": r"choices\[0\]\.logprobs\.token_logprobs=-[\d.]+, not a list",
    "fewer_logprobs": r"1 log-probs for 2 tokens",
    "finish_not_a_string": r"choices\[0\]\.finish_reason=7, not a string or null",
    "nan_logprob": rf"choices\[0\]\.logprobs\.token_logprobs\[0\]=nan; {FINITE}",
    "minus_infinity_logprob": rf"choices\[0\]\.logprobs\.token_logprobs\[0\]=-inf; {FINITE}",
    "positive_logprob": rf"choices\[0\]\.logprobs\.token_logprobs\[0\]=0\.7; {FINITE}",
    "id_past_vocabulary": r"choices\[0\]\.token_ids\[0\]=100\d{4}, outside the model's \d+ ids",
    "negative_id": r"choices\[0\]\.token_ids\[0\]=-\d+, outside the model's \d+ ids",
    "past_max_tokens": r"more tokens than the request's max_tokens=(\d+) \((\d+) so far\)",
}
"""What the refusal of each hostile reply says the server sent."""

KINDS = ("single_turn", "multi_turn", "partial", "one_step_off", "eval", "collect")
"""Every path that generates on the engine servers: RL's rollout kinds, and the eval and collect stages."""
RL_KINDS = KINDS[:4]


def refused(mode: str, url: str, text: str) -> bool:
    """``text`` names the server at ``url`` and what it sent in hostile ``mode``."""
    return f"{url} sent a bad reply: " in text and re.search(SAYS[mode], text) is not None


def in_vocabulary(model: str, ids: list[int], body: dict) -> object:
    """A hostile server's tokens before it breaks them: ids the tiny tokenizer holds, each at log-prob -1 (not the
    model's: a token of it that reached a rollout would show in the mismatch)."""
    last = ids[-1] if ids else 0
    while True:
        last = (last + 1) % 256
        yield last, -1.0


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "base", eos_logit=2.0)


@pytest.fixture
def started():
    made: list[FakeEngineServer] = []

    def start(**kwargs) -> FakeEngineServer:
        made.append(FakeEngineServer(**kwargs))
        return made[-1]

    yield start
    for server in made:
        if not server.dead:
            server.stop()


def test_every_hostile_reply_has_the_refusal_it_names():
    assert set(SAYS) == set(HOSTILE)


@pytest.mark.parametrize("mode", HOSTILE)
def test_the_client_refuses_each_hostile_reply_in_one_line_naming_the_server_and_what_it_sent(mode, started):
    server = started(hostile=mode)
    with pytest.raises(BadReply) as err:
        ServerClient(server.url, SCRIPTED_VOCAB).complete("base-model", [10], RequestParams(max_tokens=4,
                                                                                            temperature=1.0))
    message = str(err.value)
    assert message.startswith(f"engine server {server.url} sent a bad reply: ") and "\n" not in message
    assert refused(mode, server.url, message), message
    if mode == "past_max_tokens":  # of the 50,000 streamed, the client read one past max_tokens and stopped
        assert re.search(SAYS[mode], message).groups() == ("4", "5")


@pytest.mark.parametrize("answer, says", [
    ("Not Found", r'/v1/models answered "Not Found"'),
    ({"object": "list"}, r'/v1/models answered \{"object": "list"\}'),
    ({"data": "base-model"}, r'/v1/models answered \{"data": "base-model"\}'),
    ({"data": ["base-model"]}, r'/v1/models answered \{"data": \["base-model"\]\}'),
    ({"data": [{"id": 7}]}, r'/v1/models answered \{"data": \[\{"id": 7\}\]\}'),
])
def test_a_models_answer_that_is_not_a_list_of_cards_is_refused_naming_the_server(answer, says):
    with pytest.raises(BadReply, match=rf"engine server http://h:1 sent a bad reply: {says}; vLLM's server lists"):
        check_models(answer, "http://h:1")
    assert check_models({"data": [{"id": "base-model", "parent": None}]}, "http://h:1") == [
        {"id": "base-model", "parent": None}]


@pytest.mark.parametrize("mode", HOSTILE)
def test_a_refused_reply_goes_to_another_server_and_nothing_of_it_is_kept(mode, started, caplog):
    hostile, honest = started(hostile=mode), started()
    pool = ServerPool([hostile.url, honest.url], SCRIPTED_VOCAB)
    with caplog.at_level(logging.WARNING, logger="molrl.engines.server.pool"):
        replies = pool.gather([pool.submit("base-model", [i], RequestParams(max_tokens=4, temperature=1.0))
                               for i in range(4)])
    pool.close()
    table = [scripted("base-model", [i], {}) for i in range(4)]
    assert [r.ids for r in replies] == [[next(t)[0] for _ in range(4)] for t in table]  # the honest server's, whole
    assert all(r.logps == pytest.approx([-0.1, -0.2, -0.3, -0.4]) and r.finish_reason == "length" for r in replies)
    assert len(hostile.requests) >= 1 and len(honest.requests) == 4  # the first went to the liar (least loaded)
    lines = [r.getMessage() for r in caplog.records if hostile.url in r.getMessage()]
    assert len(lines) == 1 and refused(mode, hostile.url, lines[0]) and "out of the pool" in lines[0]
    assert pool.alive == [False, True]


def rl_config(kind: str, out: Path, base: Path, urls: list[str], **overrides):
    """A 2-step toy run of rollout ``kind`` on the servers at ``urls``."""
    cfg = toy_config(out, base, max_steps=2, engine="vllm_server", engine_servers=urls,
                     max_new_tokens=48 if kind == "multi_turn" else 8, **overrides)
    if kind == "multi_turn":
        cfg.episode.max_turns, cfg.episode.turn_tokens = 2, 8
    cfg.rollout.partial = kind == "partial"
    cfg.rollout.max_staleness = int(kind == "one_step_off")
    return cfg


def stage_argv(kind: str, base: Path, out: Path, urls: list[str], shared_data: Path) -> list[str]:
    """The command line of a small ``molrl eval`` or ``molrl collect`` on the servers at ``urls``."""
    servers = f"engine_servers=[{','.join(urls)}]"
    if kind == "eval":
        return ["eval", f"model={base}", "engine=vllm_server", servers, "benchmarks=[math500]",
                f"data.math500={shared_data / 'math500' / 'test.jsonl'}", "limit=2", "sampling.n=2",
                "sampling.max_new_tokens=4", "ks=[1]", f"output_dir={out}", "sandbox.workers=1"]
    return ["collect", f"model={base}", "engine=vllm_server", servers,
            f"data.path={shared_data / 'mbpp' / 'mbpp.jsonl'}", "data.format=mbpp", "data.limit=2", "sampling.max_new_tokens=8", "sampling.temperature=1.0",
            "episode.max_turns=2", f"output_dir={out}", "sandbox.workers=1", "progress=false"]


def stage_output(kind: str, out: Path) -> list:
    """What an eval or collect run graded or kept: each sample's completion, or each trace's messages."""
    if kind == "eval":
        path = out / "math500" / "samples.jsonl"
        return [json.loads(x)["completion"] for x in path.read_text().splitlines()] if path.is_file() else []
    path = out / "traces.jsonl"
    return [json.loads(x)["messages"] for x in path.read_text().splitlines()] if path.is_file() else []


def metrics(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("kind", KINDS)
def test_every_path_takes_each_lying_server_out_and_finishes_on_the_honest_one(kind, base, started, tmp_path, caplog,
                                                                              cli_logs, request):
    """One lying server of every hostile kind and one honest server, the honest one last: a request goes to a liar
    while any is idle (the least loaded, the first of equals), so every liar is sent one before the first request
    reaches the honest server, each is refused and named once, and the run finishes on the honest one with nothing
    of theirs kept."""
    shared_data = request.getfixturevalue("shared_data") if kind in ("eval", "collect") else None
    liars = [started(base=str(base), answer=in_vocabulary, hostile=mode) for mode in HOSTILE]
    honest = started(base=str(base), answer=ModelAnswer(str(base)))
    urls = [s.url for s in liars] + [honest.url]
    with caplog.at_level(logging.WARNING, logger="molrl.engines.server.pool"):
        if kind in RL_KINDS:
            from molrl.rl.run import run_rl

            run_rl(rl_config(kind, tmp_path / "run", base, urls))
        else:
            assert cli.main(stage_argv(kind, base, tmp_path / "run", urls, shared_data)) == 0
    for mode, liar in zip(HOSTILE, liars):
        lines = [r.getMessage() for r in caplog.records if liar.url in r.getMessage()]
        assert len(lines) == 1 and refused(mode, liar.url, lines[0]), (mode, lines)
    if kind in RL_KINDS:
        steps = [m for m in metrics(tmp_path / "run") if "rollout/mismatch_kl" in m]
        assert len(steps) == 2 and max(m["rollout/mismatch_kl"] for m in steps) < 1e-6  # the honest server's alone
    else:  # token for token what the honest server alone makes
        assert cli.main(stage_argv(kind, base, tmp_path / "alone", [honest.url], shared_data)) == 0
        assert stage_output(kind, tmp_path / "run") == stage_output(kind, tmp_path / "alone") != []


STOPPED_BY = dict(zip(KINDS, ("nan_logprob", "id_past_vocabulary", "past_max_tokens", "minus_infinity_logprob",
                              "not_json", "choice_not_an_object")))
"""The lying server each path's stop is shown with: every class of refusal (non-finite, out of bounds, too long, not
the protocol's shape) on some path; every hostile reply on every path is the test above."""


@pytest.mark.parametrize("kind", KINDS)
def test_a_path_whose_only_server_lies_stops_in_one_line_and_grades_nothing(kind, base, started, tmp_path, caplog,
                                                                            cli_logs, request):
    mode = STOPPED_BY[kind]
    liar = started(base=str(base), answer=ModelAnswer(str(base)), hostile=mode)
    out = tmp_path / "run"
    if kind in RL_KINDS:
        from molrl.rl.run import run_rl

        with pytest.raises(NoServerLeft) as err:
            run_rl(rl_config(kind, out, base, [liar.url]))
        message = str(err.value)
        assert not (out / "completions.jsonl").exists() or not (out / "completions.jsonl").read_text()
        assert not (out / "metrics.jsonl").exists() or not any("reward" in m for m in metrics(out))
    else:
        shared_data = request.getfixturevalue("shared_data")
        with caplog.at_level(logging.ERROR, logger="molrl"):
            assert cli.main(stage_argv(kind, base, out, [liar.url], shared_data)) == 1
        (message,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert stage_output(kind, out) == []
        liar.hostile = None  # the server fixed: the same command runs
        assert cli.main(stage_argv(kind, base, out, [liar.url], shared_data)) == 0 and stage_output(kind, out)
    assert "\n" not in message and refused(mode, liar.url, message), message
    assert "the step stopped" in message and "re-run the same command" in message


def settled(server, quiet_s: float = 1.0, limit_s: float = 60.0) -> int:
    """The requests ``server`` has received once none has arrived for ``quiet_s``: the stopped run's requests still in
    flight when it raised reach the server late on a loaded machine, and are not the next run's."""
    import time

    deadline, seen = time.monotonic() + limit_s, -1
    while len(server.requests) != seen and time.monotonic() < deadline:
        seen = len(server.requests)
        time.sleep(quiet_s)
    return seen


def test_a_step_stopped_by_a_lying_server_resumes_from_the_last_checkpoint(base, started, tmp_path):
    """The server lies from step 2 on (after step 1's 8 rows and the canary's request): the run stops there with step
    1's checkpoint saved; the same command on the server fixed resumes from it and samples step 2 alone."""
    from molrl.rl.run import run_rl

    liar = started(base=str(base), answer=ModelAnswer(str(base)), hostile="nan_logprob", honest_requests=8 + 1)
    out = tmp_path / "run"
    with pytest.raises(NoServerLeft, match=SAYS["nan_logprob"]):
        run_rl(rl_config("single_turn", out, base, [liar.url], save_steps=1))
    assert [m["step"] for m in metrics(out) if "rollout/mismatch_kl" in m] == [1]
    liar.hostile, before = None, settled(liar)
    run_rl(rl_config("single_turn", out, base, [liar.url], save_steps=1))
    assert len(liar.requests) - before == 8 + 1  # step 2's rows and the new process's canary; not step 1's again
    steps = [m for m in metrics(out) if "rollout/mismatch_kl" in m]
    assert [m["step"] for m in steps] == [1, 2] and max(m["rollout/mismatch_kl"] for m in steps) < 1e-6


@pytest.mark.parametrize("where, value, says", [
    ("rollout", math.nan, r"step 1: rollout/mismatch_kl is unknown: (\d+) of the step's \1 sampled tokens have no "
                          r"usable engine log-prob"),
    ("canary", -math.inf, r"step 1: the engine's log-probs are unusable: 8 of the tokens it sampled after the canary "
                          r"prompt"),
], ids=["rollout_nan", "canary_minus_infinity"])
def test_log_probs_no_engine_should_hand_over_stop_the_run_at_step_1(where, value, says, base, started, tmp_path,
                                                                       monkeypatch):
    """A server on the base that ignores every adapter load, behind an engine path that hands the rollout (or the
    canary) a NaN or infinite log-prob for every token it sampled, as the client never does: the gate, or the canary,
    stops the run at step 1, where a step with no usable log-prob once read as no mismatch."""
    from molrl.engines.policy import Sampled
    from molrl.rl.run import run_rl
    from molrl.engines.server.policy import ServerPolicyEngine

    method = {"rollout": "generate", "canary": "sample_ids"}[where]
    real = getattr(ServerPolicyEngine, method)

    def unusable(self, *args):
        out = real(self, *args)
        return [Sampled(s.ids, [value] * len(s.ids)) for s in out] if where == "rollout" else \
            Sampled(out.ids, [value] * len(out.ids))

    monkeypatch.setattr(ServerPolicyEngine, method, unusable)
    stale = started(base=str(base), answer=ModelAnswer(str(base), stale=True))
    out = tmp_path / "run"
    with pytest.raises(MolrlError, match=says) as err:
        run_rl(toy_config(out, base, max_steps=3, engine="vllm_server", engine_servers=[stale.url]))
    assert "\n" not in str(err.value)
    assert [m["step"] for m in metrics(out) if "rollout/mismatch_kl" in m] == [1]


def test_the_ids_a_reply_may_hold_are_the_models_rows_where_they_outnumber_the_tokenizers(tmp_path):
    from molrl.models import load_tokenizer, sampled_ids

    tok = load_tokenizer("tiny:chatml")
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": len(tok) + 64}))  # padded rows, as Qwen3's
    assert sampled_ids(tok, str(tmp_path)) == len(tok) + 64
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": len(tok) - 3}))  # fewer rows: the tokenizer's
    assert sampled_ids(tok, str(tmp_path)) == len(tok)
    assert sampled_ids(tok, str(tmp_path / "none")) == len(tok) and sampled_ids(tok, config_vocab=10**6) == 10**6
