"""Helpers for tests and benchmarks that talk to a real daphne process over real sockets.

    with DaphneServer() as server:            # free port, `manage.py serve`, waits until it listens
        result = asyncio.run(run_session(server.ws_url, {"stream_audio": True}, ["Hello. "]))
        assert result.close_code == 1000
    assert "Traceback" not in server.stderr_text()

A test module served by one daphne for all its tests declares its fixtures with `module_server`:

    server = module_server()                  # the `server` fixture: Hibari, no API keys
    healthy = healthy_after_each()            # after each test: no traceback, the server alive

`DaphneServer` runs `manage.py migrate` into a private SQLite file first (unless told not to), so
it never touches the project's own database, and captures the server's stdout and stderr in files
of its own temporary folder. On exit it sends SIGTERM and waits (bounded) for the process to end.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
WS_PATH = "/v1/audio/speech/stream"

START_TIMEOUT_S = 90.0  # engine warm-up included; a hang guard, not a timing assertion
STOP_TIMEOUT_S = 20.0


def free_port(host="127.0.0.1"):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_accepts(host, port, timeout=0.5):
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


WAIT_S = 30.0  # hang guard of wait_for: servers settle on their own, a hang must still fail


def wait_for(predicate, what, timeout=WAIT_S, interval=0.02):
    """Bounded poll for a state the servers reach on their own: predicate()'s first truthy value,
    or AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout} s")


class ServerFailed(RuntimeError):
    pass


_MIGRATED: dict[tuple[str, str], Path] = {}  # (checkout, interpreter) -> a migrated sqlite database


def _run_migrate(root, python, env):
    done = subprocess.run(
        [python, "manage.py", "migrate", "--noinput"], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise ServerFailed(f"manage.py migrate failed:\n{done.stdout}\n{done.stderr}")


@atexit.register
def _forget_migrated():
    for template in _MIGRATED.values():
        shutil.rmtree(template.parent, ignore_errors=True)


class DaphneServer:
    """`manage.py serve` in a subprocess on a free port, as a context manager."""

    def __init__(
        self,
        env=None,
        *,
        host="127.0.0.1",
        port=None,
        migrate=True,
        start_timeout=START_TIMEOUT_S,
        stop_timeout=STOP_TIMEOUT_S,
        attempts=3,
        root=PROJECT_ROOT,
        python=PYTHON,
    ):
        self.root = Path(root)  # the checkout whose manage.py runs (bench/compare.py starts another one's)
        self.python = python  # the server's interpreter (integrations/ runs its tests in a venv of its own)
        self.host = host
        self.fixed_port = port  # None: a free port is picked (and another one tried if it was taken)
        self.extra_env = dict(env or {})
        self.migrate = migrate
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.attempts = attempts
        self.port = None
        self.proc = None
        self.workdir = None
        self.stdout_path = None
        self.stderr_path = None
        self.returncode = None
        self.stopped_by_sigterm = None  # after stop(): True if SIGTERM ended it within stop_timeout

    # -- addresses ---------------------------------------------------------------------------
    @property
    def ws_url(self):
        return f"ws://{self.host}:{self.port}{WS_PATH}"

    @property
    def http_url(self):
        return f"http://{self.host}:{self.port}"

    # -- environment ---------------------------------------------------------------------------
    def environment(self):
        env = dict(os.environ)
        env.setdefault("DJANGO_SETTINGS_MODULE", "ttsproject.settings")
        env["DATABASE_URL"] = f"sqlite:///{self.workdir / 'db.sqlite3'}"
        env["PYTHONUNBUFFERED"] = "1"
        env.pop("PORT", None)
        env.pop("HOST", None)
        env.update(self.extra_env)
        return env

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self):
        self.workdir = Path(tempfile.mkdtemp(prefix="daphne-test-"))
        self.stdout_path = self.workdir / "stdout.log"
        self.stderr_path = self.workdir / "stderr.log"
        env = self.environment()
        if self.migrate:
            self._migrate(env)
        last_error = None
        for _ in range(1 if self.fixed_port else self.attempts):
            try:
                self._spawn(env)
                return self
            except ServerFailed as exc:  # most likely the free port was taken in between: try another
                last_error = exc
                if "Address already in use" not in str(exc) and "CannotListenError" not in str(exc):
                    break
        raise last_error

    def _migrate(self, env):
        """`manage.py migrate` into the server's database. Its own sqlite file is a copy of one migrated
        once per checkout and interpreter in this process (a migrate costs about a second a server)."""
        own = self.workdir / "db.sqlite3"
        if env["DATABASE_URL"] != f"sqlite:///{own}":
            _run_migrate(self.root, self.python, env)
            return
        key = (str(self.root), self.python)
        if key not in _MIGRATED:
            template = Path(tempfile.mkdtemp(prefix="migrated-")) / "db.sqlite3"
            _run_migrate(self.root, self.python, {**env, "DATABASE_URL": f"sqlite:///{template}"})
            _MIGRATED[key] = template
        shutil.copyfile(_MIGRATED[key], own)

    def _spawn(self, env):
        self.port = self.fixed_port or free_port(self.host)
        if port_accepts(self.host, self.port):
            raise ServerFailed(f"port {self.port} is already in use (Address already in use)")
        with open(self.stdout_path, "ab") as out, open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(
                [self.python, "manage.py", "serve", "--host", self.host, "--port", str(self.port)],
                cwd=self.root,
                env=env,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.returncode = self.proc.returncode
                raise ServerFailed(f"server exited with {self.proc.returncode} before listening:\n{self.stderr_text()[-4000:]}")
            if port_accepts(self.host, self.port):
                return
            time.sleep(0.05)
        self.kill()
        raise ServerFailed(
            f"server did not listen on port {self.port} within {self.start_timeout} s:\n{self.stderr_text()[-4000:]}"
        )

    def stop(self):
        """SIGTERM, then wait up to stop_timeout; SIGKILL only if that did not end it."""
        if self.proc is None or self.returncode is not None:
            return self.returncode
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=self.stop_timeout)
                self.stopped_by_sigterm = True
            except subprocess.TimeoutExpired:
                self.stopped_by_sigterm = False
                self.kill()
        self.returncode = self.proc.returncode
        return self.returncode

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=self.stop_timeout)
        if self.proc is not None:
            self.returncode = self.proc.returncode

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def cleanup(self):
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.stop()
        return False

    # -- logs ----------------------------------------------------------------------------------
    def stdout_text(self):
        return self.stdout_path.read_text(errors="replace") if self.stdout_path and self.stdout_path.exists() else ""

    def stderr_text(self):
        return self.stderr_path.read_text(errors="replace") if self.stderr_path and self.stderr_path.exists() else ""

    def manage(self, *args):
        """`manage.py ARGS` with this server's environment (its database): what it printed."""
        done = subprocess.run(
            [self.python, "manage.py", *args],
            cwd=self.root,
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def create_api_key(self, name, *extra):
        """`manage.py create_api_key NAME [extra]`: the key it prints."""
        return self.manage("create_api_key", name, *extra).strip().splitlines()[-1]

    def assert_no_traceback(self):
        text = self.stderr_text()
        assert "Traceback" not in text, f"server stderr holds a traceback:\n{text[-6000:]}"

    # -- HTTP ------------------------------------------------------------------------------------
    def get_json(self, path, timeout=10.0):
        with urllib.request.urlopen(self.http_url + path, timeout=timeout) as response:
            return response.status, response.headers.get("Content-Type", ""), json.loads(response.read())


# -- WebSocket sessions --------------------------------------------------------------------------

RECV_TIMEOUT_S = 60.0  # hang guard for one frame


@dataclass
class Item:
    kind: str  # "event" or "audio"
    data: object  # dict for events, bytes for audio
    at: float  # time.perf_counter() at arrival


@dataclass
class Segment:
    index: int
    start: dict | None = None
    frames: list[bytes] = field(default_factory=list)
    done: dict | None = None
    errors: list[dict] = field(default_factory=list)

    @property
    def audio(self):
        return b"".join(self.frames)


@dataclass
class SessionResult:
    configured: dict | None = None
    items: list[Item] = field(default_factory=list)
    close_code: int | None = None
    close_reason: str = ""

    @property
    def events(self):
        return [item.data for item in self.items if item.kind == "event"]

    def types(self):
        return [event["type"] for event in self.events]

    def of_type(self, kind):
        return [event for event in self.events if event["type"] == kind]

    @property
    def audio_frames(self):
        return [item.data for item in self.items if item.kind == "audio"]


def segments_of(items):
    """Group items by segment, checking the ordering rules of docs/protocol.md on the way.

    Returns (segments in order of audio.start/error, problems): problems lists every binary frame
    outside an audio.start..audio.done pair and every event of a segment out of place."""
    segments = {}
    order = []
    problems = []
    current = None
    for position, item in enumerate(items):
        if item.kind == "audio":
            if current is None:
                problems.append(f"binary frame at {position} outside audio.start..audio.done")
            else:
                current.frames.append(item.data)
            continue
        event = item.data
        kind = event.get("type")
        if kind == "audio.start":
            if current is not None:
                problems.append(f"audio.start of {event['sentence_index']} at {position} before audio.done of {current.index}")
            index = event["sentence_index"]
            if index in segments:
                problems.append(f"sentence_index {index} announced twice")
            current = segments[index] = Segment(index, start=event)
            order.append(index)
        elif kind == "audio.done":
            index = event["sentence_index"]
            segment = segments.get(index)
            if segment is None:  # a failing segment without audio: error then audio.done
                segment = segments[index] = Segment(index)
                order.append(index)
            elif current is not None and current.index != index:
                problems.append(f"audio.done of {index} at {position} while {current.index} is open")
            segment.done = event
            current = None
        elif kind == "error" and "sentence_index" in event:
            index = event["sentence_index"]
            segment = segments.get(index)
            if segment is None:
                segment = segments[index] = Segment(index)
                order.append(index)
            segment.errors.append(event)
    return [segments[index] for index in order], problems


def cancelled_segments(items, session_id):
    """The segments of a session's `items` up to its input.cancelled, in protocol order: those before
    the last whole, the last one cut (its audio.done says cancelled and counts exactly the bytes the
    client got). Returns (segments, the cut one)."""
    segments, problems = segments_of(items)
    assert problems == []
    cut = segments[-1]
    assert cut.done == {
        "type": "audio.done",
        "id": f"{session_id}-{cut.index}",
        "sentence_index": cut.index,
        "total_bytes": len(cut.audio),
        "error": False,
        "cancelled": True,
    }
    assert all(not s.done["cancelled"] and s.done["total_bytes"] == len(s.audio) for s in segments[:-1])
    return segments, cut


SMALL_RECEIVE_BUFFER = 16384


CLOSE_TIMEOUT_S = 2.0


async def open_session(url, *, origin=None, headers=None, open_timeout=30.0, small_buffers=False, **kwargs):
    """A websockets client connection with no incoming size limit (server audio can be large).

    small_buffers: the client's socket takes 16 KiB and its library queues two frames, so that when
    the test stops reading, the server holds the session (backpressure) after a few seconds of audio
    instead of after the megabytes a receive buffer autotunes to (see `held`)."""
    if small_buffers:
        host, port = urlsplit(url).hostname, urlsplit(url).port
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_RECEIVE_BUFFER)  # before connect: the window
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
        kwargs.update(sock=sock, max_queue=2)
    # proxy=None: the servers are local, and websockets would otherwise read the proxy settings from the
    # environment on every connection (0.6 ms of the benchmarks' client CPU per session, on the server's cores).
    kwargs.setdefault("proxy", None)
    # A test closing a session whose server is gone or holds it (backpressure) gets no close frame back:
    # websockets' default waits 10 s for it. A live server answers a close in milliseconds.
    kwargs.setdefault("close_timeout", CLOSE_TIMEOUT_S)
    return await connect(url, origin=origin, additional_headers=headers, max_size=None, open_timeout=open_timeout, **kwargs)


def audio_past(seconds, rate=24000):
    """collect() predicate: true once more than `seconds` of 16-bit audio at `rate` has arrived."""
    received = 0

    def check(item):
        nonlocal received
        if item.kind == "audio":
            received += len(item.data)
        return received > seconds * rate * 2

    return check


def metric(server, name, **labels):
    """The value of a metric in `server`'s /metrics (Prometheus text format). With `labels`, the
    child with exactly those labels, 0 while it has not been created yet (nothing counted)."""
    series = name + ("{" + ",".join(f'{key}="{value}"' for key, value in labels.items()) + "}" if labels else "")
    with urllib.request.urlopen(f"{server.http_url}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(series + " "):
                return float(line.split()[1])
    if labels:
        return 0.0
    raise AssertionError(f"{name} is not in /metrics")


def held(server, sessions=1):
    """Wait (bounded) until `server` holds at least `sessions` sessions whose clients stopped
    reading: their delivery waits mid-segment, seen from the server's side. A hold is taken as
    settled when two scrapes in a row see the sessions held and no audio sent in between (a client
    that is still draining the socket pauses the server only for the moment a write takes)."""
    last = None

    def settled():
        nonlocal last
        now = metric(server, "speech_sessions_held") >= sessions, metric(server, "speech_audio_sent_bytes_total")
        stable, last = now[0] and last == now, now
        return stable

    wait_for(settled, f"{sessions} held session(s)")


async def send_json(ws, payload):
    await ws.send(json.dumps(payload))


async def configure(ws, config=None, *, nested=True, timeout=RECV_TIMEOUT_S):
    """Send session.config and return the session.configured event (AssertionError otherwise)."""
    config = dict(config or {})
    payload = {"type": "session.config", "session": config} if nested else {"type": "session.config", **config}
    await send_json(ws, payload)
    reply = await recv_item(ws, timeout=timeout)
    assert reply.kind == "event" and reply.data.get("type") == "session.configured", f"no session.configured: {reply}"
    return reply.data


async def recv_item(ws, timeout=RECV_TIMEOUT_S):
    """The next frame as an Item; raises ConnectionClosed at the end and TimeoutError on a hang."""
    message = await asyncio.wait_for(ws.recv(), timeout)
    now = time.perf_counter()
    if isinstance(message, bytes):
        return Item("audio", message, now)
    return Item("event", json.loads(message), now)


async def finish_and_drain(ws):
    """Send input.done and read to the close, so the server is idle before the next measurement;
    an `error` event raises, and the close must be 1000."""
    await ws.send(json.dumps({"type": "input.done"}))
    while True:
        try:
            item = await recv_item(ws)
        except (ConnectionClosed, TimeoutError):
            break
        if item.kind == "event" and item.data["type"] == "error":
            raise RuntimeError(item.data)
    assert ws.close_code == 1000, ws.close_code


async def collect(ws, result=None, *, until=None, timeout=RECV_TIMEOUT_S):
    """Receive into result.items until the socket closes, or until `until(item)` is true (that item
    included). Sets close_code/close_reason when the socket closed."""
    result = result or SessionResult()
    while True:
        try:
            item = await recv_item(ws, timeout=timeout)
        except ConnectionClosed:
            result.close_code = ws.close_code
            result.close_reason = ws.close_reason or ""
            return result
        result.items.append(item)
        if until is not None and until(item):
            return result


def is_event(kind):
    return lambda item: item.kind == "event" and item.data.get("type") == kind


async def run_session(url, config=None, texts=(), *, done=True, timeout=RECV_TIMEOUT_S, **connect_kwargs):
    """One whole session: config, each text as an input.text, input.done, then everything until close."""
    result = SessionResult()
    ws = await open_session(url, **connect_kwargs)
    try:
        result.configured = await configure(ws, config, timeout=timeout)
        for text in texts:
            await send_json(ws, {"type": "input.text", "text": text})
        if done:
            await send_json(ws, {"type": "input.done"})
        await collect(ws, result, timeout=timeout)
    finally:
        await ws.close()
    return result


async def wait_closed(ws, timeout=RECV_TIMEOUT_S):
    """Drain whatever is left and return (close code, events received meanwhile)."""
    result = await collect(ws, timeout=timeout)
    return result.close_code, result


@contextlib.asynccontextmanager
async def session(url, config=None, **kwargs):
    """`async with session(url, {...}) as (ws, configured):` — configured, closed on exit."""
    ws = await open_session(url, **kwargs)
    try:
        configured = await configure(ws, config)
        yield ws, configured
    finally:
        await ws.close()


@contextlib.contextmanager
def serving(env):
    """A DaphneServer for a test module. At the end SIGTERM must stop it with exit status 0 and
    no traceback in its log."""
    srv = DaphneServer(env).start()
    try:
        yield srv
    finally:
        code = srv.stop()
    srv.assert_no_traceback()
    assert srv.stopped_by_sigterm, "the server did not stop on SIGTERM within the bounded wait"
    assert code == 0, f"server exit status {code} after SIGTERM"
    srv.cleanup()


HIBARI = {"SPEECH_ENGINE": "hibari", "SPEECH_REQUIRE_API_KEY": "false"}


class Instances:
    """Daphne instances sharing one SQLite file and one media folder (in a temporary folder of their
    own), as a deployment's instances share a database; `env` adds settings (Hibari, no API keys,
    unless it says otherwise). The first instance started migrates the database."""

    def __init__(self, prefix, env):
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.db = self.dir / "db.sqlite3"
        self.env = {**HIBARI, "DATABASE_URL": f"sqlite:///{self.db}", "MEDIA_ROOT": str(self.dir / "media"), **env}
        self.servers = []
        self.codes = []

    def server(self, instance, env=None):
        """A started instance named `instance` (SPEECH_INSTANCE_ID), `env` added to the shared settings."""
        server = DaphneServer({**self.env, **(env or {}), "SPEECH_INSTANCE_ID": instance}, migrate=not self.servers)
        server.start()
        self.servers.append(server)
        return server

    def stop(self):
        """SIGTERM to every instance, in the order they started; their exit statuses are kept for `remove`."""
        self.codes = [(server, server.stop()) for server in self.servers]

    def remove(self):
        """After `stop`: no instance wrote a traceback, and each exited with status 0 (one a test killed,
        marked `server.killed`, with any); then their files go."""
        for server, code in self.codes:
            server.assert_no_traceback()
            if not getattr(server, "killed", False):
                assert code == 0, f"server exit status {code}:\n{server.stderr_text()[-3000:]}"
        for server in self.servers:
            server.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)


def module_server(env=HIBARI):
    """A test module's `server` fixture: one daphne for the module's tests (`serving(env)`)."""

    @pytest.fixture(scope="module", name="server")
    def server():
        with serving(env) as srv:
            yield srv

    return server


def healthy_after_each():
    """An autouse fixture of a module with a `server` fixture: after each test, the server wrote no
    traceback and did not die (`assert_healthy`)."""

    @pytest.fixture(autouse=True)
    def healthy(server):
        yield
        assert_healthy(server)

    return healthy


def assert_healthy(*servers, stopped_ok=False):
    """After a test: no server wrote a traceback, and none died (`stopped_ok`: one the test stopped
    cleanly, exit status 0, is fine)."""
    for server in servers:
        server.assert_no_traceback()
        alive = server.alive() or (stopped_ok and server.proc.returncode == 0)
        assert alive, f"a server died:\n{server.stderr_text()[-4000:]}"
