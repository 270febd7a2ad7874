"""The critique provider against a tiny OpenAI-compatible server on 127.0.0.1."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from collect_scripted import ScriptedGenerator

from molrl.episode import EpisodeConfig, run_episodes
from molrl.episode.config import CritiqueConfig
from molrl.episode.critique import CritiqueFeedback
from molrl.episode.feedback import Observation
from molrl.errors import MolrlError
from molrl.tasks import Task, TestCase
from molrl.tiny import build_tiny_tokenizer

TASK = Task(id="sq", prompt="TASK-SQ: square x.", kind="code", entry_point="sq", tests=[TestCase("call", args=[3], expected=9)])


class _Critic(BaseHTTPRequestHandler):
    requests: list = []
    fail_first = 0

    def do_POST(self):  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append((self.path, self.headers.get("Authorization"), body))
        if type(self).fail_first > 0:
            type(self).fail_first -= 1
            self.send_response(503)
            self.end_headers()
            return
        reply = {"choices": [{"message": {"role": "assistant", "content": f"  Check the sign. ({len(body['messages'])})  "}}]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def critic():
    _Critic.requests, _Critic.fail_first = [], 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Critic)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_critique_is_asked_with_the_conversation_and_what_was_observed(critic, monkeypatch):
    monkeypatch.setenv("CRITIC_KEY", "secret")
    provider = CritiqueFeedback(CritiqueConfig(base_url=critic, model="judge", api_key_env="CRITIC_KEY", retries=0))
    messages = [{"role": "user", "content": "TASK-SQ"}, {"role": "assistant", "content": "<execute>print(-9)</execute>"}]
    obs = Observation("code", exec={"status": "ok", "exit_code": 0, "stdout": "-9\n", "stderr": "", "truncated": False,
                                    "duration_s": 0.1, "error": None})
    assert provider(TASK, obs, messages) == "Expert feedback:\nCheck the sign. (2)"
    path, auth, body = _Critic.requests[0]
    assert (path, auth, body["model"]) == ("/v1/chat/completions", "Bearer secret", "judge")
    assert body["messages"][1]["content"] == (
        "Task:\nTASK-SQ\n\nModel:\n<execute>print(-9)</execute>\n\nWhat the environment observed:\nOutput:\n-9"
    )


def test_server_errors_are_retried(critic):
    _Critic.fail_first = 1
    provider = CritiqueFeedback(CritiqueConfig(base_url=critic, model="judge", retries=1))
    assert provider(TASK, Observation("none", problem="no block"), [{"role": "user", "content": "q"}]).startswith("Expert feedback:")
    assert len(_Critic.requests) == 2


def test_a_dead_endpoint_stops_with_a_clear_error():
    provider = CritiqueFeedback(CritiqueConfig(base_url="http://127.0.0.1:9", model="judge", retries=0, timeout_s=2))
    with pytest.raises(MolrlError, match=r"critique endpoint http://127.0.0.1:9/v1/chat/completions failed"):
        provider(TASK, Observation("none", problem="x"), [{"role": "user", "content": "q"}])


def test_critique_joins_the_feedback_of_an_episode(critic):
    class NoSandbox:  # the scripted turns never run code
        def run_many(self, jobs):
            raise AssertionError("no code to run")

    cfg = EpisodeConfig(max_turns=1, feedback=["format", "critique"], critique=CritiqueConfig(base_url=critic, model="judge"))
    gen = ScriptedGenerator({"TASK-SQ": ["I would square it."]})
    (ep,) = run_episodes(gen, build_tiny_tokenizer("chatml"), [TASK], NoSandbox(), cfg, thinking=True)
    assert ep.messages[-1]["content"].endswith("\n\nExpert feedback:\nCheck the sign. (2)")
    assert ep.observations[3]["feedback"]["critique"] == "Expert feedback:\nCheck the sign. (2)"
