"""The `openai` engine end to end: real daphne processes (`manage.py serve`, tests/support/live.py) whose
SPEECH_UPSTREAM_URL points at the loopback stand-in (tests/support/upstream_standin.py), real sockets both ways.

Servers (module-scoped, each stopped with SIGTERM at the end: exit 0, no traceback):
  main      the stand-in `up`, SPEECH_UPSTREAM_VOICES=alpha,beta, an API key, a model, no retries
  learning  a stand-in answering GET /v1/audio/voices, no SPEECH_UPSTREAM_VOICES, default retries
  open      a stand-in with no voice listing (404): any voice name is passed on
  refused   SPEECH_UPSTREAM_URL on a port where nothing listens

Segments that need different scripted replies are sent one at a time: the next input.text goes out
once the stand-in has recorded the previous segment's POST, so replies meet segments in order.
Every wait is a hang guard; nothing asserts on timing.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import io
import json
import os
import re
import shutil
import subprocess
import tempfile
import uuid
import wave

import numpy as np
import pytest

from tests.support.audio_samples import CONTENT_TYPES, NAMES, good
from tests.support.heard import without_heard
from tests.support.live import (
    PROJECT_ROOT,
    PYTHON,
    DaphneServer,
    SessionResult,
    collect,
    configure,
    free_port,
    is_event,
    open_session,
    port_accepts,
    segments_of,
    send_json,
    serving,
)
from tests.support.upstream_standin import Reply, StandIn, error_reply, pcm

pytestmark = pytest.mark.live

RATE = 24000
KEY = "sk-upstream-test-key"
MODEL = "up-model"
READ_TIMEOUT_S = 4  # the hang case waits this long; a held reply is cancelled well within it
QUEUE_FULL = "The request queue is full."
STARTED = []  # every server of this module, checked after each test


def server_env(url, media, **extra):
    env = {
        "SPEECH_ENGINE": "openai",
        "SPEECH_UPSTREAM_URL": url,
        "SPEECH_REQUIRE_API_KEY": "false",
        "REDIS_URL": "",
        "MEDIA_ROOT": media,
        "SPEECH_UPSTREAM_API_KEY": KEY,
        "SPEECH_UPSTREAM_READ_TIMEOUT_S": str(READ_TIMEOUT_S),
        "SPEECH_UPSTREAM_CONNECT_TIMEOUT_S": "3",
        "SPEECH_IDLE_TIMEOUT_S": "30",
    }
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def media():
    path = tempfile.mkdtemp(prefix="upstream-media-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def up():
    # A voice listing the main server must not ask for: SPEECH_UPSTREAM_VOICES names its voices.
    with StandIn(voices={"voices": ["never-asked"]}) as standin:
        yield standin


@pytest.fixture(scope="module")
def main(up, media):
    env = server_env(up.url, media, SPEECH_UPSTREAM_VOICES="alpha,beta", SPEECH_UPSTREAM_MODEL=MODEL, SPEECH_UPSTREAM_RETRIES="0")
    with serving(env) as srv:
        STARTED.append(srv)
        yield srv


@pytest.fixture(scope="module")
def learning(media):
    # vLLM-omni's listing: built-in voices plus the ones uploaded to it
    with (
        StandIn(voices={"voices": ["nova", "onyx"], "uploaded_voices": [{"name": "their-clone"}]}) as standin,
        serving(server_env(standin.url, media)) as srv,
    ):
        STARTED.append(srv)
        yield srv, standin


@pytest.fixture(scope="module")
def open_voices(media):
    with StandIn(voices=None) as standin, serving(server_env(standin.url, media, SPEECH_UPSTREAM_RETRIES="0")) as srv:
        STARTED.append(srv)
        yield srv, standin


@pytest.fixture(scope="module")
def refused(media):
    port = free_port()
    with serving(server_env(f"http://127.0.0.1:{port}/v1", media)) as srv:
        STARTED.append(srv)
        yield srv


@pytest.fixture(autouse=True)
def servers_healthy():
    yield
    for srv in STARTED:
        srv.assert_no_traceback()
        assert srv.alive() or srv.returncode is not None, f"a server died:\n{srv.stderr_text()[-4000:]}"


# -- helpers ---------------------------------------------------------------------------------------


def posts(standin):
    return [r for r in standin.requests if r.method == "POST"]


async def speak(srv, standin, config, texts):
    """A whole session, each text sent once the previous one's POST reached the stand-in.
    Returns (result, the POSTs of this session)."""
    start = len(posts(standin))
    result = SessionResult()
    ws = await open_session(srv.ws_url)
    try:
        result.configured = await configure(ws, config)
        for n, text in enumerate(texts, 1):
            await send_json(ws, {"type": "input.text", "text": text})
            await standin.reached(lambda n=n: len(posts(standin)) >= start + n)
        await send_json(ws, {"type": "input.done"})
        await collect(ws, result)
    finally:
        await ws.close()
    return result, posts(standin)[start:]


async def handshake(srv, config):
    """A session.config and everything until the close."""
    ws = await open_session(srv.ws_url)
    try:
        await send_json(ws, {"type": "session.config", "session": config})
        return await collect(ws)
    finally:
        await ws.close()


def finished(result, texts):
    """Contract ordering, one segment per text, session.done and close 1000. Returns the segments."""
    segments, problems = segments_of(result.items)
    assert problems == []
    sid = result.configured["session_id"]
    assert [s.index for s in segments] == list(range(len(texts)))
    for segment in segments:
        if segment.start is not None:
            assert segment.start["sentence_text"] == texts[segment.index].strip()
        assert segment.done["id"] == f"{sid}-{segment.index}"
        assert segment.done["total_bytes"] == len(segment.audio)
    assert result.events[-1] == {"type": "session.done", "session_id": sid, "total_sentences": len(texts)}
    assert result.close_code == 1000, (result.close_code, result.types())
    return segments


def samples(data):
    return np.frombuffer(data, "<i2").astype(np.int32)


def same_audio(got, sent):
    """16-bit PCM at the upstream's rate passes through bit for bit."""
    assert len(got) == len(sent)
    assert got == sent, f"{np.count_nonzero(samples(got) != samples(sent))} samples differ"


def body_of(text, **fields):
    return {"model": MODEL, "input": text, "response_format": "pcm", "stream_format": "audio", **fields}


def request(srv, method, path, body=None, headers=None):
    """(status, headers, raw body) of one HTTP request."""
    conn = http.client.HTTPConnection(srv.host, srv.port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


async def rest(srv, method, path, payload=None, **kwargs):
    if payload is not None:
        kwargs = {"body": json.dumps(payload), "headers": {"Content-Type": "application/json"}}
    return await asyncio.to_thread(request, srv, method, path, **kwargs)


def multipart(fields, name, filename, content_type, data):
    boundary = uuid.uuid4().hex
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode() for k, v in fields.items()]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
        f"Content-Type: {content_type}\r\n\r\n".encode()
        + data
        + b"\r\n"
    )
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def is_audio(item):
    return item.kind == "audio"


def all_of(data):
    """until() predicate: true once len(data) bytes of audio have arrived."""
    received = 0

    def check(item):
        nonlocal received
        received += len(item.data) if item.kind == "audio" else 0
        return received >= len(data)

    return check


def token(item):
    return (
        "b" if item.kind == "audio" else {"audio.start": "S", "audio.done": "D", "session.done": "E"}.get(item.data["type"], "?")
    )


def peak_hz(data, rate):
    spectrum = np.abs(np.fft.rfft(samples(data).astype(np.float64)))
    return np.argmax(spectrum) * rate / (len(data) // 2)


# -- 1. streamed sessions ------------------------------------------------------------------------------

TWO = ["Hello there. ", "How are you today? "]


async def test_streamed_session_is_one_post_per_segment_with_its_audio(main, up):
    first, second = pcm(0.3, freq=220.0), pcm(0.5, freq=330.0)
    up.script(Reply(chunks=[first[:5001], first[5001:]]), Reply(chunks=[second]))  # odd split: a sample in two
    result, requests = await speak(main, up, {"response_format": "pcm", "stream_audio": True}, TWO)
    assert re.fullmatch(r"(Sb+D){2}E", "".join(map(token, result.items)))
    segments = finished(result, TWO)
    sid = result.configured["session_id"]
    assert result.configured["engine"] == "openai" and result.configured["sample_rate"] == RATE
    assert [r.json for r in requests] == [body_of("Hello there.", voice="alpha"), body_of("How are you today?", voice="alpha")]
    assert all(r.path == "/v1/audio/speech" and r.headers["authorization"] == f"Bearer {KEY}" for r in requests)
    for segment, sent in zip(segments, (first, second)):
        assert segment.start == {
            "type": "audio.start",
            "id": f"{sid}-{segment.index}",
            "sentence_index": segment.index,
            "sentence_text": TWO[segment.index].strip(),
            "format": "pcm",
            "sample_rate": RATE,
        }
        assert segment.done["error"] is False and segment.done["cancelled"] is False
        same_audio(segment.audio, sent)


@pytest.mark.parametrize("content_type, order", [("audio/L16; rate=24000", ">i2"), ("application/octet-stream", "<i2")])
async def test_other_raw_pcm_content_types_are_read_in_their_byte_order(main, up, content_type, order):
    sent = pcm(0.2)
    up.script(Reply(headers={"content-type": content_type}, chunks=[samples(sent).astype(order).tobytes()]))
    result, _ = await speak(main, up, {"stream_audio": True}, ["Network byte order. "])
    (segment,) = finished(result, ["Network byte order. "])
    assert segment.audio == sent  # little-endian out, the same samples


async def test_sample_rate_16000_is_resampled_here(main, up):
    sent = pcm(0.6, freq=440.0)
    up.script(Reply(chunks=[sent]))
    result, requests = await speak(main, up, {"stream_audio": True, "sample_rate": 16000}, ["Lower rate please. "])
    (segment,) = finished(result, ["Lower rate please. "])
    assert result.configured["sample_rate"] == 16000 and segment.start["sample_rate"] == 16000
    assert "sample_rate" not in requests[0].json and requests[0].json["response_format"] == "pcm"
    assert abs(len(segment.audio) // 2 - int(0.6 * 16000)) <= 16
    assert abs(peak_hz(segment.audio, 16000) - 440.0) < 5  # the same tone: resampled, not relabelled


async def test_wav_is_encoded_here_as_one_file_per_segment(main, up):
    sent = pcm(0.4)
    up.script(Reply(chunks=[sent]))
    result, requests = await speak(main, up, {"response_format": "wav"}, ["A whole file. "])
    assert re.fullmatch(r"SbDE", "".join(map(token, result.items)))
    (segment,) = finished(result, ["A whole file. "])
    assert requests[0].json["response_format"] == "pcm" and segment.start["format"] == "wav"
    with wave.open(io.BytesIO(segment.frames[0]), "rb") as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (RATE, 1, 2)
        same_audio(wav.readframes(wav.getnframes()), sent)


# -- 2. forwarding ------------------------------------------------------------------------------------


async def test_session_fields_are_forwarded_and_speed_is_ours(main, up):
    sent = pcm(1.0)
    up.script(Reply(chunks=[sent]))
    config = {
        "stream_audio": True,
        "voice": "BETA",
        "model": "client-model",
        "instructions": "Speak softly.",
        "language": "English",
        "temperature": 0.7,
        "seed": 42,
        "top_p": 0.9,
        "speed": 2.0,
    }
    result, requests = await speak(main, up, config, ["Quickly now. "])
    (segment,) = finished(result, ["Quickly now. "])
    assert result.configured["voice"] == "beta"
    assert requests[0].json == {
        "model": "client-model",
        "input": "Quickly now.",
        "response_format": "pcm",
        "stream_format": "audio",
        "voice": "beta",
        "instructions": "Speak softly.",
        "language": "English",
        "temperature": 0.7,
        "seed": 42,
        "top_p": 0.9,
    }
    assert requests[0].headers["authorization"] == f"Bearer {KEY}"
    # Our own time-stretch: half as long, same pitch.
    assert 0.4 < len(segment.audio) / len(sent) < 0.6, len(segment.audio) / len(sent)
    assert abs(peak_hz(segment.audio, RATE) - 220.0) < 5


# -- 3. voices --------------------------------------------------------------------------------------------


async def test_configured_voices_default_accept_and_refuse(main, up):
    result, requests = await speak(main, up, {"stream_audio": True}, ["Default voice. "])
    finished(result, ["Default voice. "])
    assert result.configured["voice"] == "alpha" and requests[0].json["voice"] == "alpha"
    end = await handshake(main, {"voice": "zzz"})
    assert end.events == [
        {
            "type": "error",
            "message": "Unknown voice 'zzz'. Supported voices: alpha, beta",
            "error_type": "BadRequestError",
            "param": "voice",
            "code": 400,
        }
    ]
    assert end.close_code == 4008
    status, _, health = await rest(main, "GET", "/healthz")
    assert status == 200 and json.loads(health)["voices"] == ["alpha", "beta"]
    assert not [r for r in up.requests if r.method == "GET"], "asked the upstream although the setting names voices"


async def test_voices_are_learned_from_the_upstream_at_start(learning):
    srv, standin = learning
    assert [(r.path, r.headers.get("authorization")) for r in standin.requests if r.method == "GET"] == [
        ("/v1/audio/voices", f"Bearer {KEY}")
    ]
    status, _, health = await rest(srv, "GET", "/healthz")
    assert status == 200 and json.loads(health)["voices"] == ["nova", "onyx", "their-clone"]
    status, _, listing = await rest(srv, "GET", "/v1/audio/voices")
    assert status == 200 and json.loads(listing)["voices"][:3] == ["nova", "onyx", "their-clone"]
    result, requests = await speak(srv, standin, {"stream_audio": True, "voice": "onyx"}, ["Learned voice. "])
    finished(result, ["Learned voice. "])
    assert result.configured["voice"] == "onyx" and requests[0].json["voice"] == "onyx"
    end = await handshake(srv, {"voice": "zzz"})
    assert end.events[0]["message"] == "Unknown voice 'zzz'. Supported voices: nova, onyx, their-clone"
    assert end.close_code == 4008


async def test_with_no_voices_known_any_name_is_passed_on(open_voices):
    srv, standin = open_voices
    status, _, health = await rest(srv, "GET", "/healthz")
    assert status == 200 and json.loads(health)["voices"] == []
    result, requests = await speak(srv, standin, {"stream_audio": True, "voice": "Whoever-Speaks"}, ["Anyone. "])
    finished(result, ["Anyone. "])
    assert result.configured["voice"] == "Whoever-Speaks" and requests[0].json["voice"] == "Whoever-Speaks"
    result, requests = await speak(srv, standin, {"stream_audio": True}, ["Upstream's choice. "])
    finished(result, ["Upstream's choice. "])
    assert result.configured["voice"] == "default" and "voice" not in requests[0].json


# -- 4. uploaded voices -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["wav", "mp3"])
async def test_uploaded_voice_travels_as_ref_audio_and_ref_text(main, up, kind):
    name, data, transcript = f"clone-{kind}-{uuid.uuid4().hex[:8]}", good(kind), "This is how I sound."
    body, headers = multipart(
        {"name": name, "consent": "recorded with consent", "ref_text": transcript},
        "audio_sample",
        NAMES[kind],
        CONTENT_TYPES[kind],
        data,
    )
    status, _, created = await rest(main, "POST", "/v1/audio/voices", body=body, headers=headers)
    assert status == 201, created
    result, requests = await speak(main, up, {"stream_audio": True, "voice": name.upper()}, ["Say it like me. "])
    finished(result, ["Say it like me. "])
    assert result.configured["voice"] == name
    assert requests[0].json == body_of(
        "Say it like me.", ref_audio=f"data:{CONTENT_TYPES[kind]};base64,{base64.b64encode(data).decode()}", ref_text=transcript
    )


# -- 5. errors, one segment at a time ---------------------------------------------------------------------


def envelope(status, body):
    return Reply(status=status, headers={"content-type": "application/json"}, chunks=[], body=json.dumps(body).encode())


SERVER = ("server_error", None, None)
FAILURES = {
    "400": (
        error_reply(400, "language 'xx' is not supported", "language"),
        ("BadRequestError", 400, "language"),
        r"language 'xx' is not supported",
    ),
    "422-detail": (
        envelope(422, {"detail": "input is too long for this model"}),
        ("BadRequestError", 400, None),
        r"input is too long for this model",
    ),
    "422-fastapi": (
        envelope(422, {"detail": [{"loc": ["body", "top_k"], "msg": "Input should be greater than 0", "type": "greater_than"}]}),
        ("BadRequestError", 400, "top_k"),
        r"top_k: Input should be greater than 0",
    ),
    "429": (error_reply(429, "slow down", type_="rate_limit_error"), ("rate_limit_error", 429, None), r".*slow down.*"),
    "503": (error_reply(503, "busy"), SERVER, re.escape(QUEUE_FULL)),
    "500": (Reply(status=500, headers={"content-type": "text/plain"}, chunks=[], body=b"boom"), SERVER, r".*500.*boom.*"),
    "401": (error_reply(401, "bad key", type_="authentication_error"), SERVER, r".*SPEECH_UPSTREAM_API_KEY.*"),
    "content-type": (Reply(headers={"content-type": "audio/wav"}), SERVER, r".*'audio/wav', not raw PCM.*"),
    "sample-rate": (Reply(headers={"content-type": "audio/pcm", "x-sample-rate": "16000"}), SERVER, r".*16000 Hz.*"),
    "hang": (Reply(hang=True), SERVER, rf".*sent nothing for {READ_TIMEOUT_S} s.*"),
    "garbage": (Reply(raw=b"this is not HTTP at all\r\n\r\n"), SERVER, r".*invalid HTTP response.*"),
    "dropped": (Reply(drop=True), SERVER, r"upstream speech server .*"),
    "odd-byte": (Reply(chunks=[b"\x01"]), SERVER, r".*middle of a sample.*"),
}
AFTER = ["This one fails. ", "This one works. "]


@pytest.mark.parametrize("case", list(FAILURES))
async def test_a_failing_segment_reports_and_the_next_one_speaks(main, up, case):
    reply, (error_type, code, param), message = FAILURES[case]
    good_pcm = pcm(0.2, freq=330.0)
    up.script(reply, Reply(chunks=[good_pcm]))
    result, requests = await speak(main, up, {"stream_audio": True}, AFTER)
    assert len(requests) == 2, "retried although SPEECH_UPSTREAM_RETRIES=0"
    failed, spoken = finished(result, AFTER)
    sid = result.configured["session_id"]
    assert failed.start is None and failed.frames == []
    (error,) = failed.errors
    assert re.fullmatch(message, error["message"]), error
    expected = {
        "type": "error",
        "message": error["message"],
        "error_type": error_type,
        "id": f"{sid}-0",
        "sentence_index": 0,
        **({"code": code} if code else {}),
        **({"param": param} if param else {}),
    }
    assert error == expected
    assert result.events.index(error) + 1 == result.events.index(failed.done)  # error, then its audio.done
    assert failed.done == {
        "type": "audio.done",
        "id": f"{sid}-0",
        "sentence_index": 0,
        "total_bytes": 0,
        "error": True,
        "cancelled": False,
    }
    assert spoken.done["error"] is False
    same_audio(spoken.audio, good_pcm)


async def test_a_stream_breaking_off_after_audio_is_partial(main, up):
    up.script(Reply(chunks=[pcm(0.2)], break_after=True), Reply())
    result, _ = await speak(main, up, {"stream_audio": True}, AFTER)
    broken, spoken = finished(result, AFTER)
    sid = result.configured["session_id"]
    assert broken.start is not None and len(broken.audio) > 0
    (error,) = broken.errors
    assert error["error_type"] == "server_error" and error["partial_audio"] is True and "code" not in error
    assert (error["id"], error["sentence_index"]) == (f"{sid}-0", 0)
    assert broken.done == {
        "type": "audio.done",
        "id": f"{sid}-0",
        "sentence_index": 0,
        "total_bytes": len(broken.audio),
        "error": True,
        "cancelled": False,
    }
    assert spoken.done["error"] is False and len(spoken.audio) == len(pcm())


async def test_a_refused_upstream_fails_each_segment_and_the_session_ends(refused):
    ws = await open_session(refused.ws_url)
    try:
        result = SessionResult(configured=await configure(ws, {"stream_audio": True}))
        for text in AFTER:
            await send_json(ws, {"type": "input.text", "text": text})
        await send_json(ws, {"type": "input.done"})
        await collect(ws, result)
    finally:
        await ws.close()
    for segment in finished(result, AFTER):
        (error,) = segment.errors
        assert error["error_type"] == "server_error" and "unreachable" in error["message"], error
        assert segment.done["error"] is True and segment.done["total_bytes"] == 0


async def test_retries_before_audio_then_success(learning):
    srv, standin = learning  # SPEECH_UPSTREAM_RETRIES at its default, 2
    sent = pcm(0.2, freq=330.0)
    standin.script(Reply(status=503, chunks=[]), Reply(drop=True), Reply(chunks=[sent]))
    result, requests = await speak(srv, standin, {"stream_audio": True}, ["Third time lucky. "])
    (segment,) = finished(result, ["Third time lucky. "])
    assert len(requests) == 3 and len({r.body for r in requests}) == 1
    same_audio(segment.audio, sent)


# -- 6. cancellation closes the upstream connection --------------------------------------------------------


@pytest.mark.parametrize("how", ["input.cancel", "rest", "disconnect"])
async def test_cancel_closes_the_upstream_response(main, up, how):
    held = pcm(0.3)
    up.script(Reply(chunks=[held], hold=True))
    before = up.disconnects
    ws = await open_session(main.ws_url)
    try:
        sid = (await configure(ws, {"stream_audio": True}))["session_id"]
        await send_json(ws, {"type": "input.text", "text": "Please hold the line. "})
        # A client leaving waits for all the audio there is (mid-burst: test_client_leaving_mid_burst_leaves_no_traceback).
        first = await collect(ws, until=all_of(held) if how == "disconnect" else is_audio)
        assert first.close_code is None, first.types()
        if how == "disconnect":
            await ws.close()
        else:
            if how == "rest":
                status, _, body = await rest(main, "POST", f"/v1/audio/speech/sessions/{sid}/cancel", body=b"")
                assert (status, json.loads(body)) == (202, {"session_id": sid, "signal": "cancel", "status": "accepted"})
            else:
                await send_json(ws, {"type": "input.cancel"})
            after = await collect(ws, until=is_event("input.cancelled"))
            items = first.items + after.items
            (segment,), problems = segments_of(items)
            assert problems == []
            assert segment.done == {
                "type": "audio.done",
                "id": f"{sid}-0",
                "sentence_index": 0,
                "total_bytes": len(segment.audio),
                "error": False,
                "cancelled": True,
            }
            assert without_heard(items[-1].data) == {
                "type": "input.cancelled",
                "session_id": sid,
                "cancelled_sentences": 1,
                "total_sentences": 1,
                "origin": "server" if how == "rest" else "client",
            }
        await up.reached(lambda: up.disconnects == before + 1)
        if how != "disconnect":  # the session goes on with the next free index
            await send_json(ws, {"type": "input.text", "text": "Something else. "})
            await send_json(ws, {"type": "input.done"})
            rest_ = await collect(ws)
            new, problems = segments_of(rest_.items)
            assert problems == [] and [(s.index, s.done["error"]) for s in new] == [(1, False)]
            assert rest_.types()[-1] == "session.done" and rest_.close_code == 1000
    finally:
        await ws.close()


async def test_client_leaving_mid_burst_leaves_no_traceback(media):
    with StandIn(default=Reply(chunks=[pcm(20.0)], hold=True)) as standin:
        srv = DaphneServer(server_env(standin.url, media, SPEECH_UPSTREAM_RETRIES="0"))
        try:
            with srv:
                for _ in range(3):
                    ws = await open_session(srv.ws_url)
                    try:
                        await configure(ws, {"stream_audio": True})
                        await send_json(ws, {"type": "input.text", "text": "A long answer. "})
                        await collect(ws, until=is_audio)  # 20 s of audio at once: the frames go out in a burst
                    finally:
                        await ws.close()
                    # The upstream response was closed (mid-body: counted in `open`, not `disconnects`).
                    await standin.reached(lambda: standin.open == 0)
            assert srv.stopped_by_sigterm and srv.returncode == 0
            srv.assert_no_traceback()
        finally:
            srv.cleanup()


# -- 8. REST one-shot ------------------------------------------------------------------------------------


async def test_rest_speech_streams_through_the_upstream(main, up):
    first, second = pcm(0.2, freq=220.0), pcm(0.3, freq=330.0)
    up.script(Reply(chunks=[first]), Reply(chunks=[second]))
    start = len(posts(up))
    status, headers, data = await rest(
        main,
        "POST",
        "/v1/audio/speech",
        {"input": "One sentence here. Another one there.", "voice": "beta", "stream": True, "response_format": "pcm"},
    )
    assert status == 200, data[:500]
    assert (headers["Content-Type"], headers["X-Sample-Rate"], headers["X-Channels"], headers["X-Bit-Depth"]) == (
        "audio/pcm",
        str(RATE),
        "1",
        "16",
    )
    assert [r.json for r in posts(up)[start:]] == [
        body_of("One sentence here.", voice="beta"),
        body_of("Another one there.", voice="beta"),
    ]
    same_audio(data, first + second)


@pytest.mark.parametrize(
    "reply, status, expected",
    [
        (error_reply(503, "busy"), 503, {"message": QUEUE_FULL, "type": "server_error", "param": None, "code": 503}),
        pytest.param(
            error_reply(400, "language 'xx' is not supported", "language"),
            400,
            {"message": "language 'xx' is not supported", "type": "BadRequestError", "param": "language", "code": 400},
        ),
        pytest.param(
            error_reply(429, "slow down", type_="rate_limit_error"),
            429,
            {
                "message": "upstream speech server is rate limiting: slow down",
                "type": "rate_limit_error",
                "param": None,
                "code": 429,
            },
        ),
    ],
    ids=["503", "400", "429"],
)
async def test_rest_speech_upstream_error_gets_the_envelope(main, up, reply, status, expected):
    up.script(reply)
    got, headers, data = await rest(
        main, "POST", "/v1/audio/speech", {"input": "Fails upstream.", "stream": True, "response_format": "pcm"}
    )
    assert (got, headers["Content-Type"]) == (status, "application/json"), data[:300]
    assert json.loads(data) == {"error": expected}


# -- 7. connections are pooled and never leaked -----------------------------------------------------------


async def test_sequential_segments_reuse_one_connection(main, up):
    texts = ["One. ", "Two. ", "Three. ", "Four. "]
    before = up.connections
    ws = await open_session(main.ws_url)
    try:
        await configure(ws, {"stream_audio": True})
        for text in texts:  # one at a time: no look-ahead, so one connection can serve them all
            await send_json(ws, {"type": "input.text", "text": text})
            done = await collect(ws, until=is_event("audio.done"))
            assert done.close_code is None and done.events[-1]["error"] is False
    finally:
        await ws.close()
    assert up.connections - before <= 1, f"{up.connections - before} connections for {len(texts)} segments"


async def leak_candidates(srv, standin):
    """Sessions that fail, break off, hang up and cancel, each ending before the next."""
    standin.script(error_reply(400, "no"), Reply(chunks=[pcm(0.1)], break_after=True), Reply(status=500, chunks=[]))
    result, _ = await speak(srv, standin, {"stream_audio": True}, ["Fails. ", "Breaks. ", "Fails again. "])
    assert [s.done["error"] for s in finished(result, ["Fails. ", "Breaks. ", "Fails again. "])] == [True] * 3
    for how in ("cancel", "leave"):
        held = pcm(0.1)
        standin.script(Reply(chunks=[held], hold=True))
        before = standin.disconnects
        ws = await open_session(srv.ws_url)
        try:
            await configure(ws, {"stream_audio": True})
            await send_json(ws, {"type": "input.text", "text": "Held. "})
            await collect(ws, until=all_of(held))
            if how == "cancel":
                await send_json(ws, {"type": "input.cancel"})
                assert (await collect(ws, until=is_event("input.cancelled"))).close_code is None
        finally:
            await ws.close()
        await standin.reached(lambda before=before: standin.disconnects == before + 1)


async def test_zz_no_upstream_connection_outlives_its_use_or_the_server(main, up):
    """Runs last: it stops the main server."""
    await leak_candidates(main, up)
    # While the server runs only idle pooled connections remain: a session holds at most two.
    await up.reached(lambda: up.open <= 2)
    code = await asyncio.to_thread(main.stop)
    assert main.stopped_by_sigterm and code == 0, main.stderr_text()[-3000:]
    await up.reached(lambda: up.open == 0)
    main.assert_no_traceback()


# -- 9. the system check ---------------------------------------------------------------------------------


@pytest.mark.parametrize("url", [None, "gpu-host:8000/v1"], ids=["unset", "no-scheme"])
def test_check_and_serve_refuse_openai_without_an_upstream_url(tmp_path, url):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "ttsproject.settings",
        "SPEECH_ENGINE": "openai",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "MEDIA_ROOT": str(tmp_path / "media"),
    }
    env.pop("SPEECH_UPSTREAM_URL", None)
    env.update({"SPEECH_UPSTREAM_URL": url} if url else {})
    done = subprocess.run([PYTHON, "manage.py", "check"], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "speech.E005" in done.stderr, done.stdout + done.stderr
    port = free_port()
    served = subprocess.run(
        [PYTHON, "manage.py", "serve", "--host", "127.0.0.1", "--port", str(port)],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert served.returncode != 0 and "speech.E005" in served.stderr, served.stdout + served.stderr
    assert "Traceback" not in served.stderr and not port_accepts("127.0.0.1", port)
