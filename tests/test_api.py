"""REST endpoints (docs/protocol.md, REST endpoints) through Django's test client: voices list/upload/delete, tokens,
the error envelope, the 413 before reading, API keys, and keys/tokens never reaching the logs."""

from __future__ import annotations

import asyncio
import io
import logging

import pytest
from django.core.asgi import get_asgi_application
from django.utils import timezone

from speech.models import AccessToken, ApiKey, Voice
from speech.web.bodylimit import UploadLimit

from .support import audio_samples as samples

VOICES = "/v1/audio/voices"
TOKENS = "/v1/audio/speech/tokens"
MIB = 1024 * 1024
CONSENT = "Recorded with the speaker's written consent."


@pytest.fixture(autouse=True)
def engine(process_engine):
    return process_engine


@pytest.fixture
def media(media, settings):
    settings.SPEECH_REQUIRE_API_KEY = False
    return media


@pytest.fixture
def keys_required(settings, media):
    settings.SPEECH_REQUIRE_API_KEY = True


def files_under(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) if root.exists() else []


def assert_envelope(response, status, *, type_="BadRequestError", param="any", message=None):
    assert response.status_code == status, (response.status_code, response.content[:500])
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert list(body) == ["error"]
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status
    assert error["type"] == type_
    assert isinstance(error["message"], str) and error["message"]
    if param != "any":
        assert error["param"] == param
    if message is not None:
        assert error["message"] == message
    return error


def bearer(key):
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


def upload(client, name="alice", kind="wav", *, consent=CONSENT, ref_text=None, file=None, headers=None, **extra):
    data = {"name": name, "consent": consent, "audio_sample": file or samples.good_upload(kind)}
    if ref_text is not None:
        data["ref_text"] = ref_text
    data.update(extra)
    return client.post(VOICES, data, **(headers or {}))


# -- GET ---------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_get_lists_engine_voices_and_active_uploaded_voices(client, media):
    assert upload(client, "Zed", "flac", ref_text="Hello.", language="en").status_code == 201
    assert upload(client, "bea", "mp3").status_code == 201
    assert upload(client, "off", "ogg").status_code == 201
    Voice.objects.filter(name="off").update(is_active=False)
    response = client.get(VOICES)
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    assert body["voices"][:2] == ["fake", "alt"]
    assert sorted(body["voices"][2:]) == ["Zed", "bea"]
    assert [v["name"] for v in body["data"]] == body["voices"]
    assert body["data"][0] == {"id": "fake", "name": "fake", "object": "voice", "type": "builtin"}
    zed = next(v for v in body["data"] if v["name"] == "Zed")
    created = Voice.objects.get(name="Zed").created_at
    assert zed == {
        "id": "Zed",
        "name": "Zed",
        "object": "voice",
        "type": "uploaded",
        "language": "en",
        "ref_text": "Hello.",
        "sample_rate": 22050,
        "duration_s": pytest.approx(2.0, abs=0.05),
        "created_at": int(created.timestamp()),
    }


@pytest.mark.django_db
def test_get_with_no_uploads_lists_the_engine_voices(client, media):
    body = client.get(VOICES).json()
    assert body["voices"] == ["fake", "alt"]


# -- POST ----------------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("kind", samples.ALLOWED)
def test_upload_of_each_container_is_created(client, media, kind):
    response = upload(client, f"v-{kind}", kind, ref_text="  What I say.  ")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["id"] == body["name"] == f"v-{kind}"
    assert body["object"] == "voice" and body["type"] == "uploaded"
    assert body["ref_text"] == "What I say."
    assert body["sample_rate"] == samples.RATES[kind]
    assert body["duration_s"] == pytest.approx(2.0, abs=0.05)
    voice = Voice.objects.get(name=f"v-{kind}")
    assert voice.consent == CONSENT and voice.container == kind
    assert voice.created_by == "rest"
    assert files_under(media) == [voice.audio.name]
    assert (media / voice.audio.name).read_bytes() == samples.good(kind)
    assert body["created_at"] == int(voice.created_at.timestamp())


def _bad(name, data, ctype="application/octet-stream"):
    return lambda: samples.upload(name, data, ctype)


BAD_FILES = {
    "truncated": (_bad("a.mp3", samples.good("mp3")[:100], "audio/mpeg"), "audio_sample is not a readable audio file"),
    "non-audio": (_bad("a.wav", samples.TEXT, "audio/wav"), "audio_sample is not a readable audio file"),
    "png": (_bad("a.wav", samples.PNG, "audio/wav"), None),
    "empty": (_bad("a.wav", b"", "audio/wav"), None),
    "silent": (_bad("a.wav", samples.silent("wav"), "audio/wav"), "audio_sample is silent"),
    "silent-ogg": (_bad("a.ogg", samples.silent("ogg"), "audio/ogg"), "audio_sample is silent"),
    "too-short": (_bad("a.wav", samples.wav_bytes(0.5), "audio/wav"), "audio_sample must be 1 to 30 seconds long (it is 0.5 s)"),
    "too-long": (
        _bad("a.wav", samples.wav_bytes(31.0, rate=8000), "audio/wav"),
        "audio_sample must be 1 to 30 seconds long (it is 31.0 s)",
    ),
    "aiff-named-wav": (
        _bad("a.wav", samples.sample("aiff"), "audio/wav"),
        "audio_sample must be one of: flac, m4a, mp3, ogg, wav, webm",
    ),
    "raw-pcm-named-wav": (_bad("a.wav", samples.raw_pcm_bytes(), "audio/wav"), None),
    "lying-extension": (
        _bad("a.mp3", samples.good("wav"), "application/octet-stream"),
        "audio_sample is wav audio but its name says .mp3",
    ),
    "lying-content-type": (
        _bad("a.wav", samples.good("wav"), "audio/mpeg"),
        "audio_sample is wav audio but was sent as audio/mpeg",
    ),
    "video-only-mp4": (_bad("a.mp4", samples.video_only("mp4", "mpeg4"), "video/mp4"), "audio_sample holds no audio"),
}


@pytest.mark.django_db
@pytest.mark.parametrize("case", BAD_FILES)
def test_every_bad_file_is_a_400_envelope_and_leaves_nothing(client, media, case):
    make, message = BAD_FILES[case]
    response = upload(client, "alice", file=make())
    assert_envelope(response, 400, param="audio_sample", message=message)
    assert Voice.objects.count() == 0
    assert files_under(media) == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    "name,message",
    [
        ("a/b", None),
        ("..", None),
        ("...", None),
        ("", None),
        ("n" * 65, None),
        ("white space", None),
        ("default", "name 'default' is reserved"),
        ("HEART", "name 'HEART' is reserved"),
        ("Fake", "name 'Fake' is reserved"),
    ],
)
def test_bad_names_are_a_400_envelope_with_param_name(client, media, name, message):
    error = assert_envelope(upload(client, name), 400, param="name", message=message)
    if message is None:
        assert error["message"].startswith("name must be 1 to 64 letters, digits")
    assert Voice.objects.count() == 0
    assert files_under(media) == []


@pytest.mark.django_db
@pytest.mark.parametrize("consent", ["", "   \n\t"])
def test_missing_consent_is_refused(client, media, consent):
    assert_envelope(upload(client, consent=consent), 400, param="consent", message="consent must be a non-empty string")
    assert Voice.objects.count() == 0 and files_under(media) == []


@pytest.mark.django_db
def test_consent_field_absent_is_refused(client, media):
    response = client.post(VOICES, {"name": "alice", "audio_sample": samples.good_upload()})
    assert_envelope(response, 400, param="consent")
    assert Voice.objects.count() == 0 and files_under(media) == []


@pytest.mark.django_db
def test_missing_audio_sample_is_refused(client, media):
    response = client.post(VOICES, {"name": "alice", "consent": CONSENT})
    assert_envelope(response, 400, param="audio_sample", message="audio_sample is required (multipart file)")
    response = client.post(VOICES, {"name": "alice", "consent": CONSENT, "audio_sample": "not a file"})
    assert_envelope(response, 400, param="audio_sample")
    assert Voice.objects.count() == 0


@pytest.mark.django_db
def test_a_json_body_is_refused_with_the_envelope(client, media):
    response = client.post(VOICES, {"name": "alice", "consent": CONSENT}, content_type="application/json")
    assert_envelope(response, 400, param="audio_sample")


@pytest.mark.django_db
def test_a_duplicate_name_differing_in_case_is_refused(client, media):
    assert upload(client, "Alice").status_code == 201
    before = files_under(media)
    assert_envelope(upload(client, "aLICE", "flac"), 400, param="name", message="a voice named 'aLICE' exists already")
    assert Voice.objects.count() == 1
    assert files_under(media) == before


# -- size ------------------------------------------------------------------------------------------------


class CountingInput(io.RawIOBase):
    """A wsgi.input that hands out `size` bytes on demand and counts how many were read."""

    def __init__(self, size):
        self.size, self.consumed = size, 0

    def readable(self):
        return True

    def read(self, n=-1):
        n = self.size - self.consumed if n is None or n < 0 else min(n, self.size - self.consumed)
        self.consumed += n
        return b"x" * n

    def readline(self, limit=-1):
        return self.read(limit if limit and limit > 0 else 8192)


@pytest.mark.django_db
def test_a_12_mib_multipart_body_is_a_413_and_leaves_nothing(client, media):
    body, ctype = samples.multipart(
        {"name": "big", "consent": CONSENT},
        {"audio_sample": ("big.wav", samples.good("wav") + b"\x00" * (12 * MIB), "audio/wav")},
    )
    assert len(body) > 12 * MIB
    response = client.generic("POST", VOICES, body, content_type=ctype)
    assert_envelope(response, 413, param="audio_sample", message="audio_sample is larger than 10 MiB")
    assert Voice.objects.count() == 0
    assert files_under(media) == []


@pytest.mark.django_db
def test_an_oversized_content_length_is_refused_before_a_byte_of_the_body_is_read(client, media):
    stream = CountingInput(12 * MIB)
    response = client.generic(
        "POST",
        VOICES,
        b"",
        content_type="multipart/form-data; boundary=xyz",
        **{"wsgi.input": stream, "CONTENT_LENGTH": str(12 * MIB)},
    )
    assert_envelope(response, 413, param="audio_sample")
    assert stream.consumed == 0
    assert Voice.objects.count() == 0 and files_under(media) == []


@pytest.mark.django_db
def test_a_file_just_over_10_mib_inside_the_slack_is_a_413(client, media):
    data = b"RIFF" + b"\x00" * (10 * MIB - 3)
    response = upload(client, "big", file=samples.upload("big.wav", data, "audio/wav"))
    assert_envelope(response, 413, param="audio_sample")
    assert Voice.objects.count() == 0 and files_under(media) == []


@pytest.mark.django_db
def test_a_file_of_exactly_10_mib_is_judged_by_its_content(client, media):
    data = samples.wav_bytes(10 * MIB / 2 / 48000, rate=48000)[: 10 * MIB]
    assert len(data) == 10 * MIB
    error = assert_envelope(upload(client, "big", file=samples.upload("big.wav", data, "audio/wav")), 400, param="audio_sample")
    assert "seconds long" in error["message"]


@pytest.mark.django_db
async def test_asgi_refuses_an_oversized_body_before_receiving_it(media):
    app = UploadLimit(get_asgi_application())  # as ttsproject/asgi.py serves HTTP
    total, chunk = 12 * MIB, 64 * 1024
    received = 0
    sent = []

    async def receive():
        nonlocal received
        if received >= total:
            await asyncio.Event().wait()  # nothing more: a well-behaved client waits for the answer
        received += chunk
        return {"type": "http.request", "body": b"x" * chunk, "more_body": received < total}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": VOICES,
        "raw_path": VOICES.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"localhost"),
            (b"content-type", b"multipart/form-data; boundary=xyz"),
            (b"content-length", str(total).encode()),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    await asyncio.wait_for(app(scope, receive, send), 30)
    start = next(m for m in sent if m["type"] == "http.response.start")
    assert start["status"] == 413
    assert received < MIB, f"{received} body bytes were read before the 413"


# -- DELETE ------------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("asked", ["Alice", "alice", "ALICE"])
def test_delete_ignores_case_and_removes_row_and_file(client, media, asked):
    assert upload(client, "Alice").status_code == 201
    assert upload(client, "other", "flac").status_code == 201
    other = Voice.objects.get(name="other")
    response = client.delete(f"{VOICES}/{asked}")
    assert response.status_code == 200
    assert response.json() == {"id": "Alice", "object": "voice", "deleted": True}
    assert list(Voice.objects.values_list("name", flat=True)) == ["other"]
    assert files_under(media) == [other.audio.name]
    assert client.get(VOICES).json()["voices"] == ["fake", "alt", "other"]


@pytest.mark.django_db(transaction=True)
def test_delete_of_an_inactive_voice_removes_it_too(client, media):
    assert upload(client, "quiet").status_code == 201
    Voice.objects.update(is_active=False)
    assert client.delete(f"{VOICES}/quiet").status_code == 200
    assert Voice.objects.count() == 0 and files_under(media) == []


@pytest.mark.django_db
def test_delete_of_a_missing_voice_is_a_404_envelope(client, media):
    assert_envelope(
        client.delete(f"{VOICES}/nobody"), 404, type_="not_found_error", param="name", message="voice 'nobody' not found"
    )


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/v1/nothing", "/v1/audio/voices/a/b", "/v1/audio/speech/stream", "/nothing/here"])
def test_unknown_urls_are_a_404_envelope(client, media, path):
    assert_envelope(client.get(path), 404, type_="not_found_error")


@pytest.mark.django_db
@pytest.mark.parametrize("method,path", [("put", VOICES), ("get", f"{VOICES}/alice"), ("get", TOKENS)])
def test_a_wrong_method_is_an_enveloped_405(client, media, method, path):
    assert_envelope(getattr(client, method)(path), 405, param=None)


# -- API keys ------------------------------------------------------------------------------------------------

AUTH = dict(type_="authentication_error", param=None, message="Invalid or missing API key")


@pytest.fixture
def key(db):
    return ApiKey.issue("client", scopes="speak voices")


def bad_credentials(key_row, secret):
    revoked, revoked_secret = ApiKey.issue("revoked")
    revoked.revoked_at = timezone.now()
    revoked.save()
    wrong_secret = secret.split(".", 1)[0] + ".not-the-secret"
    return {
        "none": {},
        "wrong-secret": bearer(wrong_secret),
        "junk": bearer("junk"),
        "unknown-prefix": bearer("tts_00000000.abc"),
        "empty-bearer": {"HTTP_AUTHORIZATION": "Bearer "},
        "basic-scheme": {"HTTP_AUTHORIZATION": f"Basic {secret}"},
        "bare-key": {"HTTP_AUTHORIZATION": secret},
        "revoked": bearer(revoked_secret),
    }


@pytest.mark.django_db(transaction=True)
def test_with_keys_required_every_endpoint_refuses_without_a_good_key(client, keys_required, media, key):
    row, secret = key
    assert upload(client, "kept", headers=bearer(secret)).status_code == 201
    calls = {
        "list": lambda h: client.get(VOICES, **h),
        "upload": lambda h: upload(client, "newone", headers=h),
        "delete": lambda h: client.delete(f"{VOICES}/kept", **h),
        "tokens": lambda h: client.post(TOKENS, **h),
    }
    for cred_name, headers in bad_credentials(row, secret).items():
        for call_name, call in calls.items():
            response = call(headers)
            assert response.status_code == 401, (cred_name, call_name)
            assert_envelope(response, 401, **AUTH)
    assert list(Voice.objects.values_list("name", flat=True)) == ["kept"]
    assert len(files_under(media)) == 1
    assert AccessToken.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_with_keys_required_a_good_key_opens_every_endpoint(client, keys_required, media, key):
    row, secret = key
    response = upload(client, "mine", headers=bearer(secret))
    assert response.status_code == 201
    assert Voice.objects.get(name="mine").created_by == row.prefix
    assert client.get(VOICES, **bearer(secret)).json()["voices"] == ["fake", "alt", "mine"]
    assert client.get(VOICES, HTTP_AUTHORIZATION=f"bearer   {secret}  ").status_code == 200
    assert client.delete(f"{VOICES}/MINE", **bearer(secret)).status_code == 200
    assert files_under(media) == []
    assert_envelope(client.delete(f"{VOICES}/mine", **bearer(secret)), 404, type_="not_found_error")


@pytest.mark.django_db
def test_a_key_revoked_after_use_stops_working(client, keys_required, key):
    row, secret = key
    assert client.get(VOICES, **bearer(secret)).status_code == 200
    ApiKey.objects.filter(pk=row.pk).update(revoked_at=timezone.now())
    assert_envelope(client.get(VOICES, **bearer(secret)), 401, **AUTH)


@pytest.mark.django_db
def test_unknown_urls_stay_404_when_keys_are_required(client, keys_required):
    assert_envelope(client.get("/v1/nothing"), 404, type_="not_found_error")


@pytest.mark.django_db
@pytest.mark.parametrize("required", [False, True])
def test_tokens_always_require_a_key(client, settings, key, required):
    settings.SPEECH_REQUIRE_API_KEY = required
    assert_envelope(client.post(TOKENS), 401, **AUTH)
    assert AccessToken.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize("required", [False, True])
def test_tokens_are_issued_for_a_key_and_stored_hashed(client, settings, key, required):
    settings.SPEECH_REQUIRE_API_KEY = required
    row, secret = key
    before = timezone.now()
    response = client.post(TOKENS, **bearer(secret))
    assert response.status_code == 201
    body = response.json()
    assert set(body) == {"token", "expires_in"}
    assert body["token"].startswith("tok_") and len(body["token"]) > 30
    assert body["expires_in"] == 60
    stored = AccessToken.objects.get()
    assert stored.key_id == row.pk
    assert stored.hashed == ApiKey.digest(body["token"]) != body["token"]
    assert stored.used_at is None
    assert 55 <= (stored.expires_at - before).total_seconds() <= 65
    second = client.post(TOKENS, **bearer(secret)).json()["token"]
    assert second != body["token"]


@pytest.mark.django_db
def test_a_token_is_not_an_api_key(client, keys_required, key):
    row, secret = key
    token = client.post(TOKENS, **bearer(secret)).json()["token"]
    assert_envelope(client.get(VOICES, **bearer(token)), 401, **AUTH)
    assert_envelope(client.post(TOKENS, **bearer(token)), 401, **AUTH)


@pytest.mark.django_db(transaction=True)
def test_keys_and_tokens_never_reach_the_logs(client, settings, media, caplog):
    caplog.set_level(logging.DEBUG)
    settings.SPEECH_REQUIRE_API_KEY = True
    row, secret = ApiKey.issue("logged", scopes="speak voices")
    revoked, revoked_secret = ApiKey.issue("gone")
    ApiKey.objects.filter(pk=revoked.pk).update(revoked_at=timezone.now())
    wrong = row.prefix + ".wrong-secret-value-123"
    token = client.post(TOKENS, **bearer(secret)).json()["token"]
    for headers in (bearer(secret), bearer(wrong), bearer(revoked_secret), bearer(token), {}):
        client.get(VOICES, **headers)
        upload(client, "logme", headers=headers, file=samples.upload("x.wav", samples.TEXT, "audio/wav"))
        client.delete(f"{VOICES}/nobody", **headers)
        client.post(TOKENS, **headers)
        client.get(f"/v1/missing?token={token}", **headers)
    assert upload(client, "logme", headers=bearer(secret)).status_code == 201
    assert client.delete(f"{VOICES}/logme", **bearer(secret)).status_code == 200
    assert any(r.name == "django.request" for r in caplog.records), "the requests were not logged at all"
    everything = caplog.text + "\n".join(f"{r.getMessage()} {r.args!r} {r.__dict__.get('exc_text')!r}" for r in caplog.records)
    secret_part = secret.split(".", 1)[1]
    for value in (secret, secret_part, revoked_secret, revoked_secret.split(".", 1)[1], wrong, token, token[4:]):
        assert value not in everything


# -- session signals: live or not, in the first milliseconds -------------------------------------------------


def _member_of(session_id):
    """The session's consumer, as far as the REST endpoints can see it: a member of its group."""
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    from speech.control import signals

    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(signals.group(session_id), channel)
    return layer, channel


@pytest.mark.django_db(transaction=True)
def test_a_row_written_while_a_signal_is_checked_does_not_make_a_live_session_404(client, media, monkeypatch):
    """Without keys the registry row is written in the background: a REST signal can first find no
    live row, and then the row, written in between. The session is live: 202, and the signal sent."""
    from speech.control import registry

    sid = "speech_ws_" + "a" * 32
    layer, channel = _member_of(sid)
    looked_up = registry.live_session

    def row_written_right_after(session_id, api_key=None):
        found = looked_up(session_id, api_key)
        registry.opened(session_id, voice="fake", engine="fake")
        return found

    monkeypatch.setattr(registry, "live_session", row_written_right_after)
    response = client.post(f"/v1/audio/speech/sessions/{sid}/cancel")
    assert (response.status_code, response.json()) == (202, {"session_id": sid, "signal": "cancel", "status": "accepted"})
    from asgiref.sync import async_to_sync

    signal = async_to_sync(layer.receive)(channel)
    assert signal["type"] == "speech.cancel" and signal["session_id"] == sid


@pytest.mark.django_db(transaction=True)
def test_a_session_with_an_ended_row_is_404_whatever_its_group_says(client, media):
    """A crash can leave a group entry behind; the ended row is the answer."""
    from django.utils import timezone

    from speech.control import registry
    from speech.models import SessionRecord

    sid = "speech_ws_" + "b" * 32
    _member_of(sid)
    registry.opened(sid, voice="fake", engine="fake")
    end = {"status": SessionRecord.Status.COMPLETED, "segments": 1, "bytes_sent": 10, "first_audio_s": 0.05}
    assert registry.write_batch([{"session_id": sid, "ended_at": timezone.now(), **end}]) == [None]
    error = assert_envelope(client.delete(f"/v1/audio/speech/sessions/{sid}"), 404, type_="not_found_error")
    assert sid in error["message"]


@pytest.mark.django_db(transaction=True)
def test_a_live_session_out_of_its_group_gets_503_not_a_202_that_reaches_no_one(client, media):
    """Its row says live and its instance beats, but it is not in its group (its instance has not joined
    again since Redis lost the groups): a signal sent now would be lost, so the answer is 503."""
    from speech.control import registry

    sid = "speech_ws_" + "c" * 32
    registry.opened(sid, voice="fake", engine="fake")
    for method in (client.post, client.delete):
        path = f"/v1/audio/speech/sessions/{sid}" + ("/cancel" if method == client.post else "")
        error = assert_envelope(method(path), 503, type_="server_error")
        assert error["message"].startswith("signals are unavailable: the instance holding the session has not rejoined")
    _member_of(sid)
    response = client.post(f"/v1/audio/speech/sessions/{sid}/cancel")
    assert (response.status_code, response.json()) == (202, {"session_id": sid, "signal": "cancel", "status": "accepted"})
