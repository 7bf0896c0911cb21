"""speech.engines.openai.OpenAIEngine against its upstream: request bodies and the mapping of statuses and
response headers through an httpx.MockTransport (tests/support/upstream_mock.py); retries, timeouts, broken
streams, garbage and connection reuse against the loopback stand-in (real sockets, real httpx).

Nothing sleeps to wait for an outcome: every await has a hang guard (GUARD_S) that only turns a hang
into a failure, and the stand-in's counters are awaited with `StandIn.reached()` (its own bounded
wait, run in a thread so the loop can finish closing sockets meanwhile).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket

import numpy as np
import pytest
from django.test import override_settings

from speech.checks import check_speech_settings
from speech.engines.openai import OpenAIEngine
from speech.stream.engine import EngineBusy, EngineError, ReferenceVoice, SynthesisRequest
from speech.stream.errors import BAD_REQUEST, QUEUE_FULL_MESSAGE, RATE_LIMIT, SERVER_ERROR, SpeechError
from speech.stream.messages import read_config

from .support.audio_samples import CONTENT_TYPES, good
from .support.upstream_mock import MockUpstream
from .support.upstream_standin import Reply, StandIn, error_reply, pcm

GUARD_S = 30  # hang guard, not a timing assertion
TONE = pcm()  # 0.2 s at 24 kHz: 9600 bytes


def samples(data):
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def req(text="Hello there.", voice="default", reference=None, **options):
    return SynthesisRequest(text=text, voice=voice, options=options, reference=reference)


async def outcome(engine, request=None):
    """(chunks yielded, the EngineError that ended the stream or None)."""
    chunks, error = [], None

    async def run():
        async for chunk in engine.stream(request or req()):
            chunks.append(chunk)

    try:
        await asyncio.wait_for(run(), GUARD_S)
    except EngineError as exc:
        error = exc
    return chunks, error


async def audio(engine, request=None):
    chunks, error = await outcome(engine, request)
    assert error is None and chunks, error
    return np.concatenate(chunks)


async def failure(engine, request=None):
    error = (await outcome(engine, request))[1]
    assert error is not None, "the stream should have failed"
    return error


def closed_port_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


@pytest.fixture
def up():
    """The loopback stand-in: real sockets, for the faults only a socket shows."""
    with StandIn() as standin:
        yield standin


@pytest.fixture
def mock():
    """The upstream as an httpx.MockTransport: request bodies, statuses and headers."""
    return MockUpstream()


@pytest.fixture
async def engines():
    made = []

    def make(url, **kwargs):
        if isinstance(url, MockUpstream):  # engines(mock): that upstream, through its transport
            url, kwargs["transport"] = url.url, url.transport
        engine = OpenAIEngine(url=url, **kwargs)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        await asyncio.wait_for(engine.aclose(), GUARD_S)


# 1. Request body and headers


async def test_body_has_input_pcm_and_audio_stream_and_no_model_or_voice_by_default(mock, engines):
    assert np.array_equal(await audio(engines(mock), req("Hi.")), samples(TONE))
    (sent,) = mock.requests
    assert (sent.method, sent.path) == ("POST", "/v1/audio/speech")
    assert sent.json == {"input": "Hi.", "response_format": "pcm", "stream_format": "audio"}
    assert sent.headers["content-type"] == "application/json"
    assert "authorization" not in sent.headers


async def test_model_from_constructor_and_overridden_by_options(mock, engines):
    engine = engines(mock.url + "/", transport=mock.transport, model="tts-1")  # a trailing slash on the URL is tolerated
    await audio(engine, req())
    await audio(engine, req(model="qwen3-omni"))
    assert [r.path for r in mock.requests] == ["/v1/audio/speech"] * 2
    assert [r.json["model"] for r in mock.requests] == ["tts-1", "qwen3-omni"]


async def test_voice_and_options_forwarded_verbatim(mock, engines):
    options = {
        "language": "German",
        "instructions": "Speak slowly.",
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 50,
        "repetition_penalty": 1.05,
        "max_new_tokens": 2048,
        "seed": 42,
    }
    await audio(engines(mock), req("Guten Tag.", voice="Ryan", **options))
    assert mock.requests[0].json == {
        "input": "Guten Tag.",
        "response_format": "pcm",
        "stream_format": "audio",
        "voice": "Ryan",
        **options,
    }


async def test_bearer_key_on_speech_and_voice_requests_only_when_set():
    mock = MockUpstream(voices={"voices": ["a"]})
    engine = OpenAIEngine(url=mock.url, api_key="sk-test", transport=mock.transport)
    await engine.warm_up()
    await audio(engine, req())
    await engine.aclose()
    assert [(r.method, r.headers.get("authorization")) for r in mock.requests] == [
        ("GET", "Bearer sk-test"),
        ("POST", "Bearer sk-test"),
    ]


# 2. Reference voices


def reference(container="wav", transcript="This is my voice."):
    return ReferenceVoice(name="alice", audio=good(container, 1.0), container=container, transcript=transcript, language="en")


@pytest.mark.parametrize("container", sorted(CONTENT_TYPES))
async def test_reference_voice_travels_as_data_url_with_transcript(mock, engines, container):
    ref = reference(container)
    await audio(engines(mock), req(voice="alice", reference=ref))
    body = mock.requests[0].json
    prefix = f"data:{CONTENT_TYPES[container]};base64,"
    assert body["ref_audio"].startswith(prefix)
    assert base64.b64decode(body["ref_audio"][len(prefix) :], validate=True) == ref.audio
    assert body["ref_text"] == "This is my voice."
    assert "voice" not in body


async def test_reference_without_transcript_sends_no_ref_text(mock, engines):
    await audio(engines(mock), req(voice="alice", reference=reference(transcript="")))
    body = mock.requests[0].json
    assert body["ref_audio"].startswith("data:audio/wav;base64,")
    assert "ref_text" not in body and "voice" not in body


async def test_clients_own_ref_audio_and_ref_text_win(mock, engines):
    mine = "data:audio/wav;base64," + base64.b64encode(good("wav", 1.0)[:100]).decode()
    await audio(engines(mock), req(voice="alice", reference=reference(), ref_audio=mine, ref_text="Mine."))
    body = mock.requests[0].json
    assert (body["ref_audio"], body["ref_text"]) == (mine, "Mine.")


# 3. PCM decoding

EDGE = np.array([0, 1, -1, 2, -2, 32767, -32768, 256, -256, 12345, -12345], dtype="<i2").tobytes()


def odd_split(data, sizes=(1, 3, 5, 2, 7, 1, 4)):
    cuts = np.cumsum([0] + [sizes[i % len(sizes)] for i in range(len(data))])
    return [data[a:b] for a, b in zip(cuts, cuts[1:]) if a < len(data)]


@pytest.mark.parametrize(
    "chunks",
    [[EDGE + TONE], odd_split(EDGE + TONE[:400]), odd_split(EDGE * 30, (9, 13))],
    ids=["whole", "odd-offsets", "odd-offsets-2"],
)
async def test_samples_are_int16_over_32768_exactly(up, engines, chunks):
    up.script(Reply(chunks=chunks))
    got = await audio(engines(up.url))
    assert got.dtype == np.float32
    assert np.array_equal(got, samples(b"".join(chunks)))


async def test_a_pcm16_request_gets_the_upstream_samples_as_they_are(up, engines):
    data = EDGE + TONE[:400]
    up.script(Reply(chunks=odd_split(data)))
    chunks, error = await outcome(engines(up.url), SynthesisRequest("Hello there.", "default", pcm16=True))
    assert error is None and chunks
    assert all(chunk.dtype == np.dtype("<i2") for chunk in chunks)
    assert b"".join(chunk.tobytes() for chunk in chunks) == data


# Word timings: none come from the upstream; the engine spreads the words over the audio it held back.

SILENCE = bytes(2 * 4800)  # 0.2 s


def timed_reply():
    """0.2 s silence, 0.5 s sound, a 0.3 s pause, 0.6 s sound, 0.2 s silence, in uneven chunks."""
    data = SILENCE + pcm(0.5) + SILENCE + bytes(2 * 2400) + pcm(0.6, freq=330.0) + SILENCE
    return data, odd_split(data, (4801, 9999, 3))


@pytest.mark.parametrize("pcm16", [False, True])
async def test_timestamps_come_first_estimated_over_the_sound_and_its_pause(up, engines, pcm16):
    from speech.stream.engine import Alignment
    from speech.stream.words import word_spans

    text = "Hello there, general Kenobi."
    data, chunks = timed_reply()
    up.script(Reply(chunks=chunks), Reply(chunks=chunks))
    engine = engines(up.url)
    timed, error = await outcome(engine, SynthesisRequest(text, "default", pcm16=pcm16, timestamps=True))
    plain, _ = await outcome(engine, SynthesisRequest(text, "default", pcm16=pcm16))
    assert error is None and isinstance(timed[0], Alignment) and timed[0].estimated
    assert not any(isinstance(item, Alignment) for item in timed[1:] + plain)
    assert b"".join(c.tobytes() for c in timed[1:]) == b"".join(c.tobytes() for c in plain)  # the audio as it came
    words = timed[0].words
    assert [(w.char_start, w.char_end) for w in words] == word_spans(text)
    times = [t for w in words for t in (w.start_s, w.end_s)]
    assert times == sorted(times)
    hello, there, general, kenobi = words
    assert 0.19 <= hello.start_s <= 0.21  # where the sound starts, not at 0
    assert 0.69 <= there.end_s <= 0.71  # the pause after the comma is the audio's pause
    assert 0.99 <= general.start_s <= 1.01
    assert 1.59 <= kenobi.end_s <= 1.61 <= len(data) / 2 / 24000


async def test_timestamps_of_silence_take_no_time(up, engines):
    from speech.stream.engine import Alignment

    up.script(Reply(chunks=[SILENCE]))
    items, error = await outcome(engines(up.url), SynthesisRequest("Nothing heard here.", "default", timestamps=True))
    assert error is None and isinstance(items[0], Alignment)
    assert [(w.start_s, w.end_s) for w in items[0].words] == [(0.0, 0.0)] * 3


async def test_trailing_odd_byte_fails(up, engines):
    up.script(Reply(chunks=[TONE[:101], TONE[101:4001]]))
    chunks, error = await outcome(engines(up.url))
    assert error.message == "upstream PCM stream ended in the middle of a sample"
    assert error.error_type == SERVER_ERROR and error.code is None
    assert np.array_equal(np.concatenate(chunks), samples(TONE[:4000]))


# 4. Error mapping

BIG = b"x" * (8 * 1024 * 1024)


@pytest.mark.parametrize(
    "reply, error_type, code, message, param",
    [
        (error_reply(400, "Input text is too long.", param="input"), BAD_REQUEST, 400, "Input text is too long.", "input"),
        (
            Reply(422, {"content-type": "application/json"}, [], json.dumps({"detail": "No voice 'zed'"}).encode()),
            BAD_REQUEST,
            400,
            "No voice 'zed'",
            None,
        ),  # FastAPI's shape
        (
            Reply(
                422,
                {"content-type": "application/json"},
                [],
                json.dumps(
                    {
                        "detail": [
                            {"type": "missing", "loc": ["body", "input"], "msg": "Field required"},
                            {"type": "float_type", "loc": ["body", "temperature"], "msg": "Input should be a valid number"},
                        ]
                    }
                ).encode(),
            ),
            BAD_REQUEST,
            400,
            "input: Field required; temperature: Input should be a valid number",
            "input",
        ),
        (
            error_reply(429, "Slow down.", type_="rate_limit_error"),
            RATE_LIMIT,
            429,
            "upstream speech server is rate limiting: Slow down.",
            None,
        ),
        (
            error_reply(500, "CUDA out of memory", type_="server_error"),
            SERVER_ERROR,
            None,
            "upstream speech server failed (HTTP 500): CUDA out of memory",
            None,
        ),
    ],
    ids=["400", "422", "422-validation-list", "429", "500"],
)
async def test_status_errors_map_to_contract_classes_without_retry(mock, engines, reply, error_type, code, message, param):
    mock.script(reply, reply, reply)
    error = await failure(engines(mock))
    assert (error.error_type, error.code, error.message, error.param) == (error_type, code, message, param)
    assert len(mock.requests) == 1


@pytest.mark.parametrize(
    "status, hint", [(401, "SPEECH_UPSTREAM_API_KEY"), (403, "SPEECH_UPSTREAM_API_KEY"), (404, "SPEECH_UPSTREAM_URL")]
)
async def test_configuration_errors_name_the_setting(mock, engines, status, hint):
    mock.script(error_reply(status, "nope"))
    error = await failure(engines(mock))
    assert hint in error.message and f"HTTP {status}" in error.message
    assert (error.error_type, error.code) == (SERVER_ERROR, None)


@pytest.mark.parametrize("retries", [0, 1, 2])
async def test_503_on_every_attempt_is_queue_full(mock, engines, retries):
    mock.script(*[error_reply(503, "busy", type_="server_error")] * (retries + 2))
    error = await failure(engines(mock, retries=retries))
    assert isinstance(error, EngineBusy)
    assert (error.message, error.error_type, error.code) == (QUEUE_FULL_MESSAGE, SERVER_ERROR, None)
    assert len(mock.requests) == retries + 1


@pytest.mark.parametrize(
    "reply",
    [
        Reply(status=500, headers={"content-type": "text/plain"}, chunks=[], body=BIG),
        # a body that never ends: only a reader that stops early can report the error at all
        Reply(status=500, headers={"content-type": "text/plain"}, chunks=[BIG[: 2 << 20]] * 3, hold=True),
    ],
    ids=["content-length", "endless"],
)
async def test_huge_error_body_is_not_read_whole(up, engines, reply):
    up.script(reply)
    error = await failure(engines(up.url, read_timeout_s=10 * GUARD_S))
    assert error.message == "upstream speech server failed (HTTP 500): " + "x" * 300
    await up.reached(lambda: up.open == 0)  # a half-read response is not pooled


# 5. Retries


@pytest.mark.parametrize(
    "first",
    [
        error_reply(503, "busy"),
        error_reply(502, "bad gateway"),
        error_reply(504, "timeout"),
        Reply(drop=True),
        Reply(chunks=[], break_after=True),
    ],
    ids=["503", "502", "504", "drop", "headers-only"],
)
async def test_retried_before_the_first_byte(up, engines, first):
    up.script(first, Reply())
    assert np.array_equal(await audio(engines(up.url)), samples(TONE))
    assert len(up.requests) == 2
    assert up.requests[0].json == up.requests[1].json


async def test_refused_connection_is_unreachable_after_retries(engines):
    url = closed_port_url()
    error = await failure(engines(url, retries=2))
    assert f"upstream speech server at {url} is unreachable" in error.message
    assert (error.error_type, error.code) == (SERVER_ERROR, None)


async def test_retries_zero_is_one_attempt(up, engines):
    up.script(Reply(drop=True), Reply(drop=True))
    error = await failure(engines(up.url, retries=0))
    assert "invalid HTTP response" in error.message
    assert len(up.requests) == 1


async def test_no_retry_after_the_first_audio_byte(up, engines):
    up.script(Reply(chunks=[TONE], break_after=True), Reply(), Reply())
    chunks, error = await outcome(engines(up.url))
    assert np.array_equal(np.concatenate(chunks), samples(TONE))
    assert f"upstream speech stream broke off after {len(TONE)} bytes" in error.message
    assert len(up.requests) == 1


@pytest.mark.parametrize("stall", [Reply(hang=True), Reply(chunks=[], hold=True)], ids=["no-headers", "no-body"])
async def test_no_retry_on_read_timeout(up, engines, stall):
    up.script(stall, Reply(), Reply())
    error = await failure(engines(up.url, read_timeout_s=0.3))
    assert error.message == "upstream speech server sent nothing for 0.3 s"
    assert len(up.requests) == 1
    await up.reached(lambda: up.disconnects == 1)


# 6. Bad upstreams fail, never hang


async def test_hold_after_audio_fails_after_the_audio(up, engines):
    up.script(Reply(chunks=[TONE], hold=True))
    chunks, error = await outcome(engines(up.url, read_timeout_s=0.3))
    assert np.array_equal(np.concatenate(chunks), samples(TONE))
    assert f"broke off after {len(TONE)} bytes" in error.message
    assert len(up.requests) == 1
    await up.reached(lambda: up.disconnects == 1)


async def test_an_upstream_that_trickles_falls_behind_real_time_and_fails(up, engines):
    """A byte pair every 0.1 s never trips the read timeout, yet would hold the segment for ever."""
    up.script(Reply(chunks=[TONE[i : i + 2] for i in range(0, 200, 2)], interval_s=0.1))
    chunks, error = await outcome(engines(up.url, read_timeout_s=0.3))
    assert error is not None and error.message == "upstream speech server fell more than 0.3 s behind real time"
    assert chunks and error.error_type == SERVER_ERROR
    await up.reached(lambda: up.open == 0)


async def test_an_upstream_streaming_faster_than_real_time_may_take_longer_than_the_read_timeout(up, engines):
    paced = [TONE[:2400]] * 30  # 30 chunks of 50 ms of audio, one every 40 ms: 1.2 s in all
    up.script(Reply(chunks=paced, interval_s=0.04))
    assert np.array_equal(await audio(engines(up.url, read_timeout_s=1.0)), samples(b"".join(paced)))


async def test_garbage_on_every_attempt_is_invalid_http(up, engines):
    up.script(*[Reply(raw=b"garbage\r\n\r\n")] * 3)
    error = await failure(engines(up.url))
    assert error.message.startswith("upstream speech server sent an invalid HTTP response")
    assert len(up.requests) == 3


@pytest.mark.parametrize(
    "headers, message",
    [
        (
            {"content-type": "text/html; charset=utf-8"},
            "upstream speech server sent 'text/html; charset=utf-8', not raw PCM audio",
        ),
        ({"content-type": "application/json"}, "upstream speech server sent 'application/json', not raw PCM audio"),
        ({}, "upstream speech server sent 'no content type', not raw PCM audio"),
        (
            {"content-type": "audio/pcm", "x-sample-rate": "16000"},
            "upstream speech server sent 16000 Hz audio; SPEECH_UPSTREAM_SAMPLE_RATE is 24000",
        ),
        (
            {"content-type": "audio/L16; rate=16000"},
            "upstream speech server sent 16000 Hz audio; SPEECH_UPSTREAM_SAMPLE_RATE is 24000",
        ),
    ],
    ids=["html", "json", "none", "x-sample-rate", "l16-rate"],
)
async def test_not_pcm_or_wrong_rate_is_refused(mock, engines, headers, message):
    mock.script(Reply(headers=headers), Reply(), Reply())
    chunks, error = await outcome(engines(mock))
    assert chunks == []
    assert (error.message, error.error_type) == (message, SERVER_ERROR)
    assert len(mock.requests) == 1


@pytest.mark.parametrize(
    "headers",
    [
        {"content-type": "audio/pcm", "x-sample-rate": "24000"},
        {"content-type": "application/octet-stream"},
        {"content-type": "audio/pcm;rate=24000"},
    ],
)
async def test_pcm_types_and_matching_rate_accepted(mock, engines, headers):
    mock.script(Reply(headers=headers))
    assert np.array_equal(await audio(engines(mock)), samples(TONE))


async def test_l16_is_read_big_endian_as_rfc_2586_defines_it(mock, engines):
    big_endian = np.frombuffer(TONE, "<i2").astype(">i2").tobytes()
    mock.script(Reply(headers={"content-type": "audio/L16; rate=24000"}, chunks=[big_endian[:3], big_endian[3:]]))
    assert np.array_equal(await audio(engines(mock)), samples(TONE))


async def test_l16_is_little_endian_int16_for_a_pcm16_request(mock, engines):
    big_endian = np.frombuffer(TONE, "<i2").astype(">i2").tobytes()
    mock.script(Reply(headers={"content-type": "audio/L16; rate=24000"}, chunks=[big_endian[:3], big_endian[3:]]))
    chunks, error = await outcome(engines(mock), SynthesisRequest("Hello there.", "default", pcm16=True))
    assert error is None
    assert all(chunk.dtype == np.dtype("<i2") for chunk in chunks)
    assert b"".join(chunk.tobytes() for chunk in chunks) == TONE


async def test_pool_exhaustion_fails_within_the_pool_timeout(up, engines):
    engine = engines(up.url, max_connections=1, connect_timeout_s=0.3)
    up.script(Reply(hold=True))
    first = engine.stream(req())
    await asyncio.wait_for(anext(first), GUARD_S)
    error = await failure(engine)
    assert error.message == "no free connection to the upstream speech server within 0.3 s"
    await first.aclose()
    await up.reached(lambda: up.disconnects == 1)


# 7. Cancellation


async def test_cancelling_the_consumer_closes_the_connection(up, engines):
    up.script(Reply(chunks=[TONE], hold=True))
    engine = engines(up.url)
    first = asyncio.Event()

    async def consume():
        async for _ in engine.stream(req()):
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), GUARD_S)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, GUARD_S)
    await up.reached(lambda: up.disconnects == 1 and up.open == 0)


async def test_closing_the_iterator_closes_the_connection(up, engines):
    up.script(Reply(chunks=[TONE], hold=True))
    async with contextlib.aclosing(engines(up.url).stream(req())) as stream:
        chunk = await asyncio.wait_for(anext(stream), GUARD_S)
        assert np.array_equal(chunk, samples(TONE)[: len(chunk)])
    await up.reached(lambda: up.disconnects == 1 and up.open == 0)


# 8. Connections


async def test_sequential_requests_reuse_one_connection(up, engines):
    engine = engines(up.url)
    for text in ("One.", "Two.", "Three.", "Four."):
        assert np.array_equal(await audio(engine, req(text)), samples(TONE))
    assert [r.json["input"] for r in up.requests] == ["One.", "Two.", "Three.", "Four."]
    assert up.connections == 1


async def test_no_connection_left_after_failures_cancels_and_aclose(up, engines):
    engine = engines(up.url, retries=1, read_timeout_s=0.3)
    up.script(
        Reply(),
        error_reply(400, "bad"),
        Reply(status=500, chunks=[], body=BIG),
        Reply(headers={"content-type": "application/json"}),
        Reply(chunks=[TONE], break_after=True),
        Reply(hang=True),
        Reply(raw=b"junk"),
        Reply(drop=True),
    )
    await audio(engine)
    for _ in range(6):
        await failure(engine)
    up.script(Reply(chunks=[TONE], hold=True))
    async with contextlib.aclosing(engine.stream(req())) as stream:
        await asyncio.wait_for(anext(stream), GUARD_S)
    await audio(engine)
    assert up.open >= 1  # the last connection is pooled
    await engine.aclose()
    await up.reached(lambda: up.open == 0)


# 9. Voice discovery


@pytest.mark.parametrize(
    "listing",
    [
        {"voices": ["Vivian", "Ryan", "Serena"], "uploaded_voices": []},
        {"voices": ["Vivian", "Ryan"], "uploaded_voices": [{"name": "Serena", "consent": "c", "ref_text": "Hi."}]},
        {
            "object": "list",
            "data": [{"name": "Vivian", "object": "voice"}, {"name": "Ryan"}, {"name": "Serena"}],
            "default": "Vivian",
        },
    ],
    ids=["vllm-omni", "vllm-omni-uploaded", "ours"],
)
async def test_warm_up_learns_the_upstream_voices(listing):
    with StandIn(voices=listing) as up:
        engine = OpenAIEngine(url=up.url)
        await asyncio.wait_for(engine.warm_up(), GUARD_S)
    caps = engine.capabilities
    assert (caps.voices, caps.default_voice, caps.any_voice) == (("Vivian", "Ryan", "Serena"), "Vivian", False)
    assert [(r.method, r.path) for r in up.requests] == [("GET", "/v1/audio/voices")]


@pytest.mark.parametrize("down", [False, True], ids=["404", "down"])
async def test_warm_up_without_a_listing_leaves_the_voice_set_open(up, down):
    engine = OpenAIEngine(url=closed_port_url() if down else up.url, retries=0)
    await asyncio.wait_for(engine.warm_up(), GUARD_S)
    caps = engine.capabilities
    assert (caps.voices, caps.default_voice, caps.any_voice) == ((), "default", True)
    assert len(up.requests) == (0 if down else 1)


async def test_an_upstream_without_a_listing_is_not_asked_again(up):
    engine = OpenAIEngine(url=up.url, rediscover_s=0)
    await asyncio.wait_for(engine.warm_up(), GUARD_S)
    for _ in range(3):
        await asyncio.wait_for(audio(engine), GUARD_S)
    assert [r.method for r in up.requests] == ["GET", "POST", "POST", "POST"]
    assert engine.voice_refresh is None
    await engine.aclose()


async def test_voices_are_learned_once_an_upstream_that_was_away_answers():
    """A front started while its GPU server restarts picks the voices up later, in the background."""
    with StandIn(voices=Reply(status=503, headers={"content-type": "text/plain"}, chunks=[], body=b"loading")) as up:
        engine = OpenAIEngine(url=up.url, rediscover_s=0)
        await asyncio.wait_for(engine.warm_up(), GUARD_S)
        assert engine.capabilities.any_voice
        up.voices = {"voices": ["vivian", "ryan"], "uploaded_voices": []}
        stream = engine.stream(SynthesisRequest("Hi there.", "default"))
        await asyncio.wait_for(anext(stream), GUARD_S)  # the segment is made meanwhile
        refresh = engine.voice_refresh
        if refresh is not None:
            await asyncio.wait_for(asyncio.shield(refresh), GUARD_S)
        await stream.aclose()
        caps = engine.capabilities
        assert (caps.voices, caps.default_voice, caps.any_voice) == (("vivian", "ryan"), "vivian", False)
        await asyncio.wait_for(audio(engine), GUARD_S)  # known now: not asked again
        methods = [r.method for r in up.requests]  # the second GET runs beside the first POST
        assert (methods[0], sorted(methods[1:3]), methods[3:]) == ("GET", ["GET", "POST"], ["POST"])
        await engine.aclose()


async def test_configured_voices_skip_discovery():
    with StandIn(voices={"voices": ["x", "y"]}) as up:
        engine = OpenAIEngine(url=up.url, voices=["a", "b"])
        await asyncio.wait_for(engine.warm_up(), GUARD_S)
    assert up.requests == []
    caps = engine.capabilities
    assert (caps.voices, caps.default_voice, caps.any_voice) == (("a", "b"), "a", False)


# 10. Session config against the engine's capabilities


async def no_voice(name):
    return None


async def test_open_voice_set_passes_an_unknown_name_on(up, engines):
    engine = engines(up.url)
    payload = {"type": "session.config", "session": {"voice": "  Serena "}}
    config = (await read_config(payload, engine.capabilities, no_voice)).config
    assert (config.voice, config.reference) == ("Serena", None)
    await audio(engine, req(voice=config.voice, reference=config.reference, **config.options))
    assert up.requests[0].json["voice"] == "Serena"


async def test_open_voice_set_uses_an_uploaded_voice(up, engines):
    engine, ref = engines(up.url), reference()

    async def find(name):
        return ref if name == "alice" else None

    config = (await read_config({"type": "session.config", "session": {"voice": "alice"}}, engine.capabilities, find)).config
    assert (config.voice, config.reference) == ("alice", ref)
    await audio(engine, req(voice=config.voice, reference=config.reference, **config.options))
    body = up.requests[0].json
    assert "voice" not in body and body["ref_text"] == ref.transcript


async def test_known_voices_refuse_an_unknown_name():
    engine = OpenAIEngine(url="http://127.0.0.1:9/v1", voices=["a", "b"])
    with pytest.raises(SpeechError) as info:
        await read_config({"type": "session.config", "session": {"voice": "zzz"}}, engine.capabilities, no_voice)
    error = info.value
    assert (error.message, error.param, error.error_type, error.code) == (
        "Unknown voice 'zzz'. Supported voices: a, b",
        "voice",
        BAD_REQUEST,
        400,
    )
    assert error.fatal


async def test_instructions_and_ref_audio_are_accepted():
    engine = OpenAIEngine(url="http://127.0.0.1:9/v1")
    session = {
        "voice": "Ryan",
        "instructions": "Whisper.",
        "ref_audio": "data:audio/wav;base64,AAAA",
        "ref_text": "Hi.",
        "model": "m",
        "seed": 3,
    }
    config = (await read_config({"type": "session.config", "session": session}, engine.capabilities, no_voice)).config
    assert config.voice == "Ryan"
    assert config.options == {
        "model": "m",
        "instructions": "Whisper.",
        "ref_audio": "data:audio/wav;base64,AAAA",
        "ref_text": "Hi.",
        "seed": 3,
    }


# 11. System checks

GOOD_URL = "http://gpu-host:8000/v1"


def test_check_missing_url(settings):
    settings.SPEECH_ENGINE = "openai"
    del settings.SPEECH_UPSTREAM_URL
    assert [error.id for error in check_speech_settings(None)] == ["speech.E005"]


@pytest.mark.parametrize(
    "overrides, ids",
    [
        ({"SPEECH_UPSTREAM_URL": "ftp://x"}, ["speech.E005"]),
        ({"SPEECH_UPSTREAM_URL": ""}, ["speech.E005"]),
        ({"SPEECH_UPSTREAM_URL": "http://"}, ["speech.E005"]),
        ({"SPEECH_UPSTREAM_URL": GOOD_URL, "SPEECH_UPSTREAM_SAMPLE_RATE": 12345}, ["speech.E006"]),
        ({"SPEECH_UPSTREAM_URL": GOOD_URL, "SPEECH_UPSTREAM_RETRIES": -1}, ["speech.E007"]),
        ({"SPEECH_UPSTREAM_URL": GOOD_URL, "SPEECH_UPSTREAM_RETRIES": 0, "SPEECH_UPSTREAM_SAMPLE_RATE": 16000}, []),
        ({"SPEECH_UPSTREAM_URL": "https://api.openai.com/v1"}, []),
    ],
)
def test_upstream_settings_checks(overrides, ids):
    with override_settings(SPEECH_ENGINE="openai", **overrides):
        assert [error.id for error in check_speech_settings(None)] == ids
