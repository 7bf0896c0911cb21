"""Safe on a network (issue 45): the server refuses to listen off loopback insecurely, `check --deploy`
is clean with the documented production environment, secrets come from files, keys act within their
scopes and rates, and a hostile pass of one tenant against another and against the uploads.

In-process: Django's test client for REST, Channels' communicator for the WebSocket, `call_command`
and `manage.py` subprocesses that start no server."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from channels.testing import WebsocketCommunicator
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

import speech.control.slots
from speech import security
from speech.control.slots import LocalSlots
from speech.engines.fake import FakeEngine
from speech.models import AccessToken, ApiKey, Voice
from speech.web import ratelimit

from .support import audio_samples as samples
from .support.communicator import HANG_GUARD_S, PATH, application, event, output, send

ROOT = Path(__file__).resolve().parent.parent
PRODUCTION_ENV = ROOT / "docker" / "production.env.example"
VOICES = "/v1/audio/voices"
TOKENS = "/v1/audio/speech/tokens"
CONSENT = "Recorded with the speaker's written consent."
MIB = 1024 * 1024


def bearer(secret):
    return {"HTTP_AUTHORIZATION": f"Bearer {secret}"}


def envelope(response, status, type_):
    assert response.status_code == status, (response.status_code, response.content[:300])
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status and error["type"] == type_
    return error


def files_under(root):
    return sorted(p.name for p in root.rglob("*") if p.is_file()) if root.exists() else []


def manage(*args, env=None):
    """`manage.py ARGS` in a subprocess with only `env` beside PATH: (exit status, output)."""
    base = {"PATH": os.environ["PATH"], "DJANGO_SETTINGS_MODULE": "ttsproject.settings", "SPEECH_ENGINE": "fake"}
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env={**base, **(env or {})}, capture_output=True, text=True, timeout=120
    )
    return done.returncode, done.stdout + done.stderr


def production_environment():
    """docker/production.env.example with its placeholders filled in as an operator would."""
    env = {}
    for line in PRODUCTION_ENV.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            env[name] = value
    filled = {
        "DJANGO_SECRET_KEY": "5b0f3c1e9d8a7f6e5d4c3b2a19081726354453627180918a7b6c5d4e3f2a1b0c",
        "POSTGRES_PASSWORD": "0f1e2d3c4b5a69788796a5b4c3d2e1f0a1b2c3d4e5f60718",
        "DJANGO_ALLOWED_HOSTS": "tts.example.com",
        "DJANGO_CSRF_TRUSTED_ORIGINS": "https://tts.example.com",
    }
    assert {name for name, value in env.items() if value.startswith("<")} == set(filled), "new placeholders to fill"
    return {**env, **filled}


# -- refusing to listen off loopback ------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_is_served_with_the_defaults(settings, host):
    settings.SPEECH_REQUIRE_API_KEY = False
    assert security.refusal(host) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "tts.example.com"])
def test_off_loopback_the_development_key_and_keys_off_are_refused_naming_what_to_set(settings, host):
    settings.SECRET_KEY = settings.DEVELOPMENT_SECRET_KEY
    settings.SPEECH_REQUIRE_API_KEY = False
    with pytest.raises(CommandError) as refused:
        call_command("serve", host=host, port=1)
    message = str(refused.value)
    assert message.startswith(f"refusing to listen on {host}, which is not loopback")
    assert "set DJANGO_SECRET_KEY" in message and "set SPEECH_REQUIRE_API_KEY=true" in message
    assert "SPEECH_INSECURE=true" in message


def test_off_loopback_each_problem_alone_is_refused(settings):
    settings.SECRET_KEY = "x" * 64
    settings.SPEECH_REQUIRE_API_KEY = False
    assert "SPEECH_REQUIRE_API_KEY" in security.refusal("0.0.0.0") and "DJANGO_SECRET_KEY" not in security.refusal("0.0.0.0")
    settings.SPEECH_REQUIRE_API_KEY = True
    settings.SECRET_KEY = settings.DEVELOPMENT_SECRET_KEY
    assert "DJANGO_SECRET_KEY" in security.refusal("0.0.0.0")
    settings.SECRET_KEY = "x" * 64
    assert security.refusal("0.0.0.0") is None
    settings.DEBUG = True
    assert "DJANGO_DEBUG" in security.refusal("0.0.0.0")


def test_speech_insecure_lets_it_listen_anywhere(settings):
    settings.SECRET_KEY = settings.DEVELOPMENT_SECRET_KEY
    settings.SPEECH_REQUIRE_API_KEY = False
    settings.SPEECH_INSECURE = True
    assert security.refusal("0.0.0.0") is None


def test_with_speech_insecure_serve_starts_off_loopback_and_warns_what_is_open(settings, monkeypatch, caplog):
    from speech.server import launcher as server

    started = []
    monkeypatch.setattr(server.SpeechCommandLine, "run", lambda self, args: started.append(args))
    settings.SECRET_KEY = settings.DEVELOPMENT_SECRET_KEY
    settings.SPEECH_REQUIRE_API_KEY = False
    settings.SPEECH_INSECURE = True
    with caplog.at_level("WARNING", logger="speech.serve"):
        call_command("serve", host="0.0.0.0", port=8123)
    assert started and started[0][started[0].index("-b") + 1] == "0.0.0.0"
    (warning,) = [r.getMessage() for r in caplog.records if "SPEECH_INSECURE" in r.getMessage()]
    assert warning.startswith("SPEECH_INSECURE=true: listening on 0.0.0.0 with DJANGO_SECRET_KEY is the development key")


def test_manage_py_serve_exits_with_the_reason_before_listening():
    code, said = manage("serve", "--host", "0.0.0.0", "--port", "1")
    assert code == 1
    assert "refusing to listen on 0.0.0.0, which is not loopback" in said and "SPEECH_INSECURE=true" in said


# -- check --deploy, secrets from files -----------------------------------------------------------


def test_check_deploy_is_clean_with_the_documented_production_environment():
    env = production_environment()
    code, said = manage("check", "--deploy", "--fail-level", "WARNING", env={**env, "SPEECH_REQUIRE_API_KEY": "true"})
    assert code == 0 and "System check identified no issues" in said, said


def test_check_deploy_names_what_the_defaults_lack():
    code, said = manage("check", "--deploy", "--fail-level", "WARNING")
    assert code == 1
    for warning in ("security.W009", "security.W012", "security.W016", "security.W004", "speech.W002"):
        assert warning in said, warning


def test_check_deploy_warns_when_any_origin_may_open_sessions():
    env = {**production_environment(), "SPEECH_REQUIRE_API_KEY": "true", "DJANGO_ALLOWED_HOSTS": "*"}
    code, said = manage("check", "--deploy", "--fail-level", "WARNING", env=env)
    assert code == 1 and "speech.W003" in said and "a page on any origin may open" in said
    code, said = manage(
        "check", "--deploy", "--fail-level", "WARNING", env={**env, "SPEECH_ALLOWED_ORIGINS": "https://tts.example.com"}
    )
    assert code == 0, said


def test_secrets_are_read_from_files(tmp_path):
    (tmp_path / "key").write_text("a-secret-key-from-a-file-" + "k" * 40 + "\n")
    (tmp_path / "password").write_text("p@ss/word:with#odd chars\n")
    program = (
        "import django; django.setup(); from django.conf import settings as s; "
        "print(s.SECRET_KEY); print(s.DATABASES['default']['PASSWORD'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        cwd=ROOT,
        env={
            "PATH": os.environ["PATH"],
            "DJANGO_SETTINGS_MODULE": "ttsproject.settings",
            "DJANGO_SECRET_KEY_FILE": str(tmp_path / "key"),
            "DATABASE_PASSWORD_FILE": str(tmp_path / "password"),
            "DATABASE_URL": "postgres://tts@db:5432/tts",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.splitlines() == ["a-secret-key-from-a-file-" + "k" * 40, "p@ss/word:with#odd chars"], done.stderr


# -- scopes on REST ------------------------------------------------------------------------------------


@pytest.fixture
def keys(settings, media, process_engine):
    settings.SPEECH_REQUIRE_API_KEY = True
    return media


def issue(name, scopes):
    return ApiKey.issue(name, scopes=scopes)


def upload(client, secret, name="alice", file=None):
    data = {"name": name, "consent": CONSENT, "audio_sample": file or samples.good_upload()}
    return client.post(VOICES, data, **bearer(secret))


@pytest.mark.django_db
def test_a_key_without_the_voices_scope_cannot_upload_or_delete(client, keys):
    _, speaker = issue("speaker", "speak")
    error = envelope(upload(client, speaker), 403, "permission_error")
    assert error["message"] == "this API key lacks the 'voices' scope"
    assert Voice.objects.count() == 0 and files_under(keys) == []
    _, uploader = issue("uploader", "voices")
    assert upload(client, uploader).status_code == 201
    assert envelope(client.delete(f"{VOICES}/alice", **bearer(speaker)), 403, "permission_error")["message"] == (
        "this API key lacks the 'voices or admin' scope"
    )
    assert Voice.objects.filter(name="alice").exists()


@pytest.mark.django_db
def test_a_key_without_speak_gets_no_tokens_speech_or_session_control(client, keys):
    _, uploader = issue("uploader", "voices")
    for response in (
        client.post(TOKENS, **bearer(uploader)),
        client.post("/v1/audio/speech", {"input": "Hello."}, content_type="application/json", **bearer(uploader)),
        client.post(f"/v1/audio/speech/sessions/speech_ws_{'0' * 32}/cancel", **bearer(uploader)),
        client.delete(f"/v1/audio/speech/sessions/speech_ws_{'0' * 32}", **bearer(uploader)),
    ):
        assert envelope(response, 403, "permission_error")["message"].startswith("this API key lacks the 'speak")
    assert AccessToken.objects.count() == 0
    assert client.get(VOICES, **bearer(uploader)).status_code == 200  # listing needs a key, no scope


@pytest.mark.django_db(transaction=True)  # the file goes once the row's deletion is committed
def test_a_voice_is_deleted_by_its_uploader_or_an_admin_key_only(client, keys):
    _, alice = issue("tenant-a", "speak voices")
    _, bob = issue("tenant-b", "speak voices")
    _, operator = issue("operator", "admin")
    assert upload(client, alice, "alices").status_code == 201
    assert upload(client, alice, "second").status_code == 201
    error = envelope(client.delete(f"{VOICES}/alices", **bearer(bob)), 403, "permission_error")
    assert error["message"] == "voice 'alices' was not uploaded under this API key" and error["param"] == "name"
    assert len(files_under(keys)) == 2
    assert client.delete(f"{VOICES}/ALICES", **bearer(alice)).status_code == 200
    assert client.delete(f"{VOICES}/second", **bearer(operator)).status_code == 200
    assert Voice.objects.count() == 0 and files_under(keys) == []


@pytest.mark.django_db
def test_a_voice_from_the_admin_has_no_owner_so_only_an_admin_key_deletes_it(client, keys):
    from speech.voices import create_voice

    create_voice(name="house", consent=CONSENT, data=samples.good("wav"), filename="h.wav", created_by="staff")
    _, tenant = issue("tenant", "speak voices")
    envelope(client.delete(f"{VOICES}/house", **bearer(tenant)), 403, "permission_error")
    _, operator = issue("operator", "admin")
    assert client.delete(f"{VOICES}/house", **bearer(operator)).status_code == 200


@pytest.mark.django_db
def test_a_key_over_its_request_rate_gets_429_with_retry_after(client, keys, settings, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(ratelimit, "buckets", ratelimit.Buckets(clock=lambda: now[0]))
    settings.SPEECH_KEY_REQUESTS_PER_MINUTE = 3
    _, secret = issue("busy", "speak")
    _, other = issue("other", "speak")
    assert [client.get(VOICES, **bearer(secret)).status_code for _ in range(3)] == [200, 200, 200]
    refused = client.get(VOICES, **bearer(secret))
    error = envelope(refused, 429, "rate_limit_error")
    assert error["message"] == "too many requests for this API key (limit 3 a minute)"
    assert refused["Retry-After"] == "20"  # one request per 20 s at 3 a minute
    assert client.get(VOICES, **bearer(other)).status_code == 200  # each key has its own
    now[0] += 20
    assert client.get(VOICES, **bearer(secret)).status_code == 200
    settings.SPEECH_KEY_REQUESTS_PER_MINUTE = 0
    assert {client.get(VOICES, **bearer(secret)).status_code for _ in range(5)} == {200}


@pytest.mark.django_db
def test_a_keys_own_request_rate_overrides_the_setting(client, keys, settings, monkeypatch):
    monkeypatch.setattr(ratelimit, "buckets", ratelimit.Buckets(clock=lambda: 1000.0))
    settings.SPEECH_KEY_REQUESTS_PER_MINUTE = 3
    _, one = ApiKey.issue("one a minute", requests_per_minute=1)
    _, front = ApiKey.issue("front instance", requests_per_minute=0)
    assert client.get(VOICES, **bearer(one)).status_code == 200
    refused = client.get(VOICES, **bearer(one))
    assert envelope(refused, 429, "rate_limit_error")["message"] == "too many requests for this API key (limit 1 a minute)"
    assert refused["Retry-After"] == "60"
    assert {client.get(VOICES, **bearer(front)).status_code for _ in range(10)} == {200}


# -- scopes on the WebSocket ------------------------------------------------------------------------------


@pytest.fixture
def ws_keys(settings, monkeypatch, process_engine):
    settings.SPEECH_REQUIRE_API_KEY = True
    monkeypatch.setattr(speech.control.slots, "_slots", LocalSlots())


async def connect(secret=None, query="", headers=()):
    hdrs = list(headers)
    if secret:
        hdrs.append((b"authorization", f"Bearer {secret}".encode()))
    comm = WebsocketCommunicator(application(FakeEngine()), PATH + query, headers=hdrs)
    return comm, (await comm.connect(HANG_GUARD_S))[0]


@pytest.mark.django_db(transaction=True)
async def test_a_key_without_speak_is_refused_on_the_websocket_with_403_then_4008(ws_keys):
    from asgiref.sync import sync_to_async

    _, uploader = await sync_to_async(issue)("uploader", "voices admin")
    comm, accepted = await connect(uploader)
    try:
        assert accepted
        assert await event(comm) == {
            "type": "error",
            "message": "this API key lacks the 'speak' scope",
            "error_type": "permission_error",
            "code": 403,
        }
        closing = await output(comm)
        assert closing["type"] == "websocket.close" and closing["code"] == 4008
    finally:
        await comm.disconnect()
    _, speaker = await sync_to_async(issue)("speaker", "speak")
    comm, _ = await connect(speaker)
    try:
        await send(comm, {"type": "session.config", "session": {}})
        assert (await event(comm))["type"] == "session.configured"
    finally:
        await comm.disconnect()


# -- scopes set by the admin and the command, and migrated ------------------------------------------------


@pytest.mark.django_db
def test_create_api_key_sets_the_scopes():
    out = io.StringIO()
    call_command("create_api_key", "ops", "--scopes", "admin,speak", stdout=out)
    row = ApiKey.objects.get(name="ops")
    assert row.scopes == "speak admin" and row.prefix == out.getvalue().strip().split(".")[0]
    call_command("create_api_key", "plain", stdout=io.StringIO())
    assert ApiKey.objects.get(name="plain").scopes == "speak"
    assert ApiKey.objects.get(name="plain").requests_per_minute is None
    call_command("create_api_key", "front", "--requests-per-minute", "0", stdout=io.StringIO())
    assert ApiKey.objects.get(name="front").requests_per_minute == 0
    with pytest.raises(CommandError, match="--scopes takes a comma list of speak, voices, admin"):
        call_command("create_api_key", "bad", "--scopes", "root", stdout=io.StringIO())


@pytest.mark.django_db
def test_the_admin_sets_and_changes_the_scopes(admin_client, fast_passwords):
    response = admin_client.post("/admin/speech/apikey/add/", {"name": "made-here", "scopes": ["voices", "admin"]})
    assert response.status_code == 302, response.content[:500]
    row = ApiKey.objects.get(name="made-here")
    assert row.scopes == "voices admin"
    form = admin_client.get(f"/admin/speech/apikey/{row.pk}/change/").context["adminform"].form
    assert form.initial["scopes"] == ["voices", "admin"]
    admin_client.post(f"/admin/speech/apikey/{row.pk}/change/", {"name": "made-here", "scopes": ["speak"]})
    row.refresh_from_db()
    assert row.scopes == "speak"


@pytest.mark.django_db(transaction=True)
def test_keys_that_existed_before_scopes_keep_speak_and_voices():
    executor = MigrationExecutor(connection)
    before, after = [("speech", "0003_key_limits_and_messages")], [("speech", "0004_key_scopes_and_voice_owner")]
    try:
        executor.migrate(before)
        old = executor.loader.project_state(before).apps.get_model("speech", "ApiKey")
        old.objects.create(name="old", prefix="tts_0ld0ld00", hashed="0" * 64)
        executor = MigrationExecutor(connection)
        executor.migrate(after)
        new = executor.loader.project_state(after).apps.get_model("speech", "ApiKey")
        assert new.objects.get(name="old").scopes == "speak voices"
        assert new.objects.create(name="new", prefix="tts_new00000", hashed="0" * 64).scopes == "speak"
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


# -- the hostile pass -----------------------------------------------------------------------------------


async def test_a_page_on_another_origin_cannot_open_a_session(settings, process_engine):
    settings.ALLOWED_HOSTS = ["tts.example.com"]
    settings.SPEECH_ALLOWED_ORIGINS = []
    comm, accepted = await connect(headers=[(b"origin", b"https://evil.example"), (b"host", b"tts.example.com")])
    assert not accepted  # the handshake is refused (HTTP 403), no session exists
    comm, accepted = await connect(headers=[(b"origin", b"https://tts.example.com"), (b"host", b"tts.example.com")])
    assert accepted
    await comm.disconnect()


@pytest.mark.django_db(transaction=True)
def test_one_tenant_cannot_cancel_or_terminate_another_tenants_session_but_an_admin_key_can(client, keys):
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    from speech.control import registry, signals

    tenant_a, a_secret = issue("tenant-a", "speak")
    _, b_secret = issue("tenant-b", "speak")
    _, operator = issue("operator", "admin")
    sid = f"speech_ws_{'a' * 32}"
    layer = get_channel_layer()  # the session's consumer, as the REST endpoints see it: its group's member
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(signals.group(sid), channel)
    registry.opened(sid, voice="fake", engine="fake", api_key=tenant_a)
    for response in (
        client.post(f"/v1/audio/speech/sessions/{sid}/cancel", **bearer(b_secret)),
        client.delete(f"/v1/audio/speech/sessions/{sid}", **bearer(b_secret)),
    ):
        assert envelope(response, 404, "not_found_error")["message"] == f"no live session '{sid}'"
    for secret, method, path, kind in (
        (a_secret, client.post, f"/v1/audio/speech/sessions/{sid}/cancel", "cancel"),
        (operator, client.post, f"/v1/audio/speech/sessions/{sid}/cancel", "cancel"),
        (operator, client.delete, f"/v1/audio/speech/sessions/{sid}", "terminate"),
    ):
        response = method(path, **bearer(secret))
        assert (response.status_code, response.json()["signal"]) == (202, kind)
        assert async_to_sync(layer.receive)(channel)["type"] == f"speech.{kind}"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("name", "file", "status", "param"),
    [
        ("../../etc/passwd", None, 400, "name"),
        ("a/b", None, 400, "name"),
        ("renamed", samples.upload("notes.wav", b"this is text, not audio " * 400, "audio/wav"), 400, "audio_sample"),
        ("huge", samples.upload("huge.wav", b"\0" * (10 * MIB + 1), "audio/wav"), 413, "audio_sample"),
    ],
    ids=["path-traversal", "slash", "text-renamed-wav", "10MiB+1"],
)
def test_hostile_uploads_are_refused_with_the_contracts_error_and_leave_nothing(client, keys, name, file, status, param):
    _, secret = issue("tenant", "speak voices")
    error = envelope(upload(client, secret, name, file), status, "BadRequestError")
    assert error["param"] == param
    assert Voice.objects.count() == 0 and files_under(keys) == []


@pytest.mark.django_db(transaction=True)
async def test_a_token_used_twice_is_refused_the_second_time(ws_keys):
    from asgiref.sync import sync_to_async

    from speech.web import auth

    row, _ = await sync_to_async(issue)("browser", "speak")
    token, _ = await sync_to_async(auth.issue_token)(row)
    first, _ = await connect(query=f"?token={token}")
    try:
        await send(first, {"type": "session.config", "session": {}})
        assert (await event(first))["type"] == "session.configured"
    finally:
        await first.disconnect()
    second, _ = await connect(query=f"?token={token}")
    try:
        assert await event(second) == {
            "type": "error",
            "message": "Invalid or missing API key",
            "error_type": "authentication_error",
            "code": 401,
        }
        assert (await output(second))["code"] == 4008
    finally:
        await second.disconnect()
