"""API keys and the per-key session limit across two real daphne instances (`manage.py serve`)
sharing one SQLite file database and one Redis.

The slot count lives in Redis as a sorted set `speech:slots:<key prefix>` whose members are session
ids and whose scores are lease deadlines (speech/control/slots.py). A crashed instance's slot is freed by
its lease running out; instead of waiting LEASE_S, the test reads the dead member's deadline and
runs the acquire script's own expiry step with a clock past it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import tempfile
import time
import types
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
import redis

import speech.control.slots
from speech.control.slots import _ACQUIRE, LEASE_S, RedisSlots
from tests.support import audio_samples as samples
from tests.support.live import PROJECT_ROOT, PYTHON, DaphneServer, assert_healthy, collect, configure, open_session, wait_for

pytestmark = pytest.mark.live

REDIS_DB = 11  # this module's Redis database; only the keys it creates are touched, and deleted at the end
REDIS_URL = f"redis://127.0.0.1:6379/{REDIS_DB}"
LIMIT = 2
GUARD_S = 15.0  # hang guard for conditions that the servers settle asynchronously


@pytest.fixture(scope="module")
def shared():
    """One SQLite file and one media folder for every instance of this module, migrated once."""
    workdir = Path(tempfile.mkdtemp(prefix="keys-live-"))
    env = {
        "DATABASE_URL": f"sqlite:///{workdir / 'db.sqlite3'}",
        "MEDIA_ROOT": str(workdir / "media"),
        "REDIS_URL": REDIS_URL,
        "SPEECH_ENGINE": "fake",
        "SPEECH_REQUIRE_API_KEY": "true",
        "SPEECH_MAX_SESSIONS_PER_KEY": str(LIMIT),
        "SPEECH_CONFIG_TIMEOUT_S": "60",
        "SPEECH_IDLE_TIMEOUT_S": "60",
    }
    done = subprocess.run(
        [PYTHON, "manage.py", "migrate", "--noinput"],
        cwd=PROJECT_ROOT,
        env=_env(env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    yield env
    shutil.rmtree(workdir, ignore_errors=True)


def _env(extra):
    import os

    env = dict(os.environ)
    env.setdefault("DJANGO_SETTINGS_MODULE", "ttsproject.settings")
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def rds():
    client = redis.Redis.from_url(REDIS_URL)
    client.ping()
    yield client
    client.close()


@pytest.fixture(scope="module")
def created_prefixes(rds):
    prefixes = []
    yield prefixes
    for prefix in prefixes:
        rds.delete(slot_set(prefix))


@pytest.fixture(scope="module")
def servers(shared):
    a = DaphneServer(shared, migrate=False).start()
    b = DaphneServer(shared, migrate=False).start()
    try:
        yield a, b
    finally:
        for server in (a, b):
            server.stop()
    for server in (a, b):
        server.assert_no_traceback()
        server.cleanup()


@pytest.fixture(autouse=True)
def servers_stay_healthy(request):
    yield
    if "servers" in request.fixturenames:
        assert_healthy(*request.getfixturevalue("servers"))


@pytest.fixture
def new_key(shared, created_prefixes):
    """`manage.py create_api_key` with the servers' environment; returns the printed key."""

    def make(name="live-client", *extra):
        done = subprocess.run(
            [PYTHON, "manage.py", "create_api_key", name, *extra],
            cwd=PROJECT_ROOT,
            env=_env(shared),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        secret = done.stdout.strip()
        assert secret.startswith("tts_") and "." in secret, done.stdout
        created_prefixes.append(secret.split(".", 1)[0])
        return secret

    return make


def slot_set(prefix_or_secret):
    return f"speech:slots:{prefix_or_secret.split('.', 1)[0]}"


def auth(secret):
    return {"Authorization": f"Bearer {secret}"}


async def wait_until(condition, what):
    """A condition the servers settle on their own (a disconnect processed), off the loop; bounded."""
    await asyncio.to_thread(wait_for, condition, what, GUARD_S)


async def refused(url, *, headers=None, query=""):
    ws = await open_session(url + query, headers=headers)
    try:
        result = await collect(ws, timeout=GUARD_S)
    finally:
        await ws.close()
    assert len(result.events) == 1, result.events
    return result.events[0], result.close_code


async def expect_limit(url, secret):
    event, code = await refused(url, headers=auth(secret))
    assert event == {
        "type": "error",
        "message": f"Too many concurrent sessions for this API key (limit {LIMIT})",
        "error_type": "rate_limit_error",
        "code": 429,
    }
    assert code == 4013


async def expect_auth_error(url, *, headers=None, query=""):
    event, code = await refused(url, headers=headers, query=query)
    assert event == {"type": "error", "message": "Invalid or missing API key", "error_type": "authentication_error", "code": 401}
    assert code == 4008


def http(server, method, path, *, headers=None, body=None, content_type=None):
    request = urllib.request.Request(server.http_url + path, data=body, method=method, headers=dict(headers or {}))
    if content_type:
        request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


# -- tests ----------------------------------------------------------------------------------------------


async def test_the_limit_holds_across_instances_and_a_closed_session_gives_its_slot_back(servers, new_key, rds):
    a, b = servers
    secret = new_key()
    name = slot_set(secret)
    on_a = await open_session(a.ws_url, headers=auth(secret))
    on_b = await open_session(b.ws_url, headers=auth(secret))
    try:
        configured_a = await configure(on_a, {})
        configured_b = await configure(on_b, {})
        members = {m.decode() for m in rds.zrange(name, 0, -1)}
        assert members == {configured_a["session_id"], configured_b["session_id"]}
        await expect_limit(a.ws_url, secret)
        await expect_limit(b.ws_url, secret)
        assert rds.zcard(name) == LIMIT, "a refused session must not hold a slot"

        await on_a.close()
        await wait_until(lambda: rds.zcard(name) == 1, "A to give the closed session's slot back")
        assert {m.decode() for m in rds.zrange(name, 0, -1)} == {configured_b["session_id"]}
        on_a = await open_session(b.ws_url, headers=auth(secret))
        await configure(on_a, {})
        await expect_limit(a.ws_url, secret)
    finally:
        await on_a.close()
        await on_b.close()
    await wait_until(lambda: rds.zcard(name) == 0, "every slot to be given back")


async def test_a_session_that_finishes_gives_its_slot_back(servers, new_key, rds):
    a, b = servers
    secret = new_key()
    name = slot_set(secret)
    for _ in range(3):  # more sessions in a row than the limit: nothing leaks
        for server in (a, b):
            ws = await open_session(server.ws_url, headers=auth(secret))
            try:
                await configure(ws, {})
                await ws.send(json.dumps({"type": "input.text", "text": "Hello there. "}))
                await ws.send(json.dumps({"type": "input.done"}))
                result = await collect(ws, timeout=GUARD_S)
            finally:
                await ws.close()
            assert result.close_code == 1000 and result.types()[-1] == "session.done"
            await wait_until(lambda: rds.zcard(name) == 0, "the finished session's slot")


async def test_a_key_created_with_its_own_limit(servers, new_key, rds):
    a, b = servers
    secret = new_key("one-only", "--max-sessions", "1")
    ws = await open_session(a.ws_url, headers=auth(secret))
    try:
        await configure(ws, {})
        event, code = await refused(b.ws_url, headers=auth(secret))
        assert (event["error_type"], event["code"], event["message"], code) == (
            "rate_limit_error",
            429,
            "Too many concurrent sessions for this API key (limit 1)",
            4013,
        )
    finally:
        await ws.close()


async def test_missing_wrong_and_revoked_keys_are_refused_on_both(servers, new_key, shared):
    a, b = servers
    secret = new_key()
    for server in (a, b):
        await expect_auth_error(server.ws_url)
        await expect_auth_error(server.ws_url, headers=auth(secret.split(".")[0] + ".wrong"))
    revoke = subprocess.run(
        [
            PYTHON,
            "manage.py",
            "shell",
            "-c",
            "from django.utils import timezone; from speech.models import ApiKey; "
            f"print(ApiKey.objects.filter(prefix='{secret.split('.')[0]}').update(revoked_at=timezone.now()))",
        ],
        cwd=PROJECT_ROOT,
        env=_env(shared),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert revoke.stdout.strip().splitlines()[-1] == "1", (revoke.stdout, revoke.stderr)
    for server in (a, b):
        await expect_auth_error(server.ws_url, headers=auth(secret))
        status, body = http(server, "GET", "/v1/audio/voices", headers=auth(secret))
        assert status == 401 and body["error"]["type"] == "authentication_error"


async def test_a_token_from_a_works_once_on_b(servers, new_key):
    a, b = servers
    secret = new_key()
    status, body = http(a, "POST", "/v1/audio/speech/tokens")
    assert status == 401 and body["error"] == {
        "message": "Invalid or missing API key",
        "type": "authentication_error",
        "param": None,
        "code": 401,
    }
    status, body = http(a, "POST", "/v1/audio/speech/tokens", headers=auth(secret))
    assert status == 201 and body["expires_in"] == 60
    token = body["token"]
    ws = await open_session(f"{b.ws_url}?token={token}")
    try:
        configured = await configure(ws, {})
        assert configured["engine"] == "fake"
    finally:
        await ws.close()
    await expect_auth_error(b.ws_url, query=f"?token={token}")
    await expect_auth_error(a.ws_url, query=f"?token={token}")


async def test_rest_on_a_and_sessions_on_b_share_the_voices(servers, new_key):
    a, b = servers
    secret = new_key("uploader", "--scopes", "speak,voices")
    body, ctype = samples.multipart(
        {"name": "SharedVoice", "consent": "Consent on file."}, {"audio_sample": ("x.wav", samples.good("wav"), "audio/wav")}
    )
    status, created = http(a, "POST", "/v1/audio/voices", headers=auth(secret), body=body, content_type=ctype)
    assert status == 201, created
    status, listing = http(b, "GET", "/v1/audio/voices", headers=auth(secret))
    assert status == 200 and "SharedVoice" in listing["voices"]
    ws = await open_session(b.ws_url, headers=auth(secret))
    try:
        await ws.send(json.dumps({"type": "session.config", "session": {"voice": "sharedvoice"}}))
        result = await collect(ws, timeout=GUARD_S)
    finally:
        await ws.close()
    assert result.events == [
        {
            "type": "error",
            "error_type": "BadRequestError",
            "code": 400,
            "param": "voice",
            "message": "voice 'sharedvoice' needs an engine with reference audio; engine 'fake' has none",
        }
    ]
    assert result.close_code == 4008
    status, deleted = http(b, "DELETE", "/v1/audio/voices/SHAREDVOICE", headers=auth(secret))
    assert status == 200 and deleted["deleted"] is True
    status, listing = http(a, "GET", "/v1/audio/voices", headers=auth(secret))
    assert "SharedVoice" not in listing["voices"]


async def test_an_oversized_upload_is_a_413_envelope_on_the_real_server(servers, new_key):
    a, _ = servers
    secret = new_key("uploader", "--scopes", "speak,voices")
    body, ctype = samples.multipart(
        {"name": "huge", "consent": "yes"}, {"audio_sample": ("x.wav", b"\x00" * (12 * 1024 * 1024), "audio/wav")}
    )
    status, envelope = http(a, "POST", "/v1/audio/voices", headers=auth(secret), body=body, content_type=ctype)
    assert status == 413
    assert envelope == {
        "error": {
            "message": "audio_sample is larger than 10 MiB",
            "type": "BadRequestError",
            "param": "audio_sample",
            "code": 413,
        }
    }
    status, listing = http(a, "GET", "/v1/audio/voices", headers=auth(secret))
    assert "huge" not in listing["voices"]


async def test_a_killed_instance_slot_frees_itself_when_its_lease_runs_out(servers, shared, new_key, rds):
    a, _ = servers
    secret = new_key()
    name = slot_set(secret)
    doomed = DaphneServer(shared, migrate=False).start()
    try:
        ws = await open_session(doomed.ws_url, headers=auth(secret))
        dead_id = (await configure(ws, {}))["session_id"]
        doomed.kill()  # SIGKILL: no disconnect handling, no release
        assert not doomed.alive()
        await ws.close()
    finally:
        doomed.kill()
        doomed.cleanup()

    survivor = await open_session(a.ws_url, headers=auth(secret))
    try:
        survivor_id = (await configure(survivor, {}))["session_id"]
        await expect_limit(a.ws_url, secret)  # the dead session still counts: its lease has not run out

        now = time.time()
        dead_deadline = rds.zscore(name, dead_id)
        assert dead_deadline is not None, "the dead session's lease is in Redis"
        assert now < dead_deadline <= now + LEASE_S, dead_deadline - now
        assert rds.zscore(name, survivor_id) > dead_deadline
        assert rds.pttl(name) > 0, "the set expires by itself if nothing renews it"

        # The acquire script at a clock just past the dead lease: it drops that lease first.
        acquire = rds.register_script(_ACQUIRE)
        later = dead_deadline + 0.001
        probe = "probe-" + dead_id
        assert acquire(keys=[name], args=[later, LIMIT, later + LEASE_S, probe, int(LEASE_S * 2000)]) == 1
        assert {m.decode() for m in rds.zrange(name, 0, -1)} == {survivor_id, probe}
        rds.zrem(name, probe)

        again = await open_session(a.ws_url, headers=auth(secret))
        try:
            await configure(again, {})
            await expect_limit(a.ws_url, secret)
        finally:
            await again.close()
    finally:
        await survivor.close()


async def test_keys_and_tokens_never_reach_the_server_logs(servers, new_key):
    a, b = servers
    secret = new_key()
    status, body = http(a, "POST", "/v1/audio/speech/tokens", headers=auth(secret))
    token = body["token"]
    ws = await open_session(f"{b.ws_url}?token={token}")
    await configure(ws, {})
    await ws.close()
    await expect_auth_error(a.ws_url, query=f"?token={token}")
    await expect_auth_error(a.ws_url, headers=auth(secret + "x"))
    http(b, "GET", "/v1/audio/voices", headers=auth(secret + "x"))
    http(b, "DELETE", "/v1/audio/voices/nobody", headers=auth(secret))
    for server in (a, b):
        logs = server.stdout_text() + server.stderr_text()
        assert logs, "the server logged nothing at all"
        for value in (secret, secret.split(".", 1)[1], token, token[4:]):
            assert value not in logs


# -- the Redis slots in-process, against the real Redis ------------------------------------------------------


@pytest.fixture
async def redis_slots(rds, monkeypatch):
    """RedisSlots on this module's database with a clock the test moves; yields (slots, clock, key)."""
    clock = types.SimpleNamespace(now=time.time())
    monkeypatch.setattr(speech.control.slots, "time", types.SimpleNamespace(time=lambda: clock.now))
    slots = RedisSlots(REDIS_URL)
    key = f"test-{uuid.uuid4().hex}"
    try:
        yield slots, clock, key
    finally:
        rds.delete(slot_set(key))
        await slots._redis.aclose()


async def test_redis_slots_count_release_and_expire(redis_slots, rds):
    slots, clock, key = redis_slots
    start = clock.now
    assert await slots.acquire(key, "s1", 2)
    clock.now += 1
    assert await slots.acquire(key, "s2", 2)
    assert not await slots.acquire(key, "s3", 2)
    assert rds.zcard(slot_set(key)) == 2
    assert rds.zscore(slot_set(key), "s1") == pytest.approx(start + LEASE_S)
    await slots.release(key, "s1")
    assert await slots.acquire(key, "s3", 2)
    assert not await slots.acquire(key, "s4", 2)
    clock.now = start + 1 + LEASE_S + 0.01  # s2's lease ran out, s3's (taken at start + 1) too
    assert await slots.acquire(key, "s4", 2)
    assert {m.decode() for m in rds.zrange(slot_set(key), 0, -1)} == {"s4"}


async def test_a_renewed_lease_is_not_dropped_by_the_expiry_step(redis_slots, rds):
    slots, clock, key = redis_slots
    start = clock.now
    assert await slots.acquire(key, "live", 1)
    clock.now = start + LEASE_S - 1
    await slots.renew(key, "live")
    assert rds.zscore(slot_set(key), "live") == pytest.approx(start + 2 * LEASE_S - 1)
    clock.now = start + LEASE_S + 1  # past the first lease, inside the renewed one
    assert not await slots.acquire(key, "other", 1)
    await slots.release(key, "live")
    await slots.renew(key, "live")  # a late renewal after the release must not bring the slot back
    assert rds.zcard(slot_set(key)) == 0
    assert await slots.acquire(key, "other", 1)


async def test_renewing_a_lease_keeps_the_set_alive_for_at_least_the_lease(redis_slots, rds):
    slots, clock, key = redis_slots
    name = slot_set(key)
    assert await slots.acquire(key, "long-session", 1)
    # 55 s later (the set's own expiry is what a real clock would have eaten meanwhile) the session renews:
    rds.pexpire(name, int((2 * LEASE_S - 55) * 1000))
    clock.now += 55
    await slots.renew(key, "long-session")
    assert rds.pttl(name) >= (LEASE_S - 1) * 1000, "the renewed lease would disappear before it runs out"
