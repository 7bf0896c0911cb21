"""The deployment of docker/compose.yaml, run on this machine without docker (`pytest -m deploy`).

nginx (Debian's, with docker/nginx/speech.conf.template) in front of two daphne instances
(`manage.py serve`, the compose services' command), a private redis-server and a fresh PostgreSQL
database migrated once by the compose `migrate` service's command, voices in one shared directory.
The SQLite single-container mode runs the Dockerfile's own CMD and HEALTHCHECK, with /data mapped
to a temporary folder. Which instance served what is read from nginx's access log and the session
registry in PostgreSQL, never assumed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from .support import audio_samples as samples
from .support.deploy import DOCKER, Nginx, PostgresDatabase, dockerfile, http, local_environment, needs_postgres
from .support.live import (
    PROJECT_ROOT,
    DaphneServer,
    collect,
    configure,
    free_port,
    held,
    is_event,
    open_session,
    port_accepts,
    run_session,
    send_json,
    wait_for,
)
from .support.redis_server import RedisServer
from .support.upstream_standin import StandIn

pytestmark = [pytest.mark.live, pytest.mark.deploy, needs_postgres]

CONFIG = {"response_format": "pcm", "stream_audio": True}
SPEAKING_RATE = 48000  # 16-bit samples: twice as many bytes a second of audio
SPEAKING_CONFIG = {**CONFIG, "sample_rate": SPEAKING_RATE}
SENTENCE_MIN_S = 3.0  # each of LONG_TEXT's sentences is longer than this (3.9-4.9 s)


def kernel_buffer_max(name):
    """The most a TCP socket's receive (tcp_rmem) or send (tcp_wmem) buffer autotunes to here."""
    return int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[2])


# More audio than the path from an instance to a client that stopped reading can hold: nginx's socket
# from the instance may grow to tcp_rmem's maximum and its socket to the client to tcp_wmem's. With
# less, an instance that autotuned its way there sent everything and was never held (`speaking`).
PATH_BUFFER_BYTES = kernel_buffer_max("tcp_rmem") + kernel_buffer_max("tcp_wmem")
LONG_TEXT = (
    " ".join(
        f"Sentence {i} of a long answer, spoken while the test does its part."
        for i in range(math.ceil(PATH_BUFFER_BYTES / (2 * SPEAKING_RATE * SENTENCE_MIN_S)) + 10)
    )
    + " "
)
INSTANCES = ("a", "b")


def compose_command(service):
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"][service]["command"]


class Stack:
    """Redis, a PostgreSQL database, the shared voice directory, instances a and b, nginx."""

    def __init__(self, env=None):
        self.extra_env = dict(env or {})
        self.redis = RedisServer()
        self.db = PostgresDatabase()
        self.media = Path(tempfile.mkdtemp(prefix="voices-shared-"))
        self.instances = {}
        self.nginx = None

    def env(self, name):
        return {
            "DATABASE_URL": self.db.url,
            "REDIS_URL": self.redis.url(0),
            "MEDIA_ROOT": str(self.media),
            "DJANGO_ALLOWED_HOSTS": "*",
            "SPEECH_INSTANCE_ID": name,
            **self.extra_env,
        }

    def start(self):
        self.redis.start()
        self.db.__enter__()
        done = subprocess.run(
            compose_command("migrate"),
            cwd=PROJECT_ROOT,
            env=local_environment(self.env("migrate")),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        for name in INSTANCES:
            self.instances[name] = DaphneServer(self.env(name), migrate=False).start()
        self.nginx = Nginx([f"127.0.0.1:{self.instances[name].port}" for name in INSTANCES]).start()
        return self

    def stop(self):
        if self.nginx is not None:
            self.nginx.__exit__(None, None, None)
        codes = {name: server.stop() for name, server in self.instances.items()}
        for server in self.instances.values():
            server.cleanup()
        self.db.__exit__(None, None, None)
        self.redis.cleanup()
        shutil.rmtree(self.media, ignore_errors=True)
        return codes

    def name_of(self, upstream):
        """The instance at nginx's `$upstream_addr` (the last one tried, when there were several)."""
        port = int(upstream.split(",")[-1].strip().rsplit(":", 1)[1])
        (name,) = [name for name, server in self.instances.items() if server.port == port]
        return name

    def instance_of(self, session_id):
        """Where the session registry (in PostgreSQL) says the session lives."""
        rows = wait_for(
            lambda: self.db.query("SELECT instance FROM speech_sessionrecord WHERE session_id = %s", session_id),
            f"session {session_id} in the registry",
        )
        return rows[0][0]

    def next_upstream(self):
        """Round robin: ask nginx something harmless and return the instance that will get the next request."""
        (status, _), upstream = self.nginx.served_by("GET", "/health", lambda: http("GET", self.nginx.http_url + "/health"))
        assert status == 200
        served = self.name_of(upstream)
        return next(name for name in INSTANCES if name != served)


def check_stopped_cleanly(stack, codes, killed=()):
    for name, code in codes.items():
        if name in killed:
            continue
        assert code == 0, f"instance {name} exit status {code}:\n{stack.instances[name].stderr_text()[-3000:]}"


@pytest.fixture(scope="module")
def stack():
    """The Hibari stack of this module. test_5 kills an instance: it runs last."""
    running = Stack().start()
    try:
        yield running
    finally:
        codes = running.stop()
    check_stopped_cleanly(running, codes, killed=getattr(running, "killed", ()))


async def speaking(stack):
    """A session through nginx in the middle of a long text: the client has heard its first audio,
    then stopped reading until the instance holding it waits mid-segment (backpressure), so it is
    still speaking whatever the test does next. (ws, session id, items so far)."""
    ws = await open_session(stack.nginx.ws_url, small_buffers=True)
    sid = (await configure(ws, SPEAKING_CONFIG))["session_id"]
    await send_json(ws, {"type": "input.text", "text": LONG_TEXT})
    so_far = await collect(ws, until=lambda item: item.kind == "audio")
    assert so_far.close_code is None, so_far.types()
    home = await asyncio.to_thread(stack.instance_of, sid)
    await asyncio.to_thread(held, stack.instances[home])
    return ws, sid, so_far


async def finish(ws, so_far=None):
    """Stop what is being said (no need to hear a long text out), then end the session normally."""
    await send_json(ws, {"type": "input.cancel"})
    await send_json(ws, {"type": "input.done"})
    result = await collect(ws, so_far)
    assert result.close_code == 1000, result.types()
    assert result.types()[-1] == "session.done"
    return result


# -- tests --------------------------------------------------------------------------------------


def test_1_a_websocket_session_through_nginx(stack):
    result = asyncio.run(run_session(stack.nginx.ws_url, CONFIG, ["Hello from behind the proxy. ", "How are you?"]))
    assert result.close_code == 1000 and result.types()[-1] == "session.done"
    assert len(result.of_type("audio.start")) == 2 and sum(map(len, result.audio_frames)) > 24000
    sid = result.configured["session_id"]
    assert stack.instance_of(sid) in INSTANCES
    ended = wait_for(
        lambda: stack.db.query(
            "SELECT status, segments, bytes_sent FROM speech_sessionrecord WHERE session_id = %s AND status <> 'active'", sid
        ),
        f"the end of session {sid} in the registry",
    )
    assert ended == [("completed", 2, sum(map(len, result.audio_frames)))]
    status, body = http("GET", stack.nginx.http_url + "/health")
    assert status == 200 and json.loads(body)["checks"] == {"database": "ok", "engine": "ok", "redis": "ok"}
    assert http("GET", stack.nginx.http_url + "/metrics")[0] == 403  # scraped per instance, not through nginx
    assert http("GET", stack.instances["a"].http_url + "/metrics")[0] == 200


async def test_2_a_rest_cancel_through_nginx_reaches_the_session_wherever_it_lives(stack):
    sessions = []
    try:
        for _ in INSTANCES:
            sessions.append(await speaking(stack))
        homes = [await asyncio.to_thread(stack.instance_of, sid) for _, sid, _ in sessions]
        assert sorted(homes) == sorted(INSTANCES), homes  # round robin: one session on each
        # the cancel goes to the instance that does NOT hold the session it names
        target = await asyncio.to_thread(stack.next_upstream)
        ws, sid, so_far = sessions[homes.index(next(name for name in INSTANCES if name != target))]
        path = f"/v1/audio/speech/sessions/{sid}/cancel"
        (status, body), upstream = await asyncio.to_thread(
            stack.nginx.served_by, "POST", path, lambda: http("POST", stack.nginx.http_url + path, b"")
        )
        assert status == 202, body
        assert stack.name_of(upstream) == target != stack.instance_of(sid)
        so_far = await collect(ws, so_far, until=is_event("input.cancelled"))
        assert so_far.events[-1]["origin"] == "server" and so_far.events[-1]["session_id"] == sid
        for ws, _, items in sessions:
            await finish(ws, items)
    finally:
        for ws, _, _ in sessions:
            await ws.close()


async def test_3_a_voice_uploaded_through_one_instance_speaks_in_a_session_on_the_other():
    """Voices need an engine that clones: both instances use the upstream engine, in front of a
    stand-in that records what it is sent (the uploaded audio arrives as `ref_audio`)."""
    with StandIn(voices=None) as upstream:
        cloning = await asyncio.to_thread(_cloning_stack, upstream)
        try:
            audio = samples.good("wav", 2.0)
            body, content_type = samples.multipart(
                {"name": "shared-voice", "consent": "recorded with consent"}, {"audio_sample": ("ref.wav", audio, "audio/wav")}
            )
            (status, reply), via = await asyncio.to_thread(
                cloning.nginx.served_by,
                "POST",
                "/v1/audio/voices",
                lambda: http("POST", cloning.nginx.http_url + "/v1/audio/voices", body, {"Content-Type": content_type}),
            )
            assert status == 201, reply
            uploader = cloning.name_of(via)
            stored = list((cloning.media / "voices").iterdir())
            assert [path.read_bytes() for path in stored] == [audio]  # in the shared directory

            result = await run_session(cloning.nginx.ws_url, {**CONFIG, "voice": "shared-voice"}, ["Hello there."])
            assert result.close_code == 1000, result.events
            speaker = await asyncio.to_thread(cloning.instance_of, result.configured["session_id"])
            assert speaker != uploader  # nginx sent the session to the other instance
            assert result.configured["voice"] == "shared-voice" and result.audio_frames
            (sent,) = [r.json for r in upstream.requests if r.path.endswith("/audio/speech")]
            assert sent["ref_audio"] == "data:audio/wav;base64," + base64.b64encode(audio).decode()
        finally:
            codes = await asyncio.to_thread(cloning.stop)
        check_stopped_cleanly(cloning, codes)


def _cloning_stack(upstream):
    return Stack({"SPEECH_ENGINE": "openai", "SPEECH_UPSTREAM_URL": upstream.url, "SPEECH_WARM_UP": "false"}).start()


async def test_4_the_sqlite_single_container_mode_runs_the_dockerfile_commands():
    """docker run tts-server: the image's CMD (migrate, then serve) with its ENV, /data here."""
    facts = dockerfile()
    data = Path(tempfile.mkdtemp(prefix="data-"))
    port = free_port()
    env = {key: value.replace("/data", str(data)) for key, value in facts["env"].items()}
    env.update(HOST="127.0.0.1", PORT=str(port))
    env = local_environment(env)
    env.pop("REDIS_URL", None)
    log = open(data / "server.log", "wb")
    proc = subprocess.Popen(
        facts["cmd"], cwd=PROJECT_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    )
    try:
        await asyncio.to_thread(
            wait_for, lambda: proc.poll() is not None or port_accepts("127.0.0.1", port), "the container's command listening", 120
        )
        assert proc.poll() is None, (data / "server.log").read_text()
        probe = await asyncio.to_thread(subprocess.run, facts["healthcheck"], env=env, capture_output=True, timeout=30)
        assert probe.returncode == 0, probe.stderr  # the image's HEALTHCHECK: ready
        body, content_type = samples.multipart(
            {"name": "kept", "consent": "recorded with consent"},
            {"audio_sample": ("ref.wav", samples.good("wav", 2.0), "audio/wav")},
        )
        status, reply = await asyncio.to_thread(
            http, "POST", f"http://127.0.0.1:{port}/v1/audio/voices", body, {"Content-Type": content_type}
        )
        assert status == 201, reply
        result = await run_session(f"ws://127.0.0.1:{port}/v1/audio/speech/stream", CONFIG, ["Hello there."])
        assert result.close_code == 1000 and result.audio_frames
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 30)
        log.close()
    try:
        assert code == 0, (data / "server.log").read_text()[-3000:]
        assert (data / "db.sqlite3").stat().st_size > 0
        assert len(list((data / "media" / "voices").iterdir())) == 1
    finally:
        shutil.rmtree(data, ignore_errors=True)


async def test_5_an_instance_killed_mid_session(stack):
    """SIGKILL the instance holding one session: its client is cut off, the session on the other
    instance goes on to its end, and new sessions through nginx succeed (on the survivor)."""
    sessions = [await speaking(stack) for _ in INSTANCES]
    homes = [await asyncio.to_thread(stack.instance_of, sid) for _, sid, _ in sessions]
    assert sorted(homes) == sorted(INSTANCES), homes
    victim, survivor = homes
    (ws_dead, _, dead_items), (ws_alive, _, alive_items) = sessions
    try:
        stack.instances[victim].kill()
        stack.killed = (victim,)
        cut = await collect(ws_dead, dead_items)
        assert cut.close_code == 1006  # no close frame: the process is gone
        # the other session goes on: new speech, made after the kill, then a normal end
        await send_json(ws_alive, {"type": "input.cancel"})
        alive_items = await collect(ws_alive, alive_items, until=is_event("input.cancelled"))
        await send_json(ws_alive, {"type": "input.text", "text": "Said after the other instance died."})
        await send_json(ws_alive, {"type": "input.done"})
        done = await collect(ws_alive, alive_items)
        assert done.close_code == 1000 and done.types()[-1] == "session.done"
        (after,) = [e for e in done.of_type("audio.start") if e["sentence_text"].startswith("Said after")]
        (after_done,) = [e for e in done.of_type("audio.done") if e["sentence_index"] == after["sentence_index"]]
        assert after_done["total_bytes"] > 0 and not after_done["error"]
        for _ in range(3):
            result = await run_session(stack.nginx.ws_url, CONFIG, ["Still here."])
            assert result.close_code == 1000 and result.audio_frames, result.events
            assert await asyncio.to_thread(stack.instance_of, result.configured["session_id"]) == survivor
    finally:
        await ws_dead.close()
        await ws_alive.close()
