"""OpenEnv environments (`tools.openenv`) against a guess-the-number server written with
openenv-core's own classes (tests/openenv_guess_server.py) on 127.0.0.1: episodes by hand
(the server's observations, per-step rewards, end and state), names and their one-line
errors, servers that answer garbage, stay silent, fail or drop the connection (an error
observation within the timeout, never a crash or a hang), and the agents' smoke job with
real gradients played against the server, which the test kills mid-run."""

from __future__ import annotations

import hashlib
import json
import pathlib
import socket
import subprocess
import sys
import threading
import time
import types
import urllib.request

import pytest

from grpo_jax.tasks import Example
from grpo_jax.tools import environment_name_error, make_environment
from grpo_jax.tools.guard import NotStarted, guarded_reset, guarded_step
from grpo_jax.tools.openenv import OpenEnvEnvironment, Session

SERVER = pathlib.Path(__file__).with_name("openenv_guess_server.py")
WRONG = -0.125  # the server's reward for a guess that is not the number (RIGHT: 1)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Server:
    """The guessing game's server process; `url()` starts it again after a test killed it."""

    def __init__(self):
        self.process = None
        self.port = None

    def url(self) -> str:
        if self.process is None or self.process.poll() is not None:
            self._start()
        return f"http://127.0.0.1:{self.port}"

    def _start(self) -> None:
        self.port = _free_port()
        self.process = subprocess.Popen([sys.executable, str(SERVER), str(self.port)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the OpenEnv test server exited: "
                                   f"{self.process.stderr.read().decode()[-2000:]}")
            try:
                with opener.open(f"http://127.0.0.1:{self.port}/health", timeout=1) as r:
                    if json.loads(r.read()).get("status") == "healthy":
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("the OpenEnv test server did not start within 90 s")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait()


@pytest.fixture(scope="module")
def server():
    running = _Server()
    yield running
    running.kill()


def _example(answer: str, problem_id: str = "p") -> Example:
    return Example(id=problem_id, prompt="1-16", answer=answer)


def test_episodes_by_hand_reach_the_servers_observations_rewards_end_and_state(server):
    environment = make_environment(f"openenv:{server.url()},tag=guess")
    assert environment.check() == "guess"  # the action's one field, read from GET /schema
    assert environment.stop_text == "</guess>" and environment.gives_rewards
    # two rows of a batch, interleaved: each its own session and game
    observation, first = environment.reset(_example("5"))
    assert observation == "" and isinstance(first, Session)
    assert environment.step(first, "so <guess>3</guess>") == (
        "<result>higher</result>", WRONG, False, first)
    _, second = environment.reset(_example("12"))
    assert environment.step(second, "<guess>12</guess>") == (
        "<result>correct</result>", 1.0, True, second)
    assert second.closed  # the server ended the episode: its session is closed
    assert environment.step(first, "<guess>7</guess>")[:3] == ("<result>lower</result>",
                                                               WRONG, False)
    state = environment.server_state(first)
    assert state == {"episode_id": first.episode_id, "step_count": 2, "number": 5}
    # a turn with no call is answered here, not sent: the server's step count stays 2
    answer, reward, done, _ = environment.step(first, "<guess>9")
    assert (reward, done) == (0.0, False) and answer.startswith("<result>error: no call")
    assert environment.is_error(answer) and environment.is_parse_failure(answer)
    assert environment.server_state(first)["step_count"] == 2
    assert environment.step(first, "<guess>x</guess>")[:3] == ("<result>not a number</result>",
                                                               WRONG, False)
    # the fourth guess is the last: the server ends the episode; its return is 4 x WRONG
    assert environment.step(first, "<guess>9</guess>")[1:3] == (WRONG, True)
    assert first.closed and first.steps == 4
    # the rows of a group share a problem: the same seed, so the same game (the server
    # draws its number from the seed when the problem has no answer)
    no_answer = types.SimpleNamespace(id="shared")
    numbers = {environment.server_state(environment.reset(no_answer)[1])["number"]
               for _ in range(2)}
    seed = int.from_bytes(hashlib.sha256(b"shared").digest()[:4], "big") >> 1
    assert numbers == {seed % 16}


def test_an_action_the_servers_schema_refuses_is_an_error_observation(server):
    environment = make_environment(f"openenv:{server.url()},tag=guess,field=number")
    _, session = environment.reset(_example("5"))
    answer, reward, done, state = environment.step(session, "<guess>5</guess>")
    assert answer.startswith('<result>error: the server refused the action {"number": "5"}')
    assert "guess: Field required" in answer and (reward, done, state) == (0.0, False, session)
    assert environment.is_error(answer) and environment.is_parse_failure(answer)
    assert not session.closed  # the episode goes on


@pytest.mark.parametrize("name,message", [
    ("openenv:127.0.0.1:8000", "openenv:URL takes the server's base URL (http://host:port)"),
    ("openenv:http://127.0.0.1:x", "the port of 'http://127.0.0.1:x' is not a number"),
    ("openenv:http://h,tag=<b>", "tag must be a name"),
    ("openenv:http://h,timeout=0", "timeout must be a positive number of seconds"),
    ("openenv:http://h,parallel=0", "parallel must be an integer >= 1"),
    ("openenv:http://h,colour=red", "options are tag=, field=, observation=, timeout="),
    ("openenv:http://h,tag=a,tag=b", "option 'tag' given twice"),
])
def test_a_bad_name_is_one_line(name, message):
    error = environment_name_error(name)
    assert message in error and "\n" not in error
    with pytest.raises(ValueError, match="^tools: "):
        make_environment(name)


def test_a_name_parses_and_a_missing_package_names_the_extra(monkeypatch):
    environment = make_environment("openenv:https://env.example:8443/,tag=move,field=code,"
                                   "observation=stdout,timeout=2.5,parallel=3")
    assert environment.websocket_url == "wss://env.example:8443/ws"
    assert (environment.settings.field, environment.settings.observation) == ("code", "stdout")
    assert (environment.stop_text, environment.parallel_steps) == ("</move>", 3)
    assert environment.call_seconds == 4.5  # the call's timeout, closing and slack
    assert environment_name_error("openenv:http://127.0.0.1:1") is None
    for module in ("websockets", "websockets.sync", "websockets.sync.client"):
        monkeypatch.setitem(sys.modules, module, None)
    assert environment_name_error("openenv:http://127.0.0.1:1") == (
        'OpenEnv environments need the openenv-core package: pip install -e ".[openenv]"')
    with pytest.raises(ImportError, match=r'pip install -e "\.\[openenv\]"'):
        make_environment("openenv:http://127.0.0.1:1")


def test_the_config_takes_an_openenv_server_and_names_a_bad_one():
    from configs import tools as tools_config
    from grpo_jax.runner.validation import ConfigError, validate
    from grpo_jax.stages import KINDS

    config = tools_config.get_config("smoke")
    config.rl.tools = "openenv:http://127.0.0.1:1,tag=calc"
    config.rl.rewards.environment = 1.0  # the server's rewards: no network at validation
    validate(config, KINDS)
    config.rl.tools = "openenv:ftp://127.0.0.1:1"
    with pytest.raises(ConfigError) as error:
        validate(config, KINDS)
    assert "rl.tools: openenv:URL takes the server's base URL" in str(error.value)
    assert "\n" not in str(error.value)


class _Misbehaving:
    """A WebSocket server on 127.0.0.1 that answers each reset properly and each step as the
    URL's first path segment says: garbage, a wrong shape, a bad reward, the environment's
    error, silence, or the connection closed with no answer."""

    def __init__(self):
        from websockets.sync.server import serve

        self.server = serve(self._handle, "127.0.0.1", 0)
        self.port = self.server.socket.getsockname()[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, mode: str) -> str:
        return f"http://127.0.0.1:{self.port}/{mode}"

    @staticmethod
    def _handle(connection):
        mode = connection.request.path.split("/")[1]
        answers = {
            "garbage": "not json {",
            "shape": json.dumps({"type": "observation", "data": {"observation": "hi"}}),
            "reward": json.dumps({"type": "observation", "data": {
                "observation": {"m": "hi"}, "reward": "high", "done": False}}),
            "failing": json.dumps({"type": "error", "data": {"code": "EXECUTION_ERROR",
                                                             "message": "boom"}}),
        }
        for raw in connection:
            kind = json.loads(raw)["type"]
            if kind == "close":
                return
            if kind == "reset":
                connection.send(json.dumps({"type": "observation", "data": {
                    "observation": {"m": ""}, "reward": None, "done": False}}))
            elif mode in answers:
                connection.send(answers[mode])
            elif mode == "drop":
                return
            # "silent": no answer at all

    def close(self):
        self.server.shutdown()


@pytest.mark.parametrize("mode,reason", [
    ("garbage", "the server answered step with no JSON object: 'not json {'"),
    ("shape", "the answer's observation is not an object: 'hi'"),
    ("reward", "the answer's reward is not a number: 'high'"),
    ("failing", "the server's step failed: EXECUTION_ERROR: boom"),
    ("silent", "no answer within the timeout (step)"),
    ("drop", "the connection failed (step): ConnectionClosed"),
])
def test_a_server_that_misbehaves_is_an_error_observation_within_the_timeout(mode, reason):
    misbehaving = _Misbehaving()
    try:
        environment = make_environment(f"openenv:{misbehaving.url(mode)},tag=guess,"
                                       "field=guess,timeout=0.5")
        start = guarded_reset(environment, _example("5"))
        assert not start.failed and start.observation == ""  # the reset said nothing
        began = time.monotonic()
        answer = guarded_step(environment, start.state, "<guess>5</guess>")
        assert time.monotonic() - began < environment.call_seconds
        assert answer.failed and (answer.reward, answer.done) == (0.0, False)
        assert answer.observation.startswith("<result>error: environment step raised "
                                             "OpenEnvError")
        assert reason in answer.observation and environment.is_error(answer.observation)
        assert start.state.closed
        again = guarded_step(environment, start.state, "<guess>6</guess>")  # no second try
        assert again.failed and "the episode's session failed before" in again.observation
    finally:
        misbehaving.close()


def test_no_server_is_a_failed_reset_and_every_call_answers_its_error():
    environment = make_environment(f"openenv:http://127.0.0.1:{_free_port()},tag=guess,"
                                   "field=guess,timeout=2")
    start = guarded_reset(environment, _example("5"))
    assert start.failed and start.observation == ""
    assert isinstance(start.state, NotStarted) and "no session at ws://127.0.0.1:" in \
        start.state.reason and "ConnectionRefusedError" in start.state.reason
    answer = guarded_step(environment, start.state, "<guess>5</guess>")
    assert answer.failed and start.state.reason in answer.observation


def test_the_agents_smoke_job_plays_an_openenv_server_killed_mid_run(server, tmp_path,
                                                                     monkeypatch):
    """GRPO on the guessing task (configs/agents.py:tags_smoke, one block, shorter
    pretraining), its episodes played against the OpenEnv server: real gradients on the
    server's rewards. The test kills the server at the first step of the second rollout:
    that rollout's calls fail from there, every reset of the third fails, and the run
    finishes with the failures counted in tool_errors."""
    from configs import agents
    from grpo_jax.metrics import read_metrics
    from grpo_jax.pipeline import train_and_evaluate

    config = agents.get_config("tags_smoke")
    config.mesh.num_devices = 1
    config.model.num_layers = 1
    config.pretrain.steps = 30
    config.stages = "pretrain,rl"
    config.rl.tools = f"openenv:{server.url()},tag=guess"
    config.rl.steps = 3
    rows = config.rl.num_prompts * config.rl.group_size
    resets, killed = [], threading.Event()
    reset, step = OpenEnvEnvironment.reset, OpenEnvEnvironment.step

    def counted_reset(self, problem):
        resets.append(problem)
        return reset(self, problem)

    def step_or_kill(self, session, text):
        if len(resets) > rows and not killed.is_set():
            killed.set()
            server.kill()
        return step(self, session, text)

    monkeypatch.setattr(OpenEnvEnvironment, "reset", counted_reset)
    monkeypatch.setattr(OpenEnvEnvironment, "step", step_or_kill)
    train_and_evaluate(config, str(tmp_path))
    metrics = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["stage"] == "rl"]
    assert len(metrics) == 3 and len(resets) == 3 * rows and killed.is_set()
    alive, dying, dead = metrics
    # the server's per-step rewards (1 and WRONG = -1/8) reached the episodes and the
    # gradients: the mean over the rows of their sums is a nonzero multiple of 1 / (8 rows)
    returns = alive["reward/environment"] * 8 * rows
    assert alive["tool_calls"] > 0 and returns != 0 and returns == round(returns)
    assert alive["zero_std_groups"] < 1 and alive["grad_norm"] > 0
    assert dying["tool_errors"] > alive["tool_errors"]  # the calls after the kill
    # every episode's reset failed: one error each at least, no reward from the server
    assert dead["tool_errors"] >= 1.0 and dead["reward/environment"] == 0.0
