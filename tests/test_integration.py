"""End to end over real sockets: one real daphne process (`manage.py serve`) with the real Hibari engine.

Every test talks to the server through the `websockets` client (or urllib for HTTP) and checks the
wire protocol (docs/protocol.md). After every test, and once more after the server has
stopped, its stderr must hold no "Traceback". Timeouts are hang guards only.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import subprocess
import wave

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support.heard import without_heard
from tests.support.live import (
    PROJECT_ROOT,
    PYTHON,
    DaphneServer,
    collect,
    configure,
    held,
    is_event,
    open_session,
    port_accepts,
    recv_item,
    run_session,
    segments_of,
    send_json,
    serving,
)
from tests.support.sessions import assert_healthy
from tests.support.speech_check import pcm16_to_float, rms

pytestmark = pytest.mark.live

RATE = 24000
# The real engine and the contract's defaults, whatever the caller's environment says.
SERVER_ENV = {
    "SPEECH_ENGINE": "hibari",
    "SPEECH_REQUIRE_API_KEY": "false",
    "SPEECH_CONFIG_TIMEOUT_S": "10",
    "SPEECH_IDLE_TIMEOUT_S": "30",
}
MIB = 1024 * 1024
CONFIG_LIMIT = 16 * MIB
MESSAGE_LIMIT = 131072
SESSION_ID = re.compile(r"^speech_ws_[0-9a-f]{32}$")
EXPECTED_LIMITS = {
    "config_timeout_s": 10.0,
    "idle_timeout_s": 30.0,
    "max_config_bytes": CONFIG_LIMIT,
    "max_message_bytes": MESSAGE_LIMIT,
    "max_pending_chars": 262144,
    "max_segment_chars": 4096,
    "max_contexts": 32,
}


@pytest.fixture(scope="module")
def server():
    with serving(SERVER_ENV) as srv:
        yield srv


@pytest.fixture(autouse=True)
def no_traceback_after_each_test(server):
    yield
    assert_healthy(server)


# -- helpers ---------------------------------------------------------------------------------------


def token(item):
    if item.kind == "audio":
        return "b"
    return {"audio.start": "S", "audio.done": "D", "session.done": "E", "error": "!", "input.cancelled": "C"}.get(
        item.data["type"], "?"
    )


def first_loud_index(samples, fraction=0.10):
    peak = float(np.max(np.abs(samples)))
    return int(np.argmax(np.abs(samples) > fraction * peak)), peak


async def spoken_ok(server, text="All good here. ", config=None):
    """A fresh session speaks `text` completely: the server is healthy."""
    result = await run_session(server.ws_url, {"stream_audio": True, **(config or {})}, [text])
    segments, problems = segments_of(result.items)
    assert problems == []
    assert result.close_code == 1000, (result.close_code, result.types())
    assert result.types()[-1] == "session.done"
    assert [s.start["sentence_text"] for s in segments] == [text.strip()]
    assert all(s.done["total_bytes"] == len(s.audio) > 0 for s in segments)
    return result


def health(server):
    status, content_type, body = server.get_json("/healthz")
    assert status == 200 and body["engine"] == "hibari"
    return body


# -- full sessions ------------------------------------------------------------------------------------

STREAM_CHUNKS = [
    "Hel",
    "lo th",
    "ere. H",
    "ow are y",
    "ou to",
    "day? Pi is rou",
    "ghly 3.",
    "14, you kn",
    "ow. The weather is lovely, and the bi",
    "rds are sing",
    "ing.",
]
STREAM_SENTENCES = [
    "Hello there.",
    "How are you today?",
    "Pi is roughly 3.14, you know.",
    "The weather is lovely, and the birds are singing.",
]


async def test_streamed_pcm_session_follows_the_contract(server):
    result = await run_session(server.ws_url, {"response_format": "pcm", "stream_audio": True}, STREAM_CHUNKS)
    configured = result.configured
    assert SESSION_ID.match(configured["session_id"])
    assert {
        k: configured[k] for k in ("response_format", "stream_audio", "split_granularity", "sample_rate", "voice", "engine")
    } == {
        "response_format": "pcm",
        "stream_audio": True,
        "split_granularity": "sentence",
        "sample_rate": RATE,
        "voice": "heart",
        "engine": "hibari",
    }
    assert configured["limits"] == EXPECTED_LIMITS

    # Order: (audio.start, binary+, audio.done)+ then session.done, and nothing else.
    sequence = "".join(token(item) for item in result.items)
    assert re.fullmatch(r"(Sb+D)+E", sequence), sequence
    segments, problems = segments_of(result.items)
    assert problems == []

    sid = configured["session_id"]
    assert [s.start["sentence_text"] for s in segments] == STREAM_SENTENCES
    for index, segment in enumerate(segments):
        assert segment.index == index
        assert segment.start == {
            "type": "audio.start",
            "id": f"{sid}-{index}",
            "sentence_index": index,
            "sentence_text": STREAM_SENTENCES[index],
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
        assert all(len(frame) > 0 for frame in segment.frames)
        assert len(segment.audio) % 2 == 0
        samples = pcm16_to_float(segment.audio)
        assert samples.size / RATE > 0.3, f"segment {index} is only {samples.size / RATE:.3f} s"
        assert rms(samples) > 0.02, f"segment {index} is (nearly) silent: rms {rms(samples):.4f}"
        assert float(np.max(np.abs(samples))) > 0.1

    assert result.events[-1] == {"type": "session.done", "session_id": sid, "total_sentences": len(STREAM_SENTENCES)}
    assert result.close_code == 1000


async def test_non_streaming_wav_sends_one_parsable_file_per_segment(server):
    texts = ["Good morning to you. ", "See you soon."]
    result = await run_session(server.ws_url, {"response_format": "wav"}, texts)
    assert result.configured["stream_audio"] is False and result.configured["response_format"] == "wav"
    sequence = "".join(token(item) for item in result.items)
    assert re.fullmatch(r"(SbD)+E", sequence), sequence
    segments, problems = segments_of(result.items)
    assert problems == []
    assert [s.start["sentence_text"] for s in segments] == ["Good morning to you.", "See you soon."]
    for segment in segments:
        assert segment.start["format"] == "wav" and segment.start["sample_rate"] == RATE
        assert len(segment.frames) == 1
        data = segment.frames[0]
        assert segment.done["total_bytes"] == len(data)
        assert segment.done["error"] is False and segment.done["cancelled"] is False
        with wave.open(io.BytesIO(data), "rb") as wav:
            assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (RATE, 1, 2)
            frames = wav.readframes(wav.getnframes())
            duration = wav.getnframes() / wav.getframerate()
        assert duration > 0.3
        assert len(frames) == 2 * int(duration * RATE)
        assert rms(pcm16_to_float(frames)) > 0.02
    assert result.close_code == 1000


async def test_leading_silence_is_trimmed(server):
    """docs/protocol.md: under 100 ms before the first audible sound of every segment."""
    texts = ["Speech should start right away. ", "So should this second sentence."]
    result = await run_session(server.ws_url, {"stream_audio": True}, texts)
    segments, problems = segments_of(result.items)
    assert problems == [] and len(segments) == 2
    for segment in segments:
        samples = pcm16_to_float(segment.audio)
        first, peak = first_loud_index(samples)
        assert peak > 0.1
        assert first / RATE <= 0.100, f"segment {segment.index}: first sound at {first / RATE * 1000:.1f} ms"


# -- barge-in -------------------------------------------------------------------------------------------

BARGE_SENTENCES = [f"This is sentence number {i} of a rather long text that keeps on going." for i in range(12)]


async def test_barge_in_cancels_and_the_next_text_gets_the_next_free_index(server):
    ws = await open_session(server.ws_url)
    try:
        configured = await configure(ws, {"stream_audio": True})
        sid = configured["session_id"]
        await send_json(ws, {"type": "input.text", "text": " ".join(BARGE_SENTENCES) + " "})
        before = await collect(ws, until=lambda item: item.kind == "audio")
        assert before.close_code is None, "closed before any audio"
        await send_json(ws, {"type": "input.cancel"})
        after = await collect(ws, until=is_event("input.cancelled"))
        assert after.close_code is None, f"closed instead of input.cancelled: {after.types()}"
        items = before.items + after.items
        segments, problems = segments_of(items)
        assert problems == []

        cancelled_event = items[-1].data
        dones = [item.data for item in items if item.kind == "event" and item.data["type"] == "audio.done"]
        # Segments completed before the cancel was handled are whole; at most the last one was cut.
        assert all(done["cancelled"] is False for done in dones[:-1])
        last_cut = bool(dones) and dones[-1]["cancelled"] is True
        if last_cut:
            assert items[-2].data is dones[-1], "audio.done cancelled:true must come right before input.cancelled"
        else:  # the current segment had already completed: every announced segment is whole
            assert all(segment.done is not None for segment in segments)
        for segment in segments:
            assert segment.done is not None and segment.done["error"] is False
            assert segment.done["total_bytes"] == len(segment.audio)
            assert segment.start["sentence_text"] == BARGE_SENTENCES[segment.index]
        assert [segment.index for segment in segments] == list(range(len(segments)))
        completed = sum(1 for done in dones if not done["cancelled"])
        assert completed < len(BARGE_SENTENCES), "everything was spoken: the cancel came too late to test"
        assert without_heard(cancelled_event) == {
            "type": "input.cancelled",
            "session_id": sid,
            "cancelled_sentences": len(BARGE_SENTENCES) - completed,
            "total_sentences": len(segments),
            "origin": "client",
        }

        # New text after the barge-in is spoken with the next free sentence_index, nothing else.
        await send_json(ws, {"type": "input.text", "text": "Sure, let me check. "})
        await send_json(ws, {"type": "input.done"})
        rest = await collect(ws)
        new_segments, problems = segments_of(rest.items)
        assert problems == []
        next_index = len(segments)
        assert [(s.index, s.start["sentence_text"]) for s in new_segments] == [(next_index, "Sure, let me check.")]
        assert new_segments[0].start["id"] == f"{sid}-{next_index}"
        assert new_segments[0].done["total_bytes"] == len(new_segments[0].audio) > 0
        assert rest.events[-1] == {"type": "session.done", "session_id": sid, "total_sentences": next_index + 1}
        assert rest.close_code == 1000
    finally:
        await ws.close()


# -- bad input over the real socket -----------------------------------------------------------------


@pytest.mark.parametrize("when", ["first frame", "after handshake"])
async def test_invalid_utf8_text_frame_closes_only_that_connection(server, when):
    ws = await open_session(server.ws_url)
    try:
        if when == "after handshake":
            await configure(ws, {"stream_audio": True})
        await ws.send(b"\xff\xfe", text=True)  # a text opcode with bytes that are not UTF-8
        result = await collect(ws, timeout=30)
    finally:
        await ws.close()
    assert result.items == [], "the application must never see the frame"
    # autobahn fails the connection; with its default failByDrop it drops TCP (1006) instead of 1007.
    assert result.close_code in (1006, 1007), result.close_code
    await spoken_ok(server)


@pytest.mark.parametrize("pad_char", ["x", "é"], ids=["ascii", "two-byte-utf8"])
async def test_session_config_over_16_mib_is_refused_with_4009(server, pad_char):
    unit = len(pad_char.encode())
    head = '{"type":"session.config","session":{"stream_audio":true},"pad":"'
    count = (CONFIG_LIMIT + 100 - len(head) - 2) // unit + 1
    raw = head + pad_char * count + '"}'
    assert CONFIG_LIMIT < len(raw.encode()) < CONFIG_LIMIT + MIB
    ws = await open_session(server.ws_url)
    try:
        await ws.send(raw)
        result = await collect(ws, timeout=60)
    finally:
        await ws.close()
    assert result.events == [
        {
            "type": "error",
            "message": f"session WebSocket message exceeds {CONFIG_LIMIT} bytes",
            "error_type": "BadRequestError",
            "code": 400,
        }
    ]
    assert result.close_code == 4009
    await spoken_ok(server)


async def test_session_config_of_exactly_16_mib_is_accepted(server):
    head = '{"type":"session.config","stream_audio":true,"pad":"'
    raw = head + "x" * (CONFIG_LIMIT - len(head) - 2) + '"}'
    assert len(raw.encode()) == CONFIG_LIMIT
    ws = await open_session(server.ws_url)
    try:
        await ws.send(raw)
        configured = (await recv_item(ws)).data
        assert configured["type"] == "session.configured" and configured["stream_audio"] is True
        await send_json(ws, {"type": "input.text", "text": "Big but fine."})
        await send_json(ws, {"type": "input.done"})
        result = await collect(ws)
    finally:
        await ws.close()
    segments, problems = segments_of(result.items)
    assert problems == [] and [s.start["sentence_text"] for s in segments] == ["Big but fine."]
    assert result.close_code == 1000


async def test_frame_over_daphne_limit_is_closed_and_server_stays_healthy(server):
    raw = '{"type":"session.config","pad":"' + "x" * (17 * MIB + 100) + '"}'
    ws = await open_session(server.ws_url)
    try:
        try:
            await ws.send(raw)
        except ConnectionClosed:
            pass  # the server may drop the socket while the frame is still being written
        result = await collect(ws, timeout=60)
    finally:
        await ws.close()
    assert result.items == []
    # autobahn fails the connection (1009 "message too big"); with failByDrop it just drops TCP (1006).
    assert result.close_code in (1006, 1009), result.close_code
    health(server)
    await spoken_ok(server)


async def test_two_thousand_tiny_text_frames_in_a_burst(server):
    text = "Tiny pieces arrive one by one. Every single piece counts! Nothing is lost along the way?"
    frames = list(text)
    empties = 2000 - len(frames)
    # Spread empty input.text frames between the characters: 2000 frames in all, sent without waiting.
    chunks = []
    for position, char in enumerate(frames):
        chunks.append(char)
        chunks.extend([""] * (empties // len(frames) + (1 if position < empties % len(frames) else 0)))
    assert len(chunks) == 2000 and "".join(chunks) == text
    result = await run_session(server.ws_url, {"stream_audio": True}, chunks)
    assert "error" not in result.types(), result.of_type("error")
    segments, problems = segments_of(result.items)
    assert problems == []
    assert [s.start["sentence_text"] for s in segments] == [
        "Tiny pieces arrive one by one.",
        "Every single piece counts!",
        "Nothing is lost along the way?",
    ]
    assert all(s.done["total_bytes"] == len(s.audio) > 0 for s in segments)
    assert result.events[-1]["type"] == "session.done" and result.events[-1]["total_sentences"] == 3
    assert result.close_code == 1000


@pytest.mark.parametrize(
    "nested",
    [
        "[" * 60000 + "]" * 60000,
        '{"a":' * 20000 + "1" + "}" * 20000,
    ],
    ids=["arrays", "objects"],
)
async def test_deeply_nested_json_is_a_recoverable_error(server, nested):
    assert len(nested.encode()) <= MESSAGE_LIMIT
    ws = await open_session(server.ws_url)
    try:
        await configure(ws, {"stream_audio": True})
        await ws.send(nested)
        error = (await recv_item(ws)).data
        assert error["type"] == "error"
        assert error["message"].startswith("speech WebSocket message is not valid JSON")
        assert error["error_type"] == "BadRequestError" and error["code"] == 400
        await send_json(ws, {"type": "input.text", "text": "Still here. "})
        await send_json(ws, {"type": "input.done"})
        result = await collect(ws)
    finally:
        await ws.close()
    segments, problems = segments_of(result.items)
    assert problems == [] and [s.start["sentence_text"] for s in segments] == ["Still here."]
    assert result.close_code == 1000


async def test_recoverable_errors_after_handshake_keep_the_session(server):
    ws = await open_session(server.ws_url)
    try:
        configured = await configure(ws, {"stream_audio": True})
        cases = [
            (b"\x00\x01", {"message": "speech WebSocket client messages must be text frames"}),
            ("x" * (MESSAGE_LIMIT + 1), {"message": f"text WebSocket message exceeds {MESSAGE_LIMIT} bytes"}),
            ("[1, 2]", {"message": "speech WebSocket messages must be JSON objects"}),
            (
                json.dumps({"type": "session.config"}),
                {"message": "unsupported speech WebSocket message type: 'session.config'", "param": "type"},
            ),
            (json.dumps({"type": "input.text", "text": 5}), {"message": "input.text text must be a string", "param": "text"}),
        ]
        for frame, expected in cases:
            await ws.send(frame)
            error = (await recv_item(ws)).data
            assert error == {"type": "error", "error_type": "BadRequestError", "code": 400, **expected}
        await send_json(ws, {"type": "input.text", "text": "Nothing broke. "})
        await send_json(ws, {"type": "input.done"})
        result = await collect(ws)
    finally:
        await ws.close()
    segments, problems = segments_of(result.items)
    assert problems == [] and [s.start["sentence_text"] for s in segments] == ["Nothing broke."]
    assert segments[0].start["id"] == f"{configured['session_id']}-0"
    assert result.close_code == 1000


async def test_client_vanishing_mid_segment_does_not_disturb_other_sessions(server):
    quitter = await open_session(server.ws_url)
    other = await open_session(server.ws_url)
    try:
        await configure(quitter, {"stream_audio": True})
        other_configured = await configure(other, {"stream_audio": True})
        await send_json(quitter, {"type": "input.text", "text": " ".join(BARGE_SENTENCES[:6]) + " "})
        seen = await collect(quitter, until=lambda item: item.kind == "audio")
        assert seen.close_code is None and seen.types() == ["audio.start"]
        quitter.transport.abort()  # TCP gone in the middle of a segment, no closing handshake

        await send_json(other, {"type": "input.text", "text": "The other session goes on. "})
        await send_json(other, {"type": "input.text", "text": "It finishes normally."})
        await send_json(other, {"type": "input.done"})
        result = await collect(other)
    finally:
        await quitter.close()
        await other.close()
    segments, problems = segments_of(result.items)
    assert problems == []
    assert [s.start["sentence_text"] for s in segments] == ["The other session goes on.", "It finishes normally."]
    assert all(s.done["total_bytes"] == len(s.audio) > 0 and not s.done["error"] for s in segments)
    assert result.events[-1] == {"type": "session.done", "session_id": other_configured["session_id"], "total_sentences": 2}
    assert result.close_code == 1000
    await spoken_ok(server)


# -- Origin, HTTP, management ---------------------------------------------------------------------------


async def test_no_origin_header_is_accepted(server):
    ws = await open_session(server.ws_url, origin=None)
    try:
        assert "Origin" not in ws.request.headers
        configured = await configure(ws)
        assert configured["engine"] == "hibari"
    finally:
        await ws.close()


async def test_foreign_origin_is_refused_with_403(server):
    with pytest.raises(InvalidStatus) as refused:
        ws = await open_session(server.ws_url, origin="http://evil.example")
        await ws.close()
    assert refused.value.response.status_code == 403


async def test_own_origin_is_accepted(server):
    ws = await open_session(server.ws_url, origin=f"http://localhost:{server.port}")
    try:
        configured = await configure(ws)
        assert SESSION_ID.match(configured["session_id"])
    finally:
        await ws.close()


def test_healthz_reports_the_engine(server):
    status, content_type, body = server.get_json("/healthz")
    assert status == 200
    assert content_type.startswith("application/json")
    assert body["engine"] == "hibari" and body["status"] == "ok"
    assert "heart" in body["voices"] and body["sample_rate"] == RATE


def test_the_server_runs_on_uvloop(server):
    """`manage.py serve` installs uvloop before Django makes daphne's loop (speech/server/eventloop.py); the
    start-up line names the loop daphne actually runs on."""
    line = next(line for line in server.stderr_text().splitlines() if "serving on ws://" in line)
    assert line.endswith("(engine hibari, event loop uvloop)"), line


def test_without_uvloop_the_server_runs_on_asyncios_loop_and_says_so(tmp_path):
    """Where uvloop has no wheels (Windows) it is not installed: `manage.py serve` warns and serves."""
    (tmp_path / "uvloop.py").write_text("raise ImportError('no wheel for this platform')\n")
    srv = DaphneServer({**SERVER_ENV, "PYTHONPATH": f"{tmp_path}:{PROJECT_ROOT}"}).start()
    try:
        result = asyncio.run(run_session(srv.ws_url, {"response_format": "pcm"}, ["Hello."]))
    finally:
        srv.stop()
    log = srv.stderr_text()
    srv.cleanup()
    assert result.close_code == 1000 and result.audio_frames
    assert "event loop: asyncio's own (uvloop is not installed" in log
    assert "event loop asyncio)" in log


def test_manage_py_check_passes():
    done = subprocess.run([PYTHON, "manage.py", "check"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout
    assert "Traceback" not in done.stderr


def test_sigterm_stops_an_idle_server():
    srv = DaphneServer(SERVER_ENV).start()
    try:
        assert port_accepts(srv.host, srv.port)
        health(srv)
    finally:
        code = srv.stop()
    assert srv.stopped_by_sigterm, "not stopped by SIGTERM within the bounded wait"
    assert code == 0, f"exit status {code}"
    assert not port_accepts(srv.host, srv.port)
    srv.assert_no_traceback()
    srv.cleanup()


def test_sigterm_with_a_client_that_stopped_reading_exits_after_a_bounded_wait():
    """The server waits for its clients to answer the close frames of the sessions it ended (so that a
    client reading what was queued before them gets 4001, not a reset), but not for ever: one that
    stopped reading never answers, and the process exits once SHUTDOWN_CLOSE_WAIT_S has passed."""
    srv = DaphneServer(SERVER_ENV).start()

    async def scenario():
        ws = await open_session(srv.ws_url, small_buffers=True)
        try:
            await configure(ws, {"stream_audio": True})
            await send_json(ws, {"type": "input.text", "text": " ".join(BARGE_SENTENCES) + " "})
            await collect(ws, until=lambda item: item.kind == "audio")
            await asyncio.to_thread(held, srv)
            srv.proc.send_signal(15)
            # A hang guard (20 s), not a timing assertion; the client reads nothing meanwhile.
            return await asyncio.to_thread(srv.proc.wait, srv.stop_timeout)
        finally:
            await ws.close()

    try:
        code = asyncio.run(scenario())
    finally:
        srv.stop()
    assert code == 0, srv.stderr_text()[-3000:]
    assert "1 WebSocket client(s) did not answer the close within 5 s" in srv.stderr_text()
    srv.assert_no_traceback()
    srv.cleanup()


# -- shutdown while a session is speaking -----------------------------------------------------------------


@pytest.fixture(scope="module")
def sigterm_mid_session():
    """One server, one session in the middle of a segment, then SIGTERM. Records what everyone saw."""
    srv = DaphneServer(SERVER_ENV).start()
    outcome = {}

    async def scenario():
        ws = await open_session(srv.ws_url)
        try:
            await configure(ws, {"stream_audio": True})
            await send_json(ws, {"type": "input.text", "text": " ".join(BARGE_SENTENCES) + " "})
            seen = await collect(ws, until=lambda item: item.kind == "audio")
            assert seen.close_code is None
            srv.proc.send_signal(15)
            rest = await collect(ws, timeout=30)
            outcome["close_code"] = rest.close_code
            outcome["events"] = rest.events
        finally:
            await ws.close()

    try:
        asyncio.run(scenario())
        try:
            outcome["returncode"] = srv.proc.wait(timeout=srv.stop_timeout)
            outcome["stopped"] = True
        except subprocess.TimeoutExpired:
            outcome["stopped"] = False
    finally:
        srv.stop()
    outcome["stderr"] = srv.stderr_text()
    srv.cleanup()
    return outcome


def test_sigterm_mid_session_stops_the_server_within_a_bounded_wait(sigterm_mid_session):
    assert sigterm_mid_session["stopped"], "SIGTERM did not stop a server with a live session"
    assert "Traceback" not in sigterm_mid_session["stderr"], sigterm_mid_session["stderr"][-4000:]


def test_sigterm_mid_session_exits_cleanly(sigterm_mid_session):
    assert sigterm_mid_session["returncode"] == 0, (
        f"exit status {sigterm_mid_session['returncode']}:\n{sigterm_mid_session['stderr'][-2000:]}"
    )


def test_sigterm_mid_session_closes_the_session_with_4001(sigterm_mid_session):
    assert sigterm_mid_session["close_code"] == 4001, sigterm_mid_session
    errors = [event for event in sigterm_mid_session["events"] if event.get("type") == "error"]
    assert errors and errors[-1]["message"] == "speech session terminated: the server is shutting down"
