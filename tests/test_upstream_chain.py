"""A real chain: instance A (SPEECH_ENGINE=openai) in front of instance B (embedded Hibari).

A's engine speaks to B's `POST /v1/audio/speech` (`response_format: "pcm"`, `stream_format:
"audio"`, raw s16le streamed back) and learned B's voices from `GET /v1/audio/voices` at start-up.
Both are real `manage.py serve` processes on their own ports and SQLite files (tests/support/live.py).

* One module-scoped pair serves the session tests: streamed round trip through Whisper, the same
  text straight on B (same duration), the hop sample for sample (A's segment against B's answer to
  A's request), a file format, `instructions` refused by
  B, barge-in, and finally SIGTERM of both with a session still speaking on A.
* Each upstream-failure test (B stopped, killed, frozen) has a pair of its own, with small
  upstream timeouts on A, so breaking B never touches the other tests.

Whisper hears "You" in silence, so every round trip also checks duration and loudness. Waits are
hang guards only; nothing asserts a duration of wall-clock time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import urllib.request

import numpy as np
import pytest

from tests.support.decoders import decode_file
from tests.support.heard import without_heard
from tests.support.live import (
    DaphneServer,
    assert_healthy,
    cancelled_segments,
    collect,
    configure,
    held,
    is_event,
    open_session,
    recv_item,
    run_session,
    segments_of,
    send_json,
    serving,
)
from tests.support.speech_check import assert_heard, normalise, pcm16_to_float, rms

pytestmark = [pytest.mark.live, pytest.mark.heavy]

RATE = 24000
SEED = 7
SESSION_ID_RE = re.compile(r"^speech_ws_[0-9a-f]{32}$")
SHUTDOWN_MESSAGE = "speech session terminated: the server is shutting down"
HANG_GUARD_S = 60.0  # one frame; a hang guard, not a timing assertion

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "It is raining in Paris today.",
    "Please bring me two cups of coffee.",
]
TEXT = " ".join(SENTENCES)
# Several input.text chunks, cut inside words and sentences: segmentation is part of the trip.
CUTS = (9, 27, 52, 80)
CHUNKS = [TEXT[a:b] for a, b in zip((0, *CUTS), (*CUTS, len(TEXT)))]

# Each about 4-5 s of speech: a client that stops reading after the first frame finds A holding one
# of them half sent (backpressure) when its cancel arrives.
LONG_SENTENCES = [
    "The train leaves the station at seven and arrives in the city shortly after nine.",
    "Please close the window before you go to bed, because the night will be cold.",
    "My sister bought a red bicycle last week and rides it to work every morning.",
    "We walked along the beach until the sun went down behind the old lighthouse.",
]

B_ENV = {"SPEECH_ENGINE": "hibari", "SPEECH_REQUIRE_API_KEY": "false"}


def a_env(b, **extra):
    env = {"SPEECH_ENGINE": "openai", "SPEECH_UPSTREAM_URL": f"{b.http_url}/v1", "SPEECH_REQUIRE_API_KEY": "false"}
    env.update(extra)
    env.pop("SPEECH_UPSTREAM_VOICES", None)  # unset: A must learn B's voices
    return env


# -- helpers ---------------------------------------------------------------------------------------


def kinds(result):
    """The session's items with runs of binary frames folded into one "bin"."""
    out = []
    for item in result.items:
        kind = "bin" if item.kind == "audio" else item.data["type"]
        if not (kind == "bin" and out and out[-1] == "bin"):
            out.append(kind)
    return out


def ints(data):
    return np.frombuffer(data, dtype="<i2").astype(np.int32)


def check_streamed_session(result, sentences, *, engine):
    """Contract order for a clean streamed pcm session; returns the segments."""
    assert result.close_code == 1000, (result.close_code, result.close_reason)
    configured = result.configured
    assert SESSION_ID_RE.match(configured["session_id"]), configured
    assert (
        configured["engine"],
        configured["voice"],
        configured["response_format"],
        configured["stream_audio"],
        configured["sample_rate"],
    ) == (engine, "heart", "pcm", True, RATE), configured
    assert kinds(result) == ["audio.start", "bin", "audio.done"] * len(sentences) + ["session.done"], kinds(result)
    segments, problems = segments_of(result.items)
    assert problems == []
    sid = configured["session_id"]
    assert [s.start["sentence_text"] for s in segments] == sentences
    for index, segment in enumerate(segments):
        assert segment.start == {
            "type": "audio.start",
            "id": f"{sid}-{index}",
            "sentence_index": index,
            "sentence_text": sentences[index],
            "format": "pcm",
            "sample_rate": RATE,
        }
        assert segment.done == {
            "type": "audio.done",
            "id": f"{sid}-{index}",
            "sentence_index": index,
            "total_bytes": len(segment.audio),
            "error": False,
            "cancelled": False,
        }
        assert len(segment.audio) > 0 and len(segment.audio) % 2 == 0
    assert result.events[-1] == {"type": "session.done", "session_id": sid, "total_sentences": len(sentences)}
    return segments


async def speak_until_first_frame(url, config, text, **connect):
    """Open a session, send `text`, read up to its first binary frame. Returns (ws, configured, items)."""
    ws = await open_session(url, **connect)
    configured = await configure(ws, config)
    await send_json(ws, {"type": "input.text", "text": text})
    items = []
    while True:
        item = await recv_item(ws, timeout=HANG_GUARD_S)
        items.append(item)
        if item.kind == "audio":
            return ws, configured, items
        assert item.data["type"] == "audio.start", item.data


@contextlib.contextmanager
def frozen(server):
    """SIGSTOP the server process (one this test started), SIGCONT on the way out."""
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)


# -- the module's pair ------------------------------------------------------------------------------


class Pair:
    def __init__(self, a, b):
        self.a, self.b = a, b


@pytest.fixture(scope="module")
def chain():
    with serving(B_ENV) as b:
        with serving(a_env(b)) as a:
            yield Pair(a, b)


@pytest.fixture(autouse=True)
def no_traceback_after_each_test(request):
    yield
    if "chain" in request.fixturenames:
        pair = request.getfixturevalue("chain")
        assert_healthy(pair.a, pair.b, stopped_ok=True)  # test_both_exit_cleanly_on_sigterm stops them


CONFIG = {"response_format": "pcm", "stream_audio": True, "seed": SEED}


@pytest.fixture(scope="module")
def via_a(chain):
    return asyncio.run(run_session(chain.a.ws_url, CONFIG, CHUNKS))


@pytest.fixture(scope="module")
def direct_b(chain):
    return asyncio.run(run_session(chain.b.ws_url, CONFIG, CHUNKS))


# -- tests -----------------------------------------------------------------------------------------


def test_a_learned_b_voices(chain):
    status, _, a_listing = chain.a.get_json("/v1/audio/voices")
    _, _, b_listing = chain.b.get_json("/v1/audio/voices")
    assert status == 200
    assert "heart" in b_listing["voices"]
    assert [v["name"] for v in a_listing["data"] if v["type"] == "builtin"] == b_listing["voices"]


def test_streamed_session_through_a_is_heard(via_a, whisper):
    segments = check_streamed_session(via_a, SENTENCES, engine="openai")
    everything = np.concatenate([pcm16_to_float(s.audio) for s in segments])
    for segment, sentence in zip(segments, SENTENCES):  # each segment is speech of about its length
        samples = pcm16_to_float(segment.audio)
        words = len(normalise(sentence))
        assert 0.12 * words < samples.size / RATE < 1.0 * words + 1.0, (sentence, samples.size / RATE)
        assert rms(samples) > 0.02, (sentence, rms(samples))
    assert_heard(whisper, everything, RATE, TEXT)


def test_same_text_straight_on_b_sounds_the_same(via_a, direct_b):
    a_segments = check_streamed_session(via_a, SENTENCES, engine="openai")
    b_segments = check_streamed_session(direct_b, SENTENCES, engine="hibari")
    for sentence, a_seg, b_seg in zip(SENTENCES, a_segments, b_segments):
        a, b = ints(a_seg.audio), ints(b_seg.audio)
        # Stated tolerance: durations within 2 % (or 10 ms) of each other.
        da, db = a.size / RATE, b.size / RATE
        assert abs(da - db) <= max(0.02 * db, 0.010), f"{sentence!r}: {da:.3f} s via A, {db:.3f} s on B"
        # Not sample for sample: B's session renders only its first segment in pieces (first words
        # first), while each of A's segments is a streamed request of its own to B, whose first and only
        # segment B renders in pieces. test_hop_is_bit_exact compares A with what B answers A.
        assert np.count_nonzero(a) > 0.5 * a.size, sentence


def test_b_is_deterministic_with_a_seed(chain, direct_b):
    """The premise of the sample-for-sample comparison: B itself repeats its samples exactly."""
    again = asyncio.run(run_session(chain.b.ws_url, CONFIG, CHUNKS))
    first, second = segments_of(direct_b.items)[0], segments_of(again.items)[0]
    assert [s.audio for s in first] == [s.audio for s in second]


def b_answers(b, sentence):
    """What B streams back for A's request of one segment (speech/engines/openai.py `body`)."""
    body = {"input": sentence, "voice": "heart", "response_format": "pcm", "stream_format": "audio", "seed": SEED}
    request = urllib.request.Request(
        f"{b.http_url}/v1/audio/speech", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=HANG_GUARD_S) as response:
        return response.read()


def test_hop_is_bit_exact(chain, via_a):
    """With the same seed the hop delivers B's samples: A's segment is what B streams for it."""
    a_segments, _ = segments_of(via_a.items)
    for sentence, a_seg in zip(SENTENCES, a_segments):
        a, b = ints(a_seg.audio), ints(b_answers(chain.b, sentence))
        assert np.count_nonzero(b) > 0.5 * b.size, sentence
        assert np.array_equal(a, b), (
            f"{np.count_nonzero(a != b)} of {b.size} samples differ; A == B - sign(B): {np.array_equal(a, b - np.sign(b))}"
        )


async def test_file_format_through_a_is_heard(chain, whisper):
    sentence = "Please bring me 2 cups of coffee."
    result = await run_session(
        chain.a.ws_url, {"response_format": "mp3", "sample_rate": 16000, "seed": SEED}, [sentence[:12], sentence[12:]]
    )
    assert result.close_code == 1000
    assert result.configured["engine"] == "openai" and result.configured["sample_rate"] == 16000
    assert kinds(result) == ["audio.start", "bin", "audio.done", "session.done"], kinds(result)
    segments, problems = segments_of(result.items)
    assert problems == [] and len(segments) == 1
    segment = segments[0]
    assert len(segment.frames) == 1, "a file format is one binary frame"
    assert (segment.start["format"], segment.start["sample_rate"]) == ("mp3", 16000)
    assert segment.done["total_bytes"] == len(segment.frames[0]) and segment.done["error"] is False
    decoded = decode_file("mp3", segment.frames[0])
    assert (decoded.rate, decoded.channels) == (16000, 1)
    assert_heard(whisper, decoded.samples, decoded.rate, sentence)


async def test_instructions_are_forwarded_and_refused_by_b(chain):
    sentences = ["Hello there.", "How are you today?"]
    result = await run_session(chain.a.ws_url, {"stream_audio": True, "instructions": "Speak cheerfully."}, [" ".join(sentences)])
    # A's engine takes instructions, so the handshake succeeds; B's Hibari refuses them per request.
    assert result.configured["engine"] == "openai"
    assert result.close_code == 1000
    assert kinds(result) == ["error", "audio.done"] * 2 + ["session.done"], kinds(result)
    sid = result.configured["session_id"]
    events = result.events
    for index in range(2):
        error, done = events[2 * index], events[2 * index + 1]
        assert error == {
            "type": "error",
            "message": "instructions is not supported by engine 'hibari'",
            "error_type": "BadRequestError",
            "param": "instructions",
            "code": 400,
            "id": f"{sid}-{index}",
            "sentence_index": index,
        }
        assert done == {
            "type": "audio.done",
            "id": f"{sid}-{index}",
            "sentence_index": index,
            "total_bytes": 0,
            "error": True,
            "cancelled": False,
        }
    assert events[-1] == {"type": "session.done", "session_id": sid, "total_sentences": 2}


async def test_cancel_mid_utterance_then_new_text(chain, whisper):
    ws, configured, items = await speak_until_first_frame(
        chain.a.ws_url, CONFIG, " ".join(LONG_SENTENCES) + " ", small_buffers=True
    )
    sid = configured["session_id"]
    try:
        assert items[0].data["sentence_index"] == 0 and items[0].data["sentence_text"] == LONG_SENTENCES[0]
        await asyncio.to_thread(held, chain.a)  # the client stopped reading: A holds it mid-segment
        await send_json(ws, {"type": "input.cancel"})
        after = await collect(ws, until=is_event("input.cancelled"), timeout=HANG_GUARD_S)
        assert after.close_code is None, "the session must stay open after a cancel"
        _, cut = cancelled_segments(items + after.items, sid)
        assert without_heard(after.events[-1]) == {
            "type": "input.cancelled",
            "session_id": sid,
            "cancelled_sentences": len(LONG_SENTENCES) - cut.index,
            "total_sentences": cut.index + 1,
            "origin": "client",
        }
        follow_index = cut.index + 1

        # New text after the cancel is spoken, with the next free sentence index.
        follow = "Sure, let me check."
        await send_json(ws, {"type": "input.text", "text": follow + " "})
        await send_json(ws, {"type": "input.done"})
        rest = await collect(ws, timeout=HANG_GUARD_S)
    finally:
        await ws.close()
    assert rest.close_code == 1000
    assert kinds(rest) == ["audio.start", "bin", "audio.done", "session.done"], kinds(rest)
    (segment,), problems = segments_of(rest.items)
    assert problems == []
    assert segment.start["sentence_index"] == follow_index and segment.start["sentence_text"] == follow
    assert segment.done == {
        "type": "audio.done",
        "id": f"{sid}-{follow_index}",
        "sentence_index": follow_index,
        "total_bytes": len(segment.audio),
        "error": False,
        "cancelled": False,
    }
    assert rest.events[-1] == {"type": "session.done", "session_id": sid, "total_sentences": follow_index + 1}
    assert_heard(whisper, pcm16_to_float(segment.audio), RATE, follow)

    # Both stay healthy: a following session on A, and one straight on B.
    for server, engine in ((chain.a, "openai"), (chain.b, "hibari")):
        again = await run_session(server.ws_url, CONFIG, ["All is well. "])
        check_streamed_session(again, ["All is well."], engine=engine)


def test_both_exit_cleanly_on_sigterm(chain):
    """Last in the module: SIGTERM A while one of its sessions is speaking through B, then B."""

    async def scenario():
        ws, configured, _ = await speak_until_first_frame(chain.a.ws_url, CONFIG, " ".join(LONG_SENTENCES) + " ")
        try:
            stopping = asyncio.ensure_future(asyncio.to_thread(chain.a.stop))
            rest = await collect(ws, timeout=HANG_GUARD_S)
            code = await stopping
        finally:
            await ws.close()
        return configured, rest, code

    configured, rest, code = asyncio.run(scenario())
    assert rest.close_code == 4001, (rest.close_code, rest.close_reason)
    errors = rest.of_type("error")
    assert errors and errors[-1]["message"] == SHUTDOWN_MESSAGE, rest.events
    assert code == 0 and chain.a.stopped_by_sigterm
    chain.a.assert_no_traceback()

    # B lost its client mid-stream; it still serves, then stops cleanly too.
    after = asyncio.run(run_session(chain.b.ws_url, CONFIG, ["Still here. "]))
    check_streamed_session(after, ["Still here."], engine="hibari")
    assert chain.b.stop() == 0 and chain.b.stopped_by_sigterm
    chain.b.assert_no_traceback()


# -- upstream failures: a pair of their own ----------------------------------------------------------

CONNECT_TIMEOUT_S = 1.0
READ_TIMEOUT_S = 2.0


@pytest.fixture
def fragile():
    """B and A (small upstream timeouts) for one test that breaks B. A must still stop cleanly."""
    b = DaphneServer(B_ENV).start()
    a = None
    try:
        a = DaphneServer(
            a_env(b, SPEECH_UPSTREAM_CONNECT_TIMEOUT_S=str(CONNECT_TIMEOUT_S), SPEECH_UPSTREAM_READ_TIMEOUT_S=str(READ_TIMEOUT_S))
        ).start()
        yield Pair(a, b)
    finally:
        if a is not None:
            code = a.stop()
        b.stop()
    a.assert_no_traceback()
    assert a.stopped_by_sigterm and code == 0, f"A exit status {code} after SIGTERM"
    a.cleanup()
    b.cleanup()


def check_failed_segment(result, message_check):
    """One segment that fails with a server_error (no audio), then a normal end."""
    assert result.close_code == 1000, (result.close_code, result.close_reason)
    assert kinds(result) == ["error", "audio.done", "session.done"], kinds(result)
    sid = result.configured["session_id"]
    error, done, finished = result.events
    assert error["error_type"] == "server_error" and "code" not in error, error
    assert (error["id"], error["sentence_index"]) == (f"{sid}-0", 0) and "partial_audio" not in error, error
    assert message_check(error["message"]), error["message"]
    assert done == {
        "type": "audio.done",
        "id": f"{sid}-0",
        "sentence_index": 0,
        "total_bytes": 0,
        "error": True,
        "cancelled": False,
    }
    assert finished == {"type": "session.done", "session_id": sid, "total_sentences": 1}


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
async def test_upstream_gone(fragile, how):
    a, b = fragile.a, fragile.b
    # First a working session: A now holds a pooled keep-alive connection to B.
    check_streamed_session(await run_session(a.ws_url, CONFIG, ["Hello there. "]), ["Hello there."], engine="openai")
    if how == "sigterm":
        assert b.stop() == 0 and b.stopped_by_sigterm
        b.assert_no_traceback()
    else:
        b.kill()
        assert b.returncode == -signal.SIGKILL
    for _ in range(2):  # and again: A stays usable, every segment fails the same way
        result = await run_session(a.ws_url, CONFIG, ["Is anyone there? "])
        assert result.configured["engine"] == "openai"
        unreachable = f"upstream speech server at {b.http_url}/v1 is unreachable"
        check_failed_segment(result, lambda m, unreachable=unreachable: m.startswith(unreachable))


async def test_upstream_frozen_then_back(fragile):
    """B stops answering (SIGSTOP: its kernel still accepts connections): A's read timeout fails the
    segment; once B runs again, A speaks again."""
    a, b = fragile.a, fragile.b
    check_streamed_session(await run_session(a.ws_url, CONFIG, ["Hello there. "]), ["Hello there."], engine="openai")
    with frozen(b):
        result = await run_session(a.ws_url, CONFIG, ["Is anyone there? "])
    check_failed_segment(result, lambda m: m == f"upstream speech server sent nothing for {READ_TIMEOUT_S:g} s")
    again = await run_session(a.ws_url, CONFIG, ["Back again. "])
    check_streamed_session(again, ["Back again."], engine="openai")
    b.assert_no_traceback()
