"""WebSocket authentication and per-key session limits through channels' WebsocketCommunicator
(docs/protocol.md, Authentication: `authentication_error` 401 then close 4008; `rate_limit_error` 429 then close 4013),
and uploaded voices in a session (issue 4, item 4). In-process slots here; Redis across real
daphne instances is in test_keys_live.py."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.utils import timezone

import speech.control.slots
from speech.control.slots import LocalSlots
from speech.engines.fake import FakeEngine
from speech.models import AccessToken, ApiKey, Voice
from speech.voices import create_voice
from speech.web import auth

from .support import audio_samples as samples
from .support.communicator import HANG_GUARD_S, PATH, application, event, output, send

# reserved_names() asks the process engine: a FakeEngine (conftest), so no model is loaded.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("process_engine")]

AUTH_EVENT = {"type": "error", "message": "Invalid or missing API key", "error_type": "authentication_error", "code": 401}


def limit_event(limit):
    return {
        "type": "error",
        "message": f"Too many concurrent sessions for this API key (limit {limit})",
        "error_type": "rate_limit_error",
        "code": 429,
    }


# -- fixtures --------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def slots(monkeypatch):
    fresh = LocalSlots()
    monkeypatch.setattr(speech.control.slots, "_slots", fresh)
    return fresh


@pytest.fixture
def keys_on(settings):
    settings.SPEECH_REQUIRE_API_KEY = True
    settings.SPEECH_MAX_SESSIONS_PER_KEY = 2


@pytest.fixture
def keys_off(settings):
    settings.SPEECH_REQUIRE_API_KEY = False


@pytest.fixture
def key(transactional_db):
    return ApiKey.issue("client")


@pytest.fixture
async def ws():
    """Factory of connected communicators; every one is disconnected at the end."""
    opened = []

    async def connect(engine=None, *, secret=None, token=None, headers=None):
        hdrs = list(headers or [])
        if secret is not None:
            hdrs.append((b"authorization", f"Bearer {secret}".encode("latin1")))
        url = PATH + (f"?token={token}" if token is not None else "")
        comm = WebsocketCommunicator(application(engine or FakeEngine()), url, headers=hdrs)
        opened.append(comm)
        ok, _ = await comm.connect(HANG_GUARD_S)
        assert ok, "the handshake is accepted; refusals come as an error event and a close"
        return comm

    yield connect
    for comm in opened:
        try:
            await comm.disconnect()
        except (Exception, asyncio.CancelledError):  # a test that failed may have left it cancelled
            pass


# -- helpers ------------------------------------------------------------------------------------------------


async def configure(comm, **config):
    await send(comm, {"type": "session.config", "session": config})
    return await event(comm, "session.configured")


async def closed_with(comm, code):
    message = await output(comm)
    assert message["type"] == "websocket.close", message
    assert message.get("code") == code, message


async def refused(comm, expected_event, close_code):
    assert await event(comm) == expected_event
    await closed_with(comm, close_code)
    assert await comm.receive_nothing(0.05)


async def admitted(comm):
    """The session is live: it answers session.config with session.configured."""
    return await configure(comm)


async def run_to_end(comm, text="Hello there. "):
    await send(comm, {"type": "input.text", "text": text})
    await send(comm, {"type": "input.done"})
    while True:
        message = await output(comm)
        if message["type"] == "websocket.close":
            assert message.get("code") == 1000, message
            return
        if message.get("text"):
            assert json.loads(message["text"])["type"] != "error", message


def slot_count(slots, key_row):
    return len(slots._held.get(key_row.prefix, set()))


# -- authentication ------------------------------------------------------------------------------------------


async def test_a_header_key_is_accepted(keys_on, key, ws, slots):
    row, secret = key
    comm = await ws(secret=secret)
    configured = await admitted(comm)
    assert configured["engine"] == "fake"
    assert slot_count(slots, row) == 1
    await run_to_end(comm)


async def test_the_bearer_scheme_is_case_insensitive(keys_on, key, ws):
    row, secret = key
    comm = await ws(headers=[(b"authorization", f"bearer {secret}".encode())])
    await admitted(comm)


async def test_a_missing_key_is_an_authentication_error_then_4008(keys_on, key, ws, slots):
    comm = await ws()
    await refused(comm, AUTH_EVENT, 4008)
    assert slots._held == {}


@pytest.mark.parametrize("credential", ["wrong-secret", "junk", "unknown-prefix", "token-as-key", "basic", "empty"])
async def test_a_bad_key_is_an_authentication_error_then_4008(keys_on, key, ws, slots, credential):
    row, secret = key
    token, _ = await sync_to_async(auth.issue_token)(row)
    values = {
        "wrong-secret": f"Bearer {row.prefix}.definitely-not-it",
        "junk": "Bearer junk",
        "unknown-prefix": "Bearer tts_00000000.secret",
        "token-as-key": f"Bearer {token}",
        "basic": f"Basic {secret}",
        "empty": "Bearer ",
    }
    comm = await ws(headers=[(b"authorization", values[credential].encode())])
    await refused(comm, AUTH_EVENT, 4008)
    assert slots._held == {}


async def test_a_revoked_key_is_refused(keys_on, key, ws):
    row, secret = key
    await sync_to_async(ApiKey.objects.filter(pk=row.pk).update)(revoked_at=timezone.now())
    comm = await ws(secret=secret)
    await refused(comm, AUTH_EVENT, 4008)


async def test_a_session_config_sent_after_the_refusal_is_ignored(keys_on, key, ws):
    comm = await ws()
    await refused(comm, AUTH_EVENT, 4008)
    await send(comm, {"type": "session.config", "session": {}})
    assert await comm.receive_nothing(0.1)


async def test_without_required_keys_no_credential_is_needed_and_nothing_is_counted(keys_off, settings, ws, slots):
    settings.SPEECH_MAX_SESSIONS_PER_KEY = 1
    comms = [await ws() for _ in range(3)]
    for comm in comms:
        await admitted(comm)
    assert slots._held == {}


# -- tokens ----------------------------------------------------------------------------------------------------


async def test_a_token_is_accepted_once(keys_on, key, ws, slots):
    row, secret = key
    token, expires_in = await sync_to_async(auth.issue_token)(row)
    assert expires_in == 60
    first = await ws(token=token)
    await admitted(first)
    assert slot_count(slots, row) == 1
    stored = await sync_to_async(AccessToken.objects.get)()
    assert stored.used_at is not None
    await first.disconnect()
    again = await ws(token=token)
    await refused(again, AUTH_EVENT, 4008)


async def test_two_simultaneous_uses_of_one_token_admit_exactly_one(keys_on, key, ws):
    row, _ = key
    token, _ = await sync_to_async(auth.issue_token)(row)
    a, b = await asyncio.gather(ws(token=token), ws(token=token))
    firsts = []
    for comm in (a, b):
        await send(comm, {"type": "session.config", "session": {}})
        firsts.append(await event(comm))
    assert sorted(e["type"] for e in firsts) == ["error", "session.configured"]
    assert next(e for e in firsts if e["type"] == "error") == AUTH_EVENT


async def test_an_expired_token_is_refused(keys_on, key, ws):
    row, _ = key
    token, _ = await sync_to_async(auth.issue_token)(row)
    await sync_to_async(AccessToken.objects.update)(expires_at=timezone.now() - timedelta(seconds=1))
    comm = await ws(token=token)
    await refused(comm, AUTH_EVENT, 4008)


async def test_a_token_of_a_revoked_key_is_refused(keys_on, key, ws):
    row, _ = key
    token, _ = await sync_to_async(auth.issue_token)(row)
    await sync_to_async(ApiKey.objects.filter(pk=row.pk).update)(revoked_at=timezone.now())
    comm = await ws(token=token)
    await refused(comm, AUTH_EVENT, 4008)


@pytest.mark.parametrize("token", ["", "tok_unknown", "garbage%20value"])
async def test_an_unknown_or_empty_token_is_refused(keys_on, key, ws, token):
    comm = await ws(token=token)
    await refused(comm, AUTH_EVENT, 4008)


async def test_keys_and_tokens_never_reach_the_logs(keys_on, key, ws, caplog):
    caplog.set_level(logging.DEBUG)
    row, secret = key
    token, _ = await sync_to_async(auth.issue_token)(row)
    ok = await ws(token=token)
    await admitted(ok)
    await run_to_end(ok)
    for kwargs in ({"token": token}, {"secret": secret + "x"}, {"secret": secret}, {"token": "tok_nope"}):
        comm = await ws(**kwargs)
        await send(comm, {"type": "session.config", "session": {"voice": "nobody"}})
        await event(comm)
        await comm.disconnect()
    text = caplog.text + "\n".join(f"{r.getMessage()} {r.args!r}" for r in caplog.records)
    for value in (secret, secret.split(".", 1)[1], token, token[4:]):
        assert value not in text


# -- per-key limit ---------------------------------------------------------------------------------------------


async def test_the_third_concurrent_session_of_a_key_is_refused_with_429_then_4013(keys_on, key, ws, slots):
    row, secret = key
    first, second = await ws(secret=secret), await ws(secret=secret)
    await admitted(first)
    await admitted(second)
    third = await ws(secret=secret)
    await refused(third, limit_event(2), 4013)
    assert slot_count(slots, row) == 2
    await third.disconnect()
    assert slot_count(slots, row) == 2, "a refused session must not give back a slot it never had"


async def test_a_token_session_counts_against_its_key(keys_on, key, ws):
    row, secret = key
    await admitted(await ws(secret=secret))
    token, _ = await sync_to_async(auth.issue_token)(row)
    await admitted(await ws(token=token))
    token, _ = await sync_to_async(auth.issue_token)(row)
    await refused(await ws(token=token), limit_event(2), 4013)


async def test_each_key_has_its_own_count(keys_on, key, ws):
    row, secret = key
    other, other_secret = await sync_to_async(ApiKey.issue)("other")
    for _ in range(2):
        await admitted(await ws(secret=secret))
    await refused(await ws(secret=secret), limit_event(2), 4013)
    await admitted(await ws(secret=other_secret))


async def test_a_disconnect_frees_the_slot(keys_on, key, ws, slots):
    row, secret = key
    first, second = await ws(secret=secret), await ws(secret=secret)
    await admitted(first)
    await admitted(second)
    await refused(await ws(secret=secret), limit_event(2), 4013)
    await first.disconnect()
    assert slot_count(slots, row) == 1
    await admitted(await ws(secret=secret))
    await refused(await ws(secret=secret), limit_event(2), 4013)


async def test_a_disconnect_while_audio_is_being_produced_frees_the_slot(keys_on, key, ws, slots):
    row, secret = key
    engine = FakeEngine(hold=True, chunks=5)
    busy = await ws(engine, secret=secret)
    await configure(busy, stream_audio=True)
    await send(busy, {"type": "input.text", "text": "Hold on. "})
    await event(busy, "audio.start")
    other = await ws(secret=secret)
    await admitted(other)
    await refused(await ws(secret=secret), limit_event(2), 4013)
    await busy.disconnect()
    assert engine.running == 0
    assert slot_count(slots, row) == 1
    await admitted(await ws(secret=secret))


async def test_a_hang_up_gives_the_slot_back_at_once(keys_on, key, ws, slots):
    """A client gone without a close frame (1006) gives its key's slot back at the loss, before the rest
    of its teardown (consumers.TEARDOWN_DELAY_S): a client reconnecting at once is admitted."""
    row, secret = key
    engine = FakeEngine(hold=True, chunks=5)
    gone, other = await ws(engine, secret=secret), await ws(secret=secret)
    await configure(gone, stream_audio=True)
    await admitted(other)
    await send(gone, {"type": "input.text", "text": "Hold on. "})
    await event(gone, "audio.start")
    await gone.send_input({"type": "websocket.disconnect", "code": 1006})
    for _ in range(10):
        if slot_count(slots, row) == 1:
            break
        await asyncio.sleep(0)
    assert slot_count(slots, row) == 1
    assert not gone.future.done()  # its teardown is still to come
    await admitted(await ws(secret=secret))
    await gone.wait(HANG_GUARD_S)
    assert slot_count(slots, row) == 2, "the teardown must not give the slot back a second time"


async def test_a_session_that_ends_by_itself_frees_the_slot(keys_on, key, ws, slots):
    row, secret = key
    done, other = await ws(secret=secret), await ws(secret=secret)
    await admitted(done)
    await admitted(other)
    await run_to_end(done)  # session.done, close 1000
    await done.disconnect()  # the server's websocket.disconnect after the closing handshake
    assert slot_count(slots, row) == 1
    await admitted(await ws(secret=secret))
    await refused(await ws(secret=secret), limit_event(2), 4013)


@pytest.mark.parametrize("fatal", ["not-config", "bad-config", "binary-first", "unknown-voice"])
async def test_a_session_ended_by_a_fatal_error_frees_the_slot(keys_on, key, ws, slots, fatal):
    row, secret = key
    broken, other = await ws(secret=secret), await ws(secret=secret)
    await admitted(other)
    if fatal == "not-config":
        await send(broken, {"type": "input.text", "text": "hi"})
    elif fatal == "bad-config":
        await send(broken, {"type": "session.config", "session": {"speed": 99}})
    elif fatal == "binary-first":
        await broken.send_to(bytes_data=b"\x00\x01")
    else:
        await send(broken, {"type": "session.config", "session": {"voice": "nobody"}})
    error = await event(broken, "error")
    assert error["error_type"] == "BadRequestError"
    await closed_with(broken, 4008)
    await broken.disconnect()
    assert slot_count(slots, row) == 1
    await admitted(await ws(secret=secret))
    await refused(await ws(secret=secret), limit_event(2), 4013)


async def test_a_session_that_never_configures_and_times_out_frees_the_slot(keys_on, settings, key, ws, slots):
    settings.SPEECH_CONFIG_TIMEOUT_S = 0.2
    row, secret = key
    idle = await ws(secret=secret)
    assert await event(idle) == {
        "type": "error",
        "message": "session.config was not received before timeout",
        "error_type": "BadRequestError",
        "code": 400,
    }
    await closed_with(idle, 4008)
    await idle.disconnect()
    assert slot_count(slots, row) == 0


@pytest.mark.parametrize("own_limit", [1, 3])
async def test_a_keys_own_max_sessions_overrides_the_setting(keys_on, ws, own_limit, transactional_db):
    row, secret = await sync_to_async(ApiKey.issue)("own", max_sessions=own_limit)
    for _ in range(own_limit):
        await admitted(await ws(secret=secret))
    await refused(await ws(secret=secret), limit_event(own_limit), 4013)


async def test_the_setting_applies_when_the_key_has_no_limit(keys_on, settings, key, ws):
    settings.SPEECH_MAX_SESSIONS_PER_KEY = 3
    row, secret = key
    for _ in range(3):
        await admitted(await ws(secret=secret))
    await refused(await ws(secret=secret), limit_event(3), 4013)


async def test_a_key_limited_to_zero_sessions_gets_none(keys_on, ws, transactional_db):
    row, secret = await sync_to_async(ApiKey.issue)("blocked", max_sessions=0)
    comm = await ws(secret=secret)
    await send(comm, {"type": "session.config", "session": {}})
    assert await event(comm) == limit_event(0)
    await closed_with(comm, 4013)


# -- uploaded voices in a session --------------------------------------------------------------------------------


@pytest.fixture
def alice(media, transactional_db):
    data = samples.good("flac")
    voice = create_voice(
        name="Alice",
        consent="yes",
        data=data,
        filename="alice.flac",
        content_type="audio/flac",
        transcript="The quick brown fox.",
        language="en",
    )
    return voice, data


@pytest.mark.parametrize("asked", ["Alice", "alice", "ALICE"])
async def test_an_engine_with_reference_audio_receives_the_uploaded_audio_and_transcript(keys_off, alice, ws, asked):
    voice, data = alice
    engine = FakeEngine(reference_audio=True)
    comm = await ws(engine)
    configured = await configure(comm, voice=asked)
    assert configured["voice"] == "Alice"
    await send(comm, {"type": "input.text", "text": "One. Two. "})
    await send(comm, {"type": "input.done"})
    while (message := await output(comm))["type"] != "websocket.close":
        pass
    assert message["code"] == 1000
    assert len(engine.requests) == 2
    for request in engine.requests:
        reference = request.reference
        assert reference.audio == data
        assert reference.transcript == "The quick brown fox."
        assert (reference.name, reference.container, reference.language) == ("Alice", "flac", "en")
        assert request.voice == "Alice"


async def test_an_uploaded_voice_with_keys_required(keys_on, key, alice, ws):
    row, secret = key
    engine = FakeEngine(reference_audio=True)
    comm = await ws(engine, secret=secret)
    assert (await configure(comm, speaker="alice"))["voice"] == "Alice"
    await run_to_end(comm)
    assert engine.requests[0].reference.audio == alice[1]


async def test_engine_voices_carry_no_reference(keys_off, alice, ws):
    engine = FakeEngine(reference_audio=True)
    comm = await ws(engine)
    assert (await configure(comm, voice="alt"))["voice"] == "alt"
    await run_to_end(comm)
    assert engine.requests[0].reference is None


async def test_an_engine_without_reference_audio_fails_the_handshake(keys_off, alice, ws):
    engine = FakeEngine()
    comm = await ws(engine)
    await send(comm, {"type": "session.config", "session": {"voice": "alice"}})
    assert await event(comm) == {
        "type": "error",
        "error_type": "BadRequestError",
        "code": 400,
        "param": "voice",
        "message": "voice 'alice' needs an engine with reference audio; engine 'fake' has none",
    }
    await closed_with(comm, 4008)
    assert engine.requests == []


@pytest.mark.parametrize("change", ["deactivated", "deleted"])
async def test_a_deactivated_or_deleted_voice_is_unknown(keys_off, alice, ws, change):
    voice, _ = alice
    if change == "deactivated":
        await sync_to_async(Voice.objects.filter(pk=voice.pk).update)(is_active=False)
    else:
        await sync_to_async(Voice.objects.filter(pk=voice.pk).delete)()
    engine = FakeEngine(reference_audio=True)
    comm = await ws(engine)
    await send(comm, {"type": "session.config", "session": {"voice": "Alice"}})
    assert await event(comm) == {
        "type": "error",
        "error_type": "BadRequestError",
        "code": 400,
        "param": "voice",
        "message": "Unknown voice 'Alice'. Supported voices: fake, alt",
    }
    await closed_with(comm, 4008)
    assert engine.requests == []


async def test_the_voice_is_looked_up_once_at_the_handshake(keys_off, alice, ws):
    voice, data = alice
    engine = FakeEngine(reference_audio=True)
    comm = await ws(engine)
    await configure(comm, voice="alice")
    await sync_to_async(Voice.objects.filter(pk=voice.pk).update)(is_active=False)
    await run_to_end(comm, "Still me. ")
    assert engine.requests[0].reference.audio == data
