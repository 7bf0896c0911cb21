"""`POST /v1/audio/speech`: the official openai SDK against a real daphne with the real engine, and
every error in the contract's envelope (Django's async test client, FakeEngine)."""

import io
import json
import wave

import av
import numpy as np
import pytest
import soundfile

from speech.audio.streaming import SessionEncoder
from tests.support.live import serving
from tests.support.speech_check import pcm16_to_float, rms, transcribe, wer

pytestmark = [pytest.mark.live, pytest.mark.heavy]

TEXT = "Hello there. I have 3 apples and a green pear."


@pytest.fixture(scope="module")
def server():
    with serving({"SPEECH_ENGINE": "hibari"}) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server.http_url}/v1", api_key="unused", max_retries=0)


def test_sdk_file_response_is_heard(client, whisper):
    data = client.audio.speech.create(model="tts-1", voice="heart", input=TEXT, response_format="wav").read()
    with wave.open(io.BytesIO(data)) as out:
        assert (out.getnchannels(), out.getsampwidth(), out.getframerate()) == (1, 2, 24000)
        samples = pcm16_to_float(out.readframes(out.getnframes()))
    assert samples.size / 24000 > 2.0 and rms(samples) > 0.02
    heard = transcribe(whisper, samples, 24000)
    assert wer(TEXT, heard) <= 0.1, heard


def test_sdk_streaming_pcm_is_chunked_with_its_headers_and_heard(client, whisper):
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="heart", input=TEXT, response_format="pcm", extra_body={"stream": True}
    ) as response:
        headers = response.headers
        chunks = list(response.iter_bytes())
    assert headers["content-type"] == "audio/pcm"
    assert (headers["x-sample-rate"], headers["x-channels"], headers["x-bit-depth"]) == ("24000", "1", "16")
    assert headers.get("transfer-encoding") == "chunked"
    data = b"".join(chunks)
    assert len(data) % 2 == 0
    samples = pcm16_to_float(data)
    assert rms(samples) > 0.02
    assert wer(TEXT, transcribe(whisper, samples, 24000)) <= 0.1


@pytest.mark.parametrize("fmt, rate", [("mp3", 24000), ("flac", 16000), ("opus", 48000)])
def test_sdk_formats_and_rates(client, fmt, rate):
    data = client.audio.speech.create(
        model="tts-1",
        voice="heart",
        input="Short and sweet.",
        response_format=fmt,
        extra_body={"sample_rate": rate, "speed": 1.5},
    ).read()
    samples, got_rate = soundfile.read(io.BytesIO(data), dtype="float32")
    assert got_rate == rate and samples.ndim == 1 and samples.size / rate > 0.3


def test_sdk_sees_the_error_envelope(client):
    from openai import BadRequestError

    with pytest.raises(BadRequestError) as refused:
        client.audio.speech.create(model="tts-1", voice="nobody", input="Hi.")
    assert refused.value.status_code == 400
    assert refused.value.body == {
        "message": "Unknown voice 'nobody'. Supported voices: heart",
        "type": "BadRequestError",
        "param": "voice",
        "code": 400,
    }


# -- errors, in process ----------------------------------------------------------------------------


async def post(body, **extra):
    from django.test import AsyncClient

    raw = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return await AsyncClient().post("/v1/audio/speech", raw, content_type="application/json", **extra)


@pytest.mark.parametrize(
    "body, message, param",
    [
        ({"input": "   "}, "input must be a non-empty string", "input"),
        ({"input": 5}, "input must be a non-empty string", "input"),
        ({}, "input must be a non-empty string", "input"),
        ({"input": "x" * 4097}, "input must be at most 4096 characters", "input"),
        ({"input": "Hi.", "stream": "yes"}, "stream must be a boolean", "stream"),
        (
            {"input": "Hi.", "response_format": "ogg"},
            "response_format must be one of: aac, alaw, flac, mp3, mulaw, opus, pcm, wav",
            "response_format",
        ),
        ({"input": "Hi.", "speed": True}, "speed must be a number", "speed"),
        ({"input": "Hi.", "speed": 9}, "speed must be between 0.25 and 4.0", "speed"),
        (
            {"input": "Hi.", "stream": True, "response_format": "wav"},
            "stream=true requires a streamable response_format (pcm, mulaw, alaw, mp3, opus, aac)",
            "response_format",
        ),
        ({"input": "Hi.", "voice": "nobody"}, "Unknown voice 'nobody'. Supported voices: fake, alt", "voice"),
        ({"input": "Hi.", "stream_format": "sse"}, "stream_format must be one of: audio", "stream_format"),
    ],
    ids=[
        "blank",
        "not-a-string",
        "missing",
        "too-long",
        "stream-type",
        "format",
        "speed-type",
        "speed-range",
        "stream-mp3",
        "voice",
        "stream-format-sse",
    ],
)
@pytest.mark.django_db(transaction=True)  # an unknown voice is looked for among the uploaded ones
async def test_bad_requests_get_the_envelope(process_engine, body, message, param):
    response = await post(body)
    assert response.status_code == 400
    assert json.loads(response.content) == {"error": {"message": message, "type": "BadRequestError", "param": param, "code": 400}}


async def test_invalid_json_and_wrong_method(process_engine):
    from django.test import AsyncClient

    response = await post(b"{nope")
    assert response.status_code == 400 and json.loads(response.content)["error"]["code"] == 400
    response = await AsyncClient().get("/v1/audio/speech")
    assert response.status_code == 405 and json.loads(response.content)["error"]["code"] == 405


@pytest.mark.django_db
async def test_a_key_is_required_when_keys_are(process_engine, settings):
    settings.SPEECH_REQUIRE_API_KEY = True
    response = await post({"input": "Hi."})
    assert response.status_code == 401
    assert json.loads(response.content)["error"]["type"] == "authentication_error"


async def test_streamed_raw_formats_with_the_fake_engine(process_engine):
    response = await post({"input": "One. Two.", "response_format": "mulaw", "stream": True})
    assert response.status_code == 200 and response["X-Sample-Rate"] == "8000"
    data = b"".join([chunk async for chunk in response.streaming_content])
    # Two segments of two 50 ms chunks each at 24 kHz, resampled to 8 kHz: one byte a sample.
    assert abs(len(data) - 4 * 400) <= 16
    assert np.frombuffer(data, np.uint8).std() > 0


@pytest.mark.parametrize("fmt, container", [("mp3", "mp3"), ("opus", "ogg"), ("aac", "aac")])
async def test_streamed_compressed_formats_are_one_stream_as_long_as_the_audio(process_engine, fmt, container):
    response = await post({"input": "One. Two.", "response_format": fmt, "stream": True})
    assert response.status_code == 200 and response.streaming
    data = b"".join([chunk async for chunk in response.streaming_content])
    with av.open(io.BytesIO(data), format=container) as decoded:
        samples = sum(frame.samples for frame in decoded.decode(audio=0))
    rate = 48000 if fmt == "opus" else 24000
    made = 2 * 2 * 1200 * rate // 24000  # two segments of two 50 ms chunks
    assert 0 <= samples - made < SessionEncoder(fmt, rate).frame_size


async def test_stream_format_audio_streams_raw_formats_and_leaves_files_whole(process_engine):
    """OpenAI's `stream_format: "audio"` (what an upstream engine asks for): raw formats are streamed
    as made, with their headers; a file format still comes back as one complete file."""
    response = await post({"input": "One. Two.", "response_format": "pcm", "stream_format": "audio"})
    assert response.status_code == 200 and response.streaming
    assert (response["Content-Type"], response["X-Sample-Rate"]) == ("audio/pcm", "24000")
    data = b"".join([chunk async for chunk in response.streaming_content])
    assert len(data) == 2 * 2 * 1200 * 2  # two segments of two 50 ms chunks, 16-bit
    response = await post({"input": "One.", "response_format": "wav", "stream_format": "audio"})
    assert response.status_code == 200 and not response.streaming
    assert response.content[:4] == b"RIFF"


def test_api_paths_skip_the_browser_middleware_and_the_admin_keeps_it(server):
    """Under daphne the API's paths go to a handler without Django's sync-only browser middleware
    (two thread hops each); the admin keeps the full stack: CSRF cookie, frame options."""
    import urllib.request

    for path in ("/v1/audio/voices", "/healthz"):
        with urllib.request.urlopen(f"{server.http_url}{path}", timeout=30) as response:
            assert response.status == 200
            assert response.headers["X-Frame-Options"] is None and response.headers["Set-Cookie"] is None, path
            assert "Cookie" not in (response.headers["Vary"] or ""), path
    with urllib.request.urlopen(f"{server.http_url}/admin/login/", timeout=30) as response:
        assert response.status == 200
        assert response.headers["X-Frame-Options"] == "DENY"
        assert "csrftoken=" in (response.headers["Set-Cookie"] or "")
