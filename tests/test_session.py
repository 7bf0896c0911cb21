"""SpeechSession (plain asyncio) through the recording transport, with the FakeEngine.

Barriers, never sleeps: `s.barrier()` sends input.commit with an empty buffer and asserts the very
next item is its input.committed (so nothing else was emitted before it); FakeEngine(hold=True)
lets the first chunk of every stream out and each further chunk only on `engine.allow()`.
The only real waits are for the config/idle timeouts, set to 0.05 s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import wave

import numpy as np
import pytest

from speech.audio import signal as audio
from speech.engines.fake import FakeEngine
from speech.stream.engine import EngineBusy, queues
from speech.stream.meter import NullMeter
from speech.stream.outcomes import OUTCOME_DISCONNECTED, SessionSummary

from .conftest import CHUNK_BYTES, HANG_GUARD_S, LIMITS, SESSION_ID_RE, dumps, limits, other_tasks
from .support.heard import without_heard
from .support.recorder import check_segment_order

TINY = 0.05  # s: the only real waits are for timeouts this short


def error_event(message, *, param=None, error_type="BadRequestError", code=400, **extra):
    event = {"type": "error", "message": message, "error_type": error_type}
    if param is not None:
        event["param"] = param
    if code is not None:
        event["code"] = code
    event.update(extra)
    return event


def unsupported(kind):
    return error_event(f"unsupported speech WebSocket message type: {kind!r}", param="type")


def audio_done(session_id, index, total_bytes, *, error=False, cancelled=False):
    return {
        "type": "audio.done",
        "id": f"{session_id}-{index}",
        "sentence_index": index,
        "total_bytes": total_bytes,
        "error": error,
        "cancelled": cancelled,
    }


def expected_pcm(engine, chunks):
    return audio.pcm16(np.concatenate([engine.tone(i) for i in range(chunks)]))


async def drain(s):
    """input.done, then everything up to the close, which must be 1000 after session.done."""
    await s.send({"type": "input.done"})
    items = await s.t.until_closed()
    assert items[-1] == ("close", 1000)
    assert items[-2][0] == "json" and items[-2][1]["type"] == "session.done"
    return items


# -- handshake -------------------------------------------------------------------------------------


async def test_handshake_success(speech):
    lim = limits(
        config_timeout_s=7.0,
        idle_timeout_s=9.5,
        max_config_bytes=5000,
        max_message_bytes=4000,
        max_pending_chars=3000,
        max_segment_chars=200,
    )
    s = await speech(limits_=lim, voice="ALT", response_format=" WAV ", split_granularity="clause")
    event = s.configured
    assert SESSION_ID_RE.match(event["session_id"])
    assert event == {
        "type": "session.configured",
        "session_id": s.session.session_id,
        "response_format": "wav",
        "stream_audio": False,
        "split_granularity": "clause",
        "sample_rate": 24000,
        "voice": "alt",
        "engine": "fake",
        "limits": dataclasses.asdict(lim),
    }
    assert list(event["limits"]) == [
        "config_timeout_s",
        "idle_timeout_s",
        "max_config_bytes",
        "max_message_bytes",
        "max_pending_chars",
        "max_segment_chars",
        "max_contexts",
    ]
    await s.barrier()
    await s.finish()


async def test_handshake_flat_form_and_defaults(speech):
    s = await speech(configure=False)
    await s.send({"type": "session.config", "stream_audio": True, "speaker": "alt"})
    event = await s.t.event(
        "session.configured",
        response_format="pcm",
        stream_audio=True,
        split_granularity="sentence",
        sample_rate=24000,
        voice="alt",
        engine="fake",
    )
    assert event["limits"] == dataclasses.asdict(LIMITS)
    await s.finish()


async def test_session_ids_are_unique(speech):
    ids = {(await speech()).configured["session_id"] for _ in range(5)}
    assert len(ids) == 5


async def test_forwarded_options_reach_the_engine(speech):
    engine = FakeEngine()
    s = await speech(engine, voice="alt", speed=1.5, seed=7, language="en", temperature=0.5)
    await s.text("Hello there.")
    await drain(s)
    (request,) = engine.requests
    assert (request.text, request.voice, request.speed) == ("Hello there.", "alt", 1.5)
    assert dict(request.options) == {"seed": 7, "language": "en", "temperature": 0.5}
    await s.finish()


@pytest.mark.parametrize(
    ("engine_speeds", "config", "pcm16"),
    [
        ((0.25, 4.0), {}, True),
        ((0.25, 4.0), {"speed": 1.5}, True),  # the engine speaks faster itself: nothing left to transform
        ((1.0, 1.0), {"speed": 1.5}, False),  # time-stretched here, on float32 samples
        ((0.25, 4.0), {"sample_rate": 16000}, False),  # resampled here
    ],
    ids=["plain", "engine-speed", "stretched", "resampled"],
)
async def test_the_engine_quantises_when_no_transform_follows(speech, engine_speeds, config, pcm16):
    engine = FakeEngine(speed_range=engine_speeds)
    s = await speech(engine, stream_audio=True, **config)
    await s.text("Hello there.")
    items = await drain(s)
    (request,) = engine.requests
    assert request.pcm16 is pcm16
    if pcm16:  # the same bytes as the engine's float32 audio encoded on the loop
        assert b"".join(check_segment_order(items)[0][1]) == expected_pcm(engine, 2)
    await s.finish()


BIG = 200_000  # max_config_bytes in these cases

FATAL_HANDSHAKES = [
    # (id, frame (str = text, bytes = binary), expected error event or message prefix, close code)
    ("binary-first-frame", b"\x00\x01", error_event("speech WebSocket client messages must be text frames"), 4008),
    ("binary-first-frame-too-big", b"x" * (BIG + 1), f"exceeds {BIG} bytes", 4009),
    ("invalid-json", "{", "speech WebSocket message is not valid JSON", 4008),
    ("deeply-nested-json", "[" * 100000, "speech WebSocket message is not valid JSON", 4008),
    (
        "deeply-nested-config",
        '{"type":"session.config","session":{"model":' + "[" * 50000 + "]" * 50000 + "}}",
        "speech WebSocket message is not valid JSON",
        4008,
    ),
    ("non-object", "[]", error_event("speech WebSocket messages must be JSON objects"), 4008),
    (
        "not-session-config",
        dumps({"type": "input.text", "text": "hi"}),
        error_event("first WebSocket message must be session.config", param="type"),
        4008,
    ),
    ("no-type", dumps({"session": {}}), error_event("first WebSocket message must be session.config", param="type"), 4008),
    (
        "config-at-max-config-bytes-but-invalid",
        dumps({"type": "session.config", "model": "x" * (BIG - 37), "voice": "x"})[:BIG],
        "speech WebSocket message is not valid JSON",
        4008,
    ),
    # 150037 characters but 300037 UTF-8 bytes: the limit counts bytes.
    ("config-over-max-config-bytes", dumps({"type": "session.config", "model": "é" * 150000}), f"exceeds {BIG} bytes", 4009),
    (
        "unknown-voice",
        dumps({"type": "session.config", "session": {"voice": "x"}}),
        error_event("Unknown voice 'x'. Supported voices: fake, alt", param="voice"),
        4008,
    ),
    (
        "session-not-object",
        dumps({"type": "session.config", "session": "pcm"}),
        error_event("session.config session must be an object", param="session"),
        4008,
    ),
    (
        "stream-wav",
        dumps({"type": "session.config", "session": {"stream_audio": True, "response_format": "wav"}}),
        error_event(
            "stream_audio=true requires a streamable response_format (pcm, mulaw, alaw, mp3, opus, aac)", param="response_format"
        ),
        4008,
    ),
    (
        "type-error",
        dumps({"type": "session.config", "session": {"sample_rate": 24000.0}}),
        error_event("sample_rate must be an integer", param="sample_rate"),
        4008,
    ),
]


@pytest.mark.parametrize(
    "frame,expected,code", [case[1:] for case in FATAL_HANDSHAKES], ids=[case[0] for case in FATAL_HANDSHAKES]
)
async def test_fatal_handshake(speech, frame, expected, code):
    engine = FakeEngine()
    s = await speech(engine, limits(max_config_bytes=BIG), configure=False)
    if isinstance(frame, bytes):
        await s.send_bytes(frame)
    else:
        await s.send(frame)
    event = await s.t.event("error")
    if isinstance(expected, dict):
        assert event == expected
    else:
        assert expected in event["message"] and event["error_type"] == "BadRequestError" and event["code"] == 400
    await s.t.closed(code)
    assert other_tasks() == set()
    # Closed: later frames, even a valid config, are ignored.
    await s.send({"type": "session.config"})
    await s.send({"type": "input.text", "text": "Hello. "})
    assert s.t.pending() == []
    assert engine.requests == []
    await s.finish()


async def test_fatal_handshake_huge_speed(speech):
    # Regression: float() of a 400-digit JSON integer raised OverflowError out of receive_text.
    s = await speech(configure=False)
    await s.send('{"type":"session.config","speed":1' + "0" * 400 + "}")
    await s.t.event("error", message="speed must be between 0.25 and 4.0", param="speed")
    await s.t.closed(4008)
    await s.finish()


async def test_config_timeout(speech):
    s = await speech(limits_=limits(config_timeout_s=TINY), configure=False)
    assert await s.t.event() == error_event("session.config was not received before timeout")
    await s.t.closed(4008)
    assert other_tasks() == set()  # the session closed itself and left nothing running
    await s.send({"type": "session.config"})
    assert s.t.pending() == []
    await s.finish()


async def test_idle_timeout(speech):
    s = await speech(limits_=limits(idle_timeout_s=TINY))
    assert await s.t.event() == error_event("speech WebSocket idle timeout")
    await s.t.closed(4008)
    assert other_tasks() == set()
    await s.finish()


async def test_idle_timer_does_not_run_while_generating(speech):
    engine = FakeEngine(hold=True)
    s = await speech(engine, limits(idle_timeout_s=TINY), stream_audio=True)
    await s.text("Hello there. ")
    await s.t.event("audio.start", sentence_index=0)
    await s.t.binary()
    await s.t.binary()
    # By design this one waits: well past the idle limit while the engine holds the segment.
    await asyncio.sleep(TINY * 4)
    assert s.t.pending() == []
    await s.barrier()
    engine.allow(1)
    items = await s.t.until("audio.done")
    assert items[-1][1]["error"] is False
    # Nothing generates any more: now the idle timer runs.
    assert await s.t.event() == error_event("speech WebSocket idle timeout")
    await s.t.closed(4008)
    await s.finish()


# -- delivery ----------------------------------------------------------------------------------------


async def test_streaming_order_for_several_segments(speech):
    engine = FakeEngine(chunks=3)
    s = await speech(engine, stream_audio=True)
    sid = s.configured["session_id"]
    texts = ["One.", "Two two!", "Three three three?"]
    await s.text(" ".join(texts[:2]) + " Three three")
    await s.text(" three?")
    items = await drain(s)
    segments = check_segment_order(items)
    assert sorted(segments) == [0, 1, 2]
    pcm = expected_pcm(engine, 3)
    for k, text in enumerate(texts):
        start, frames, done = segments[k]
        assert start == {
            "type": "audio.start",
            "id": f"{sid}-{k}",
            "sentence_index": k,
            "sentence_text": text,
            "format": "pcm",
            "sample_rate": 24000,
        }
        assert len(frames) > 1  # streamed: many frames
        assert b"".join(frames) == pcm
        assert done == audio_done(sid, k, len(pcm))
    json_types = [value["type"] for kind, value in items if kind == "json"]
    assert json_types == ["audio.start", "audio.done"] * 3 + ["session.done"]
    assert items[-2][1] == {"type": "session.done", "session_id": sid, "total_sentences": 3}
    assert other_tasks() == set()
    await s.finish()


@pytest.mark.parametrize("fmt", ["wav", "pcm"])
async def test_non_streaming_one_frame_per_segment(speech, fmt):
    engine = FakeEngine(chunks=2)
    s = await speech(engine, response_format=fmt)
    await s.text("First sentence. Second sentence.")
    items = await drain(s)
    segments = check_segment_order(items)
    assert sorted(segments) == [0, 1]
    for k in (0, 1):
        start, frames, done = segments[k]
        assert start["format"] == fmt and start["sample_rate"] == 24000
        assert len(frames) == 1
        (frame,) = frames
        assert done["total_bytes"] == len(frame)
        if fmt == "pcm":
            assert frame == expected_pcm(engine, 2)
        else:
            with wave.open(io.BytesIO(frame)) as wav:
                assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 24000)
                assert wav.getnframes() == 2 * engine.chunk_samples
                assert wav.readframes(wav.getnframes()) == expected_pcm(engine, 2)
    await s.finish()


async def test_input_commit_flushes_and_reports(speech):
    engine = FakeEngine()
    s = await speech(engine, stream_audio=True)
    sid = s.configured["session_id"]
    await s.text("Hello there")  # no end mark: it waits in the buffer
    await s.send({"type": "input.commit"})
    assert await s.t.event() == {
        "type": "input.committed",
        "session_id": sid,
        "segment_index": 0,
        "segment_sentences": 1,
        "total_sentences": 1,
    }
    await s.t.event("audio.start", sentence_index=0, sentence_text="Hello there")
    await s.t.until("audio.done")
    event = await s.barrier()
    assert event == {
        "type": "input.committed",
        "session_id": sid,
        "segment_index": 1,
        "segment_sentences": 0,
        "total_sentences": 1,
    }
    await s.text("Two. Three. Four")
    await s.send({"type": "input.commit"})
    items = await s.t.until("input.committed")
    assert items[-1][1] == {
        "type": "input.committed",
        "session_id": sid,
        "segment_index": 2,
        "segment_sentences": 1,
        "total_sentences": 4,
    }
    items = await drain(s)
    assert [v["sentence_text"] for k, v in items if k == "json" and v["type"] == "audio.start"] == ["Two.", "Three.", "Four"]
    await s.finish()


async def test_cancel_mid_segment(speech):
    engine = FakeEngine(chunks=3, hold=True)
    s = await speech(engine, stream_audio=True)
    sid = s.configured["session_id"]
    await s.text("First one. Second one. Third one. ")
    await s.t.event("audio.start", sentence_index=0, sentence_text="First one.")
    sent = len(await s.t.binary()) + len(await s.t.binary())  # the first chunk; the second is held
    assert sent == CHUNK_BYTES
    await s.barrier()
    assert engine.running == 2  # segment 0 and its look-ahead

    await s.send({"type": "input.cancel"})
    assert await s.t.event() == audio_done(sid, 0, sent, cancelled=True)
    assert without_heard(await s.t.event()) == {
        "type": "input.cancelled",
        "session_id": sid,
        "cancelled_sentences": 3,
        "total_sentences": 1,
        "origin": "client",
    }
    await s.barrier()  # queued segments were dropped without events
    assert engine.running == 0
    assert engine.aborted == 2 and engine.completed == 0
    assert [r.text for r in engine.requests] == ["First one.", "Second one."]

    # The next segment takes the next free index.
    await s.text("Next one. ")
    engine.allow(2)
    items = await drain(s)
    segments = check_segment_order(items, first=1)
    assert segments[1][0]["id"] == f"{sid}-1" and segments[1][0]["sentence_text"] == "Next one."
    assert segments[1][2] == audio_done(sid, 1, 3 * CHUNK_BYTES)
    assert items[-2][1]["total_sentences"] == 2
    await s.finish()


async def test_after_the_client_has_gone_nothing_more_is_sent_nor_started(speech):
    """`Pipeline.abandon` (the connection is lost, before the session's teardown): the segments'
    synthesis stops at once, delivery stops with it (no audio.done, no error for a client that cannot
    read them: work on the event loop a newcomer's first audio would wait behind, bench/hangup.py), and
    no segment behind them is started."""
    engine = FakeEngine(chunks=2, hold=True)
    s = await speech(engine, stream_audio=True)
    await s.text("First one. Second one. Third one. ")
    await s.t.event("audio.start", sentence_index=0)
    await s.t.binary()  # the look-ahead starts with the first frame

    async def until(predicate):
        while not predicate():
            await asyncio.sleep(0)

    await asyncio.wait_for(until(lambda: len(engine.requests) == 2), HANG_GUARD_S)
    delivery = s.session.pipeline._delivery
    sent = len(s.t.log)
    s.session.pipeline.abandon()
    await asyncio.wait_for(asyncio.wait({delivery}), HANG_GUARD_S)
    await asyncio.wait_for(until(lambda: engine.aborted == 2), HANG_GUARD_S)
    assert delivery.cancelled() and len(s.t.log) == sent
    assert engine.running == 0
    assert [r.text for r in engine.requests] == ["First one.", "Second one."]


class HoldingQueue:
    """A synthesis queue (speech/engines/pool.py's part) that holds the work of every ticket."""

    def __init__(self):
        self.abandoned = []

    def abandon(self, ticket):
        self.abandoned.append(ticket)
        return True


async def test_after_the_client_has_gone_work_the_pool_held_is_stopped_there_and_its_tasks_sleep_until_teardown(speech):
    """A producer whose job the pool held is left asleep by `Pipeline.abandon` (the pool has stopped the
    job; woken now, the producers of 20 clients leaving at once take the event loop's turn ahead of a
    newcomer's first frame, bench/hangup.py), and cancelled by the session's teardown."""
    engine = FakeEngine(chunks=2, hold=True)
    s = await speech(engine, stream_audio=True)
    await s.text("First one. Second one. Third one. ")
    await s.t.event("audio.start", sentence_index=0)
    await s.t.binary()

    async def until(predicate):
        while not predicate():
            await asyncio.sleep(0)

    await asyncio.wait_for(until(lambda: len(engine.requests) == 2), HANG_GUARD_S)
    queue = HoldingQueue()
    queues.add(queue)
    try:
        s.session.pipeline.abandon()
    finally:
        queues.discard(queue)
    producers = [job.producer for job in s.session.pipeline.jobs if job.producer is not None]
    # The third segment has no producer yet: nothing of it is in a queue, and the queues do not hear of it.
    assert len(queue.abandoned) == 2 and len(producers) == 2
    await asyncio.sleep(0)
    assert engine.aborted == 0 and not any(task.done() for task in producers)
    await asyncio.wait_for(s.session.aclose(), HANG_GUARD_S)
    assert engine.aborted == 2 and all(task.done() for task in producers)
    assert [r.text for r in engine.requests] == ["First one.", "Second one."]


async def test_cancel_in_non_streaming_mode_drops_unannounced_segments(speech):
    engine = FakeEngine(chunks=2, hold=True)
    s = await speech(engine)
    await s.text("First one. Second one. Third")
    await s.send({"type": "input.cancel"})
    # Nothing was announced (non-streaming audio goes out whole), so no audio.done at all.
    assert without_heard(await s.t.event()) == {
        "type": "input.cancelled",
        "session_id": s.session.session_id,
        "cancelled_sentences": 2,
        "total_sentences": 0,
        "origin": "client",
    }
    await s.barrier()  # the buffer ("Third") was cleared too
    assert engine.running == 0
    await s.text("Again.")
    engine.allow(1)
    items = await drain(s)
    assert check_segment_order(items)[0][0]["sentence_text"] == "Again."
    await s.finish()


async def test_cancel_with_nothing_going(speech):
    s = await speech()
    await s.send({"type": "input.cancel"})
    assert without_heard(await s.t.event()) == {
        "type": "input.cancelled",
        "session_id": s.session.session_id,
        "cancelled_sentences": 0,
        "total_sentences": 0,
        "origin": "client",
    }
    await s.barrier()
    await s.finish()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_engine_failure_on_one_segment(speech, stream):
    engine = FakeEngine(fail_on="FAIL")
    s = await speech(engine, stream_audio=stream)
    sid = s.configured["session_id"]
    await s.text("Hello. FAIL here. Bye.")
    items = await drain(s)
    segments = check_segment_order(items)
    assert sorted(segments) == [0, 1, 2]
    events = [v for k, v in items if k == "json"]
    failed = events.index(
        error_event("fake engine failure", error_type="server_error", code=None, id=f"{sid}-1", sentence_index=1)
    )
    assert events[failed + 1] == audio_done(sid, 1, 0, error=True)
    assert segments[1][0] is None  # no audio.start for a segment that produced no audio
    assert segments[0][2]["error"] is False and segments[2][2]["error"] is False
    assert segments[2][0]["sentence_text"] == "Bye."
    assert events[-1] == {"type": "session.done", "session_id": sid, "total_sentences": 3}
    await s.finish()


async def test_engine_failure_after_audio_in_streaming(speech):
    engine = FakeEngine(fail_on="FAIL", fail_after=1, chunks=2)
    s = await speech(engine, stream_audio=True)
    sid = s.configured["session_id"]
    await s.text("FAIL late.")
    items = await drain(s)
    segments = check_segment_order(items)
    start, frames, done = segments[0]
    assert start is not None and start["sentence_index"] == 0
    assert sum(map(len, frames)) == CHUNK_BYTES
    events = [v for k, v in items if k == "json"]
    assert events[1] == error_event(
        "fake engine failure", error_type="server_error", code=None, id=f"{sid}-0", sentence_index=0, partial_audio=True
    )
    assert done == audio_done(sid, 0, CHUNK_BYTES, error=True)
    await s.finish()


async def test_engine_failure_after_audio_not_streaming_sends_no_audio(speech):
    engine = FakeEngine(fail_on="FAIL", fail_after=1, chunks=2)
    s = await speech(engine)
    sid = s.configured["session_id"]
    await s.text("FAIL late.")
    items = await drain(s)
    assert [kind for kind, _ in items] == ["json", "json", "json", "close"]
    assert items[0][1] == error_event(
        "fake engine failure", error_type="server_error", code=None, id=f"{sid}-0", sentence_index=0
    )
    assert items[1][1] == audio_done(sid, 0, 0, error=True)
    await s.finish()


async def test_engine_busy(speech):
    engine = FakeEngine(fail_on="BUSY", error=EngineBusy())
    s = await speech(engine, stream_audio=True)
    sid = s.configured["session_id"]
    await s.text("BUSY now. Fine.")
    items = await drain(s)
    events = [v for k, v in items if k == "json"]
    assert events[0] == {
        "type": "error",
        "message": "The request queue is full.",
        "error_type": "server_error",
        "id": f"{sid}-0",
        "sentence_index": 0,
    }
    assert events[1] == audio_done(sid, 0, 0, error=True)
    assert check_segment_order(items)[1][2]["error"] is False
    await s.finish()


async def test_segment_over_max_segment_chars(speech):
    engine = FakeEngine()
    s = await speech(engine, limits(max_segment_chars=10), stream_audio=True)
    sid = s.configured["session_id"]
    await s.text("Short one. This sentence is too long. Ok.")
    items = await drain(s)
    segments = check_segment_order(items)
    assert segments[0][0]["sentence_text"] == "Short one."  # exactly 10: allowed
    events = [v for k, v in items if k == "json"]
    failed = events.index(error_event("input must be at most 10 characters", param="input", id=f"{sid}-1", sentence_index=1))
    assert events[failed + 1] == audio_done(sid, 1, 0, error=True)
    assert segments[1][0] is None
    assert segments[2][0]["sentence_text"] == "Ok."
    assert [r.text for r in engine.requests] == ["Short one.", "Ok."]  # the long one never reached it
    await s.finish()


# -- pending text limit (fatal) ----------------------------------------------------------------------


async def test_pending_text_limit_single_frame(speech):
    engine = FakeEngine()
    s = await speech(engine, limits(max_pending_chars=20))
    await s.text("x" * 20)  # at the limit: fine
    await s.text("y")
    assert await s.t.event() == error_event("buffered speech text exceeds 20 characters", param="text")
    await s.t.closed(4008)
    assert other_tasks() == set()
    await s.text("more")
    assert s.t.pending() == []
    assert engine.requests == []
    await s.finish()


async def test_pending_text_limit_counts_queued_segments(speech):
    engine = FakeEngine(hold=True)
    s = await speech(engine, limits(max_pending_chars=30), stream_audio=True)
    await s.text("Aaaa. Bbbb. ")  # both start synthesis at once: not pending any more
    await s.t.event("audio.start", sentence_index=0)
    await s.t.binary()
    await s.t.binary()
    await s.barrier()
    assert engine.running == 2
    await s.text("Cccc. Dddd. Eeee. ")  # 18 chars in; 3 segments of 5 queued
    await s.text("Ffff gggg hhhh")  # 15 queued + 14 buffered = 29
    await s.text("ii")  # 31 > 30
    items = await s.t.until("error")
    assert items[-1][1] == error_event("buffered speech text exceeds 30 characters", param="text")
    await s.t.closed(4008)
    assert engine.running == 0  # the held work was aborted
    assert [r.text for r in engine.requests] == ["Aaaa.", "Bbbb."]
    assert other_tasks() == set()
    await s.finish()


# -- recoverable errors --------------------------------------------------------------------------------

RECOVERABLE = [
    ("binary-frame", b"\x00\x01", error_event("speech WebSocket client messages must be text frames")),
    ("binary-over-limit", b"x" * 101, error_event("text WebSocket message exceeds 100 bytes")),
    (
        "text-over-limit",
        dumps({"type": "input.text", "text": "€" * 40}),  # 71 chars, 151 bytes
        error_event("text WebSocket message exceeds 100 bytes"),
    ),
    ("invalid-json", "{nope", "speech WebSocket message is not valid JSON"),
    ("unterminated-lists", "[" * 100, "speech WebSocket message is not valid JSON"),
    ("nested-lists", "[" * 50 + "]" * 50, error_event("speech WebSocket messages must be JSON objects")),
    ("nan-constant", '{"type":"input.text","text":NaN}', "speech WebSocket message is not valid JSON"),
    ("non-object", "[1, 2]", error_event("speech WebSocket messages must be JSON objects")),
    ("string", '"input.text"', error_event("speech WebSocket messages must be JSON objects")),
    ("unknown-type", dumps({"type": "x"}), unsupported("x")),
    ("repeated-session-config", dumps({"type": "session.config", "session": {}}), unsupported("session.config")),
    ("missing-type", dumps({"text": "hi"}), "unsupported speech WebSocket message type:"),
    ("non-string-type", dumps({"type": 5}), "unsupported speech WebSocket message type:"),
    ("text-number", dumps({"type": "input.text", "text": 5}), error_event("input.text text must be a string", param="text")),
    ("text-null", dumps({"type": "input.text", "text": None}), error_event("input.text text must be a string", param="text")),
    ("text-missing", dumps({"type": "input.text"}), error_event("input.text text must be a string", param="text")),
    ("text-list", dumps({"type": "input.text", "text": ["a"]}), error_event("input.text text must be a string", param="text")),
]


@pytest.mark.parametrize("frame,expected", [case[1:] for case in RECOVERABLE], ids=[case[0] for case in RECOVERABLE])
async def test_recoverable_error_keeps_the_session_usable(speech, frame, expected):
    engine = FakeEngine()
    s = await speech(engine, limits(max_message_bytes=100), stream_audio=True)
    await s.text("Before ")  # text already buffered survives the error
    if isinstance(frame, bytes):
        await s.send_bytes(frame)
    else:
        await s.send(frame)
    event = await s.t.event("error")
    if isinstance(expected, dict):
        assert event == expected
    else:
        assert event["message"].startswith(expected)
        assert event["error_type"] == "BadRequestError" and event["code"] == 400
    await s.text("after.")
    items = await drain(s)
    segments = check_segment_order(items)
    assert [seg[0]["sentence_text"] for seg in segments.values()] == ["Before after."]
    assert segments[0][2]["error"] is False
    await s.finish()


async def test_deeply_nested_json_after_the_handshake(speech):
    s = await speech()
    await s.send("[" * 100000)
    event = await s.t.event("error")
    assert event["message"].startswith("speech WebSocket message is not valid JSON")
    await s.barrier()
    await s.finish()


@pytest.mark.parametrize("texts", [[""], ["   "], ["\n\t ", "", "  "]], ids=["empty", "spaces", "mixed"])
async def test_empty_and_whitespace_text_produce_nothing(speech, texts):
    engine = FakeEngine()
    s = await speech(engine)
    for text in texts:
        await s.text(text)
    assert (await s.barrier())["total_sentences"] == 0
    await s.send({"type": "input.done"})
    assert await s.t.event() == {"type": "session.done", "session_id": s.session.session_id, "total_sentences": 0}
    await s.t.closed(1000)
    assert engine.requests == []
    await s.finish()


async def test_keepalive_has_no_reply(speech):
    s = await speech()
    await s.send({"type": "session.keepalive"})
    await s.send({"type": "session.keepalive", "extra": 1})
    await s.barrier()
    await s.finish()


# -- concurrency ------------------------------------------------------------------------------------


async def test_receive_path_is_not_blocked_by_synthesis(speech):
    engine = FakeEngine(hold=True)
    s = await speech(engine, stream_audio=True)
    sid = s.configured["session_id"]
    await s.text("First one. ")
    start = await s.t.event("audio.start", sentence_index=0)
    first = [await s.t.binary(), await s.t.binary()]
    # The engine holds segment 0; frames are still handled at once, in order.
    await s.text("Second one. Third")
    await s.send({"type": "input.commit"})
    assert await s.t.event() == {
        "type": "input.committed",
        "session_id": sid,
        "segment_index": 0,
        "segment_sentences": 1,
        "total_sentences": 3,
    }
    await s.send({"type": "x"})
    assert await s.t.event() == unsupported("x")
    await s.barrier()
    assert engine.completed == 0
    engine.allow(3)
    items = await drain(s)
    segments = check_segment_order([("json", start)] + [("bytes", frame) for frame in first] + items)
    assert [seg[2]["error"] for seg in segments.values()] == [False] * 3
    await s.finish()


async def test_bounded_look_ahead(speech):
    engine = FakeEngine(chunks=2, hold=True)
    s = await speech(engine, stream_audio=True)
    texts = ["One.", "Two.", "Three.", "Four.", "Five."]
    await s.text(" ".join(texts))
    await s.send({"type": "input.commit"})
    # Four segments were complete on input.text, the commit flushed the fifth.
    await s.t.event("input.committed", segment_sentences=1, total_sentences=5)
    await s.t.event("audio.start", sentence_index=0)
    await s.t.binary()
    await s.t.binary()
    await s.barrier()
    assert len(engine.requests) == 2  # the current segment and one ahead, not all five
    assert engine.running == 2
    for k in range(5):
        engine.allow(1)  # the held chunk of the oldest waiting stream: segment k's
        items = await s.t.until("audio.done")
        assert items[-1][1]["sentence_index"] == k
        assert engine.running <= 2
        assert len(engine.requests) <= k + 3
    assert [r.text for r in engine.requests] == texts
    items = await drain(s)
    assert items[-2][1]["total_sentences"] == 5
    await s.finish()


async def test_after_input_done(speech):
    engine = FakeEngine(hold=True)
    s = await speech(engine, stream_audio=True)
    sid = s.configured["session_id"]
    await s.text("Hello there. Bye")
    await s.t.event("audio.start", sentence_index=0)
    await s.t.binary()
    await s.t.binary()
    await s.send({"type": "input.done"})  # flushes "Bye"; the session drains
    for kind in ("input.text", "input.commit", "input.done", "session.config"):
        await s.send({"type": kind, "text": "More."})
        assert await s.t.event() == unsupported(kind)
    await s.send({"type": "session.keepalive"})
    await s.send({"type": "input.cancel"})
    assert await s.t.event() == audio_done(sid, 0, CHUNK_BYTES, cancelled=True)
    assert without_heard(await s.t.event()) == {
        "type": "input.cancelled",
        "session_id": sid,
        "cancelled_sentences": 2,
        "total_sentences": 1,
        "origin": "client",
    }
    assert await s.t.event() == {"type": "session.done", "session_id": sid, "total_sentences": 1}
    await s.t.closed(1000)
    assert engine.running == 0
    assert other_tasks() == set()
    await s.finish()


async def test_input_done_finishes_every_queued_segment(speech):
    engine = FakeEngine(hold=True)
    s = await speech(engine, stream_audio=True)
    await s.text("One. Two. Three")
    await s.send({"type": "input.done"})
    engine.allow(3)
    items = await s.t.until_closed()
    assert [seg[2]["error"] for seg in check_segment_order(items).values()] == [False, False, False]
    assert items[-2][1]["total_sentences"] == 3 and items[-1] == ("close", 1000)
    await s.finish()


async def test_disconnect_mid_segment_aborts_everything(speech):
    engine = FakeEngine(chunks=3, hold=True)
    s = await speech(engine, stream_audio=True)
    await s.text("First one. Second one. Third one. ")
    await s.t.event("audio.start", sentence_index=0)
    await s.t.binary()
    await s.t.binary()
    await s.barrier()
    assert engine.running == 2
    recorded = len(s.t.log)
    await asyncio.wait_for(s.session.aclose(), 5)
    assert engine.running == 0 and engine.aborted == 2
    assert other_tasks() == set()
    await s.text("Later. ")
    await s.send({"type": "input.commit"})
    assert len(s.t.log) == recorded  # nothing is sent once the client is gone
    await s.finish()


async def test_flood_of_tiny_frames(speech):
    engine = FakeEngine(chunks=1)
    lim = limits(max_pending_chars=2000)
    s = await speech(engine, lim, stream_audio=True)
    longest = 0
    for i in range(10_000):
        await s.text("word ")
        pending = s.session.contexts.default.segmenter.pending_chars + s.session.pipeline.queued_chars
        longest = max(longest, s.session.contexts.default.segmenter.pending_chars)
        assert pending <= lim.max_pending_chars
        if i % 100 == 99:
            # Let synthesis catch up (the flood itself never yields): wait for the queued segments.
            while s.session.pipeline.queued_chars:
                await s.t.until("audio.done")
    assert longest <= 400 + 5  # unpunctuated text is cut near 400 characters
    items = await drain(s)
    assert s.t.after_close == []
    texts = [seg[0]["sentence_text"] for seg in check_segment_order(list(s.t.log)).values()]
    assert " ".join(texts).split() == ["word"] * 10_000
    assert items[-2][1]["total_sentences"] == len(texts)
    await s.finish()


async def test_flood_with_a_stalled_engine_is_refused_not_buffered(speech):
    engine = FakeEngine(hold=True)
    s = await speech(engine, limits(max_pending_chars=1000), stream_audio=True)
    await s.text("Hi. ")
    await s.t.event("audio.start", sentence_index=0)  # the engine took it and stalls after one chunk
    for _ in range(10_000):
        await s.text("Hi. ")
    items = await s.t.until("error")
    assert items[-1][1] == error_event("buffered speech text exceeds 1000 characters", param="text")
    await s.t.closed(4008)
    assert s.t.pending() == []
    assert len(engine.requests) <= 2 and engine.running == 0
    await s.finish()


async def test_close_after_session_done_leaves_nothing_running(speech):
    engine = FakeEngine()
    s = await speech(engine, stream_audio=True)
    await s.text("Hi there.")
    await drain(s)
    assert other_tasks() == set()
    assert engine.running == 0 and engine.completed == 1
    assert s.session.closed.is_set()
    await s.finish()


async def test_events_are_plain_json(speech):
    s = await speech(stream_audio=True)
    await s.text("Héllo ☃ there.")
    await drain(s)
    for kind, value in s.t.log:
        if kind == "json":
            assert json.loads(json.dumps(value)) == value
    await s.finish()


# -- a transport whose sends suspend (as a real socket write may) ------------------------------------


async def test_yielding_transport_streaming_order(speech):
    engine = FakeEngine(chunks=3)
    s = await speech(engine, stream_audio=True, yield_on_send=True)
    await s.text("One. Two two! Three three three?")
    await s.send({"type": "input.commit"})
    items = await drain(s)
    assert len(check_segment_order([item for item in items])) == 3
    assert s.t.after_close == []
    await s.finish()


async def test_yielding_transport_cancel_after_input_done(speech):
    # Regression: session.done and close 1000 went out before input.cancelled when a send suspended.
    engine = FakeEngine(hold=True)
    s = await speech(engine, stream_audio=True, yield_on_send=True)
    sid = s.configured["session_id"]
    await s.text("Hello there. Bye")
    await s.t.event("audio.start", sentence_index=0)
    await s.t.binary()
    await s.t.binary()
    await s.send({"type": "input.done"})
    await s.send({"type": "input.cancel"})
    assert await s.t.event() == audio_done(sid, 0, CHUNK_BYTES, cancelled=True)
    assert without_heard(await s.t.event()) == {
        "type": "input.cancelled",
        "session_id": sid,
        "cancelled_sentences": 2,
        "total_sentences": 1,
        "origin": "client",
    }
    assert await s.t.event() == {"type": "session.done", "session_id": sid, "total_sentences": 1}
    await s.t.closed(1000)
    await s.finish()


# -- odd engines and transports ------------------------------------------------------------------------


async def test_engine_that_produces_no_audio(speech):
    engine = FakeEngine(chunks=0)
    s = await speech(engine, stream_audio=True)
    sid = s.configured["session_id"]
    await s.text("Silent. ")
    assert await s.t.event() == error_event(
        "the engine produced no audio for this segment", error_type="server_error", code=None, id=f"{sid}-0", sentence_index=0
    )
    assert await s.t.event() == audio_done(sid, 0, 0, error=True)
    await s.barrier()
    await s.finish()


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
async def test_engine_that_yields_only_empty_chunks(speech, stream):
    # Regression: empty chunks got audio.start and a successful, empty audio.done (and an empty frame).
    engine = FakeEngine(chunk_s=0.0, chunks=2)
    s = await speech(engine, stream_audio=stream)
    sid = s.configured["session_id"]
    await s.text("Silent. ")
    assert await s.t.event() == error_event(
        "the engine produced no audio for this segment", error_type="server_error", code=None, id=f"{sid}-0", sentence_index=0
    )
    assert await s.t.event() == audio_done(sid, 0, 0, error=True)
    await s.finish()


async def test_delivery_failure_is_an_internal_error(speech):
    from .support.recorder import Recorder

    class BrokenSocket(Recorder):
        async def send_bytes(self, data):
            raise RuntimeError("socket broke")

    engine = FakeEngine(hold=True)
    s = await speech(engine, configure=False)
    s.t = s.session.transport = BrokenSocket()
    await s.configure(stream_audio=True)
    await s.text("Hello. There. ")
    assert await s.t.event("audio.start")
    assert await s.t.event() == {"type": "error", "message": "internal server error", "error_type": "server_error"}
    await s.t.closed(4011)
    assert engine.running == 0
    assert other_tasks() == set()
    await s.finish()


# -- a timeout that fires just as a frame arrives ----------------------------------------------------


@pytest.mark.parametrize("which", ["config", "idle"])
async def test_timeout_that_fired_just_before_a_frame_is_void(speech, which):
    s = await speech(configure=which != "config")
    # The deadline passes: the event loop runs the timer's callback (white-box: we run it ourselves,
    # deterministically) ...
    handle = s.session._timeout.handle
    assert handle is not None
    fire = handle._callback  # noqa: SLF001
    handle.cancel()  # it fires once, here, not again from the loop
    fire()
    # ... and, in the same loop pass, the client's frame is handled.
    if which == "config":
        await s.configure()
    else:
        await s.send({"type": "session.keepalive"})
    await s.barrier()
    await s.barrier()  # the session must still be alive
    await s.finish()


# -- the session's ports out: its Meter, and its SessionSummary at the end ---------------------------------


class RecordingMeter(NullMeter):
    def __init__(self):
        self.calls = []

    def first_audio(self, seconds):
        self.calls.append(("first_audio", seconds))

    def audio_sent(self, nbytes, seconds):
        self.calls.append(("audio_sent", nbytes, seconds))

    def segment_synthesised(self, engine_s, audio_s):
        self.calls.append(("segment_synthesised", audio_s))

    def cancelled(self, origin):
        self.calls.append(("cancelled", origin))

    def error_sent(self, error_type, code):
        self.calls.append(("error_sent", error_type, code))


async def test_the_session_reports_to_the_meter_it_is_given_and_sums_up_at_its_end(speech):
    """The core imports no metrics library: its figures go to the Meter the server hands it
    (speech/metrics.py's), and what adapters read at its end is its SessionSummary."""
    meter = RecordingMeter()
    engine = FakeEngine(chunks=2)
    s = await speech(engine, meter=meter, stream_audio=True)
    await s.text("First one. ")
    await s.t.event("audio.start")
    frames = []
    while (item := await s.t.next())[0] == "bytes":
        frames.append(item[1])
    assert item[1]["type"] == "audio.done" and item[1]["total_bytes"] == sum(map(len, frames))
    await s.send({"type": "input.cancel"})
    await s.t.event("input.cancelled")
    await s.send({"type": "input.nope"})
    assert await s.t.event() == unsupported("input.nope")
    summary = await s.session.aclose()

    sent = [call for call in meter.calls if call[0] == "audio_sent"]
    assert [nbytes for _, nbytes, _ in sent] == [len(frame) for frame in frames]
    first = [call for call in meter.calls if call[0] == "first_audio"]
    assert first == [("first_audio", summary.first_audio_s)] and summary.first_audio_s > 0
    assert ("segment_synthesised", pytest.approx(sum(seconds for _, _, seconds in sent))) in meter.calls
    assert ("cancelled", "client") in meter.calls
    assert ("error_sent", "BadRequestError", 400) in meter.calls
    assert summary == SessionSummary(
        session_id=s.configured["session_id"],
        outcome=OUTCOME_DISCONNECTED,
        segments=1,
        bytes_sent=sum(len(frame) for frame in frames),
        first_audio_s=summary.first_audio_s,
    )
    assert summary.outcome == "disconnected"  # the client left: not "cancelled", which is barge-in
    await s.finish()


async def test_an_engine_failure_is_logged_while_its_segment_is_listened_to(speech, caplog):
    """A segment the engine fails on while its ticket stands is logged with its traceback (once its
    ticket is abandoned the failure is the engine stopping: tests/test_hangup_live.py)."""
    caplog.set_level("ERROR", logger="speech.stream.producer")
    s = await speech(FakeEngine(fail_on="FAIL", error=RuntimeError("boom")))
    await s.text("This one will FAIL. ")
    await s.t.event("error", message="speech synthesis failed")
    assert [r.getMessage() for r in caplog.records] == [f"synthesis failed for a segment of {s.session.session_id}"]
