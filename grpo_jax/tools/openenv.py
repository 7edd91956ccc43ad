"""Environments served by OpenEnv (the openenv-core package): tool episodes played against an
environment server that speaks OpenEnv's protocol, written by anyone.

    environment = make_environment("openenv:http://127.0.0.1:8000,tag=guess")
    observation, session = environment.reset(example)      # "", a session on the server
    observation, reward, done, session = environment.step(session, "<guess>8</guess>")
    # "<result>higher</result>", -0.125, False: the server's observation, reward and end

The name (the config's `tools` field, `--config.rl.tools=openenv:URL,tag=guess`) is
`openenv:` + the server's base URL + options `,name=value`:

- `tag`: the policy's call is `<tag>argument</tag>`; its closing tag ends a turn ("action").
- `field`: the action's field the argument fills (`{"guess": "8"}`); by default the one
  field of the server's action schema (GET /schema) besides "metadata".
- `observation`: the observation's field the policy reads; by default the only field, or
  every field as one JSON object.
- `timeout`: the seconds one reset or step may take, connecting included (10).
- `parallel`: how many rows' steps are sent at once (8).

An episode is one OpenEnv session: a WebSocket to `URL/ws` (what OpenEnv's own `EnvClient`
opens) holding one environment instance on the server for the whole episode. Its messages
are OpenEnv's: `{"type": "reset", "data": {...}}`, `{"type": "step", "data": action}`,
`{"type": "state"}`, `{"type": "close"}`, answered by `{"type": "observation", "data":
{"observation": {...}, "reward": r, "done": d}}`, `{"type": "state", "data": {...}}` or
`{"type": "error", "data": {"code": ..., "message": ...}}`. OpenEnv's POST /reset and /step
build a fresh environment for each request (openenv-core 0.3), so an episode's state would
not survive from one turn to the next over them; only the action schema is read over HTTP.

`reset(problem)` sends `seed` (from the problem's id: the rows of a group, which share a
problem, play the same game), `episode_id` and `problem` ({"id", "prompt", "answer"}); the
server's environment receives those its `reset` takes. A step sends the turn's last call's
argument as the action's field; the reward (None: 0) and `done` are the server's, the
observation is written as `render` writes answers. A turn with no call, and an action the
server's schema refuses (its VALIDATION_ERROR), are answered "error: ..." without ending the
episode, and counted as errors and parse failures.

Whatever else goes wrong (no server, a closed connection, no answer within `timeout`, an
answer of another shape, the server's own error) raises `OpenEnvError`, which the guard
(`tools.guard`) answers with an error observation counted in `tool_errors`; the session is
closed and its later steps fail the same way (the episode's state on the server is gone).
A session is closed when the server ends its episode or its state is dropped, so the
server's `max_concurrent_envs` must hold the rows sampled at once (a batch).
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import math
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
import weakref
from collections.abc import Callable
from typing import Any

from grpo_jax.tools.environment import Environment, render_observation

PREFIX = "openenv:"
INSTALL = 'pip install -e ".[openenv]"'
DEFAULT_TAG = "action"
DEFAULT_TIMEOUT = 10.0
DEFAULT_PARALLEL = 8
MAX_OBSERVATION_CHARS = 2000  # an observation's text is cut to this many characters
MAX_MESSAGE_BYTES = 1 << 20  # the largest answer read from the server
MAX_DETAIL_CHARS = 120  # of a server's error message in an observation or error line
CLOSE_SECONDS = 2.0  # how long a session's end waits for the server to close its WebSocket
NO_CALL = "error: no call"  # a turn without `<tag>...</tag>`
REFUSED = "error: the server refused the action"  # the server's VALIDATION_ERROR
LOOPBACK = ("127.0.0.1", "localhost", "::1")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*\Z")


class OpenEnvError(RuntimeError):
    """A reset or step the server did not answer as OpenEnv's protocol says (one line)."""


@dataclasses.dataclass(frozen=True)
class OpenEnvSettings:
    """An `openenv:` name's parts (module docstring)."""

    base_url: str
    tag: str = DEFAULT_TAG
    field: str = ""
    observation: str = ""
    timeout: float = DEFAULT_TIMEOUT
    parallel: int = DEFAULT_PARALLEL


def missing_package() -> str | None:
    """Why OpenEnv environments cannot run here (the WebSocket client openenv-core installs
    is missing), or None."""
    try:
        import websockets.sync.client  # noqa: F401
    except ImportError:
        return f"OpenEnv environments need the openenv-core package: {INSTALL}"
    return None


def parse_name(name: str) -> OpenEnvSettings:
    """The settings of `openenv:URL[,option=value...]`; ValueError (one line, naming what
    was expected) when it is not one."""
    if not name.startswith(PREFIX):
        raise ValueError(f"an OpenEnv environment's name starts with {PREFIX!r}, got {name!r}")
    url, *options = name[len(PREFIX):].split(",")
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{PREFIX}URL takes the server's base URL (http://host:port), got "
                         f"{url.strip()!r}")
    try:
        parts.port  # noqa: B018  (raises on a port that is not a number)
    except ValueError:
        raise ValueError(f"{PREFIX}URL: the port of {url.strip()!r} is not a number") from None
    values: dict[str, Any] = {"base_url": url.strip().rstrip("/")}
    for option in options:
        key, sep, value = (s.strip() for s in option.partition("="))
        if not sep or key not in ("tag", "field", "observation", "timeout", "parallel"):
            raise ValueError(f"{PREFIX}URL options are tag=, field=, observation=, timeout=, "
                             f"parallel=; got {option.strip()!r}")
        if key in values:
            raise ValueError(f"{PREFIX}URL: option {key!r} given twice")
        if key in ("tag", "field", "observation"):
            if not _IDENTIFIER.match(value):
                raise ValueError(f"{PREFIX}URL: {key} must be a name (letters, digits, _ "
                                 f"and -), got {value!r}")
            values[key] = value
        elif key == "timeout":
            try:
                seconds = float(value)
            except ValueError:
                seconds = math.nan
            if not (math.isfinite(seconds) and seconds > 0):
                raise ValueError(f"{PREFIX}URL: timeout must be a positive number of "
                                 f"seconds, got {value!r}")
            values[key] = seconds
        else:
            if not (value.isdigit() and int(value) >= 1):
                raise ValueError(f"{PREFIX}URL: parallel must be an integer >= 1, got "
                                 f"{value!r}")
            values[key] = int(value)
    return OpenEnvSettings(**values)


def name_error(name: str) -> str | None:
    """Why `name` is no OpenEnv environment's name or cannot run here, or None."""
    try:
        parse_name(name)
    except ValueError as err:
        return str(err)
    return missing_package()


def _one_line(text, limit: int = MAX_DETAIL_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _close(connection) -> None:
    """Ends a session: OpenEnv's close message, then the server's closing of the WebSocket,
    waited for at most CLOSE_SECONDS before closing it from this side (best effort: the
    server may be gone). A server closes first: an openenv-core server under uvicorn
    stops accepting sessions once a client has closed the WebSocket under it."""
    try:
        connection.send(json.dumps({"type": "close"}))
        deadline = time.monotonic() + CLOSE_SECONDS
        while time.monotonic() < deadline:  # answers still in flight, then the close
            connection.recv(timeout=max(deadline - time.monotonic(), 1e-3))
    except Exception:  # noqa: BLE001  (closed: what was waited for)
        pass
    try:
        connection.close()
    except Exception:  # noqa: BLE001
        pass


def _close_later(connection) -> None:
    """`_close` in a daemon thread of its own: a dropped state never waits on the server."""
    threading.Thread(target=_close, args=(connection,), name="grpo_openenv_close",
                     daemon=True).start()


class Session:
    """One episode on the server (an `OpenEnvEnvironment`'s episode state): its WebSocket,
    its `episode_id` and the steps the server answered. Closed when the server ends the
    episode, when a call fails (`failure` says why) or when dropped."""

    def __init__(self, connection, episode_id: str):
        self.episode_id = episode_id
        self.steps = 0
        self.failure: str | None = None
        self._connection = connection
        self._lock = threading.Lock()  # one message and its answer at a time
        self._finalizer = weakref.finalize(self, _close_later, connection)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        self._finalizer()

    def exchange(self, message: dict, deadline: float) -> dict:
        """The server's answer to `message` (a JSON object), by `deadline` (monotonic
        seconds); OpenEnvError, with the session closed, when there is none."""
        with self._lock:
            if self.failure is not None:
                raise OpenEnvError(f"the episode's session failed before: {self.failure}")
            if self.closed:
                raise OpenEnvError("the episode's session is closed (the server ended it)")
            try:
                self._connection.send(json.dumps(message))
                raw = self._connection.recv(timeout=max(deadline - time.monotonic(), 1e-3))
            except TimeoutError:
                why = f"no answer within the timeout ({message['type']})"
            except Exception as err:  # noqa: BLE001  (closed, reset, refused, ...)
                why = _one_line(f"the connection failed ({message['type']}): "
                                f"{type(err).__name__}: {err}")
            else:
                try:
                    answer = json.loads(raw)
                except (TypeError, ValueError):
                    answer = None
                if isinstance(answer, dict):
                    return answer
                why = _one_line(f"the server answered {message['type']} with no JSON "
                                f"object: {raw!r}")
            self.failure = why
            self.close()
            raise OpenEnvError(why)


def _result(answer: dict) -> tuple[dict, float, bool]:
    """(observation fields, reward, done) of an observation answer; OpenEnvError for an
    answer of another shape."""
    data = answer.get("data")
    if answer.get("type") != "observation" or not isinstance(data, dict):
        raise OpenEnvError(_one_line(f"expected an observation answer, got {answer!r}"))
    observation, reward, done = data.get("observation"), data.get("reward"), data.get("done")
    if not isinstance(observation, dict):
        raise OpenEnvError(_one_line(f"the answer's observation is not an object: "
                                     f"{observation!r}"))
    if reward is None:  # OpenEnv's reward is a bool, an int, a float or None
        reward = 0.0
    if not isinstance(reward, (bool, int, float)):
        raise OpenEnvError(_one_line(f"the answer's reward is not a number: {reward!r}"))
    if not isinstance(done, bool):
        raise OpenEnvError(_one_line(f"the answer's done is not true or false: {done!r}"))
    return observation, float(reward), done


def _seed(problem) -> int | None:
    """A reset seed in [0, 2**31) from the problem's id (None without one)."""
    problem_id = getattr(problem, "id", None)
    if problem_id is None:
        return None
    return int.from_bytes(hashlib.sha256(str(problem_id).encode()).digest()[:4], "big") >> 1


class OpenEnvEnvironment(Environment):
    """The environment served at `settings.base_url` (module docstring).

    Attributes:
      settings: the server's URL and the options of its name (`OpenEnvSettings`).
      render: the observation's text as the context sees it.
    """

    gives_rewards = True

    def __init__(self, settings: OpenEnvSettings, *,
                 render: Callable[[str], str] = render_observation):
        if missing_package():
            raise ImportError(missing_package())
        self.settings = settings
        self.render = render
        self.parallel_steps = settings.parallel
        # the guard's wall bound: the call's own deadline, then closing the session (1 s)
        # and a second of slack
        self.call_seconds = settings.timeout + 2.0
        self._field = settings.field
        self._field_lock = threading.Lock()
        self._call = re.compile(rf"<{re.escape(settings.tag)}>(.*?)</{re.escape(settings.tag)}>",
                                re.DOTALL)
        marker = "\x00"
        rendered = render(marker)
        self._error_prefix = (rendered[:rendered.index(marker)] if marker in rendered
                              else "") + "error:"
        loopback = urllib.parse.urlsplit(settings.base_url).hostname in LOOPBACK
        self._proxy = None if loopback else True  # no proxy between us and a loopback server
        self._opener = (urllib.request.build_opener(urllib.request.ProxyHandler({}))
                        if loopback else urllib.request.build_opener())

    @classmethod
    def from_name(cls, name: str, *, render: Callable[[str], str] = render_observation
                  ) -> OpenEnvEnvironment:
        """The environment of an `openenv:URL[,option=value...]` name."""
        try:
            settings = parse_name(name)
        except ValueError as err:
            raise ValueError(f"tools: {err}") from None
        return cls(settings, render=render)

    @property
    def stop_text(self) -> str:
        return f"</{self.settings.tag}>"

    @property
    def websocket_url(self) -> str:
        """`base_url/ws` as a ws:// (wss://) URL."""
        scheme, rest = self.settings.base_url.split("://", 1)
        return f"{'wss' if scheme == 'https' else 'ws'}://{rest}/ws"

    def get(self, path: str, deadline: float | None = None) -> Any:
        """The JSON the server answers GET `path` with; OpenEnvError when it does not."""
        deadline = time.monotonic() + self.settings.timeout if deadline is None else deadline
        url = self.settings.base_url + path
        try:
            with self._opener.open(url, timeout=max(deadline - time.monotonic(), 1e-3)) as r:
                return json.loads(r.read(MAX_MESSAGE_BYTES))
        except Exception as err:  # noqa: BLE001
            raise OpenEnvError(_one_line(f"GET {url} failed: {type(err).__name__}: {err}")
                               ) from None

    def action_field(self, deadline: float | None = None) -> str:
        """The action's field a call's argument fills: `settings.field`, else the one field
        of the server's action schema besides "metadata" (read once)."""
        with self._field_lock:
            if not self._field:
                schema = self.get("/schema", deadline)
                action = schema.get("action") if isinstance(schema, dict) else None
                properties = action.get("properties") if isinstance(action, dict) else None
                if not isinstance(properties, dict):
                    raise OpenEnvError(_one_line(f"GET /schema has no action properties: "
                                                 f"{schema!r}"))
                fields = sorted(set(properties) - {"metadata"})
                required = [f for f in action.get("required") or () if f in fields]
                if len(required) == 1:
                    fields = required
                if len(fields) != 1:
                    raise OpenEnvError(f"the server's action has fields {fields}: name the "
                                       f"one a call fills ({PREFIX}URL,field=NAME)")
                self._field = fields[0]
            return self._field

    def check(self) -> str:
        """Raises OpenEnvError (one line) unless the server answers GET /health as healthy
        and its action schema gives a field; returns the field."""
        health = self.get("/health")
        if not (isinstance(health, dict) and health.get("status") == "healthy"):
            raise OpenEnvError(_one_line(f"GET /health answered {health!r}, not healthy"))
        return self.action_field()

    def text(self, observation: dict) -> str:
        """The text of an observation's fields the policy reads (module docstring), cut to
        MAX_OBSERVATION_CHARS."""
        name = self.settings.observation
        if name:
            if name not in observation:
                raise OpenEnvError(f"the observation has no field {name!r} (fields: "
                                   f"{sorted(observation)})")
            value = observation[name]
        elif len(observation) == 1:
            value = next(iter(observation.values()))
        else:
            value = observation
        text = value if isinstance(value, str) else json.dumps(
            value, sort_keys=True, separators=(",", ":"), default=str)
        return text if len(text) <= MAX_OBSERVATION_CHARS else \
            text[:MAX_OBSERVATION_CHARS - 3] + "..."

    def reset(self, problem) -> tuple[str, Session]:
        deadline = time.monotonic() + self.settings.timeout
        from websockets.sync.client import connect

        # a connection returned directly (websockets 17 warns unless asked for by `legacy`)
        legacy = {"legacy": True} if "legacy" in inspect.signature(connect).parameters else {}
        try:
            connection = connect(self.websocket_url, **legacy,
                                 open_timeout=max(deadline - time.monotonic(), 1e-3),
                                 close_timeout=1.0, ping_interval=None,
                                 max_size=MAX_MESSAGE_BYTES, proxy=self._proxy)
        except Exception as err:  # noqa: BLE001
            raise OpenEnvError(_one_line(f"no session at {self.websocket_url}: "
                                         f"{type(err).__name__}: {err}")) from None
        session = Session(connection, episode_id=uuid.uuid4().hex)
        data = {"episode_id": session.episode_id,
                "problem": {name: getattr(problem, name, None)
                            for name in ("id", "prompt", "answer")}}
        seed = _seed(problem)
        if seed is not None:
            data["seed"] = seed
        answer = session.exchange({"type": "reset", "data": data}, deadline)
        try:
            if answer.get("type") == "error":
                raise OpenEnvError(self._server_error(answer, "reset"))
            observation, _, done = _result(answer)
            if done:
                raise OpenEnvError("the server ended the episode at its reset")
            text = self.text(observation)
        except OpenEnvError as err:
            session.failure = str(err)
            session.close()
            raise
        return (self.render(text) if text else ""), session

    def step(self, session: Session, action_text: str) -> tuple[str, float, bool, Session]:
        deadline = time.monotonic() + self.settings.timeout
        calls = self._call.findall(action_text)
        if not calls:
            return (self.render(f"{NO_CALL}: <{self.settings.tag}>...</{self.settings.tag}> "
                                "holds the action"), 0.0, False, session)
        if not isinstance(session, Session):
            raise OpenEnvError(f"step: expected the Session reset made, got "
                               f"{type(session).__name__}")
        action = {self.action_field(deadline): calls[-1].strip()}
        answer = session.exchange({"type": "step", "data": action}, deadline)
        if answer.get("type") == "error":
            data = answer.get("data")
            if isinstance(data, dict) and data.get("code") == "VALIDATION_ERROR":
                errors = data.get("errors")
                detail = "; ".join(
                    f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg', '')}"
                    for e in errors if isinstance(e, dict)) \
                    if isinstance(errors, list) else data.get("message", "")
                return (self.render(_one_line(f"{REFUSED} {json.dumps(action)}: {detail}",
                                              2 * MAX_DETAIL_CHARS)), 0.0, False, session)
            why = self._server_error(answer, "step")
            session.failure = why
            session.close()
            raise OpenEnvError(why)
        try:
            observation, reward, done = _result(answer)
            text = self.text(observation)
        except OpenEnvError as err:
            session.failure = str(err)
            session.close()
            raise
        session.steps += 1
        if done:
            session.close()
        return self.render(text), reward, done, session

    def server_state(self, session: Session) -> dict:
        """The server's state of the episode (OpenEnv's "state" message: `episode_id`,
        `step_count` and the environment's own fields)."""
        answer = session.exchange({"type": "state"},
                                  time.monotonic() + self.settings.timeout)
        if answer.get("type") != "state" or not isinstance(answer.get("data"), dict):
            raise OpenEnvError(_one_line(f"expected a state answer, got {answer!r}"))
        return answer["data"]

    @staticmethod
    def _server_error(answer: dict, what: str) -> str:
        data = answer.get("data")
        data = data if isinstance(data, dict) else {}
        return _one_line(f"the server's {what} failed: {data.get('code', 'no code')}: "
                         f"{data.get('message', '')}", 2 * MAX_DETAIL_CHARS)

    def is_error(self, observation_text: str) -> bool:
        """Whether an observation reports a failed call (an "error: ..." line)."""
        return observation_text.startswith(self._error_prefix)

    def is_parse_failure(self, observation_text: str) -> bool:
        """Whether it reports a turn with no call or an action the server's schema refused."""
        prefix = self._error_prefix[:-len("error:")]
        return observation_text.startswith((prefix + NO_CALL, prefix + REFUSED))
