"""Delivery at the speed of the reader, over real sockets: a real daphne (`manage.py serve`), Hibari.

A client that stops reading is held (seen from the server's side in /metrics: the held-session
gauge, the audio-bytes counter and the synthesis counter), resumes cleanly, can cancel while held,
and a client reading at real time gets every frame in order, bit-identical to a fast reader's, which
gets frames larger than 200 ms (as much as its window takes, up to 1 s).
Waits are bounded polls of states the server reaches on its own; nothing sleeps and hopes.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from speech.stream.frames import FIRST_FRAME_S, FRAME_S, MAX_FRAME_S
from tests.support.heard import without_heard
from tests.support.live import (
    assert_healthy,
    audio_past,
    cancelled_segments,
    collect,
    configure,
    held,
    is_event,
    metric,
    module_server,
    open_session,
    run_session,
    segments_of,
    send_json,
    wait_for,
)

pytestmark = pytest.mark.live

RATE = 24000
SEED = 11
CONFIG = {"response_format": "pcm", "stream_audio": True, "seed": SEED}
SENTENCES = [f"This is sentence number {i} of a long answer that the client stops reading." for i in range(30)]
LONG_TEXT = " ".join(SENTENCES) + " "
SYNTHESISED = "speech_segment_synthesis_seconds_count"
AUDIO_BYTES = "speech_audio_sent_bytes_total"


server = module_server()


@pytest.fixture(autouse=True)
def no_traceback_after_each_test(server):
    yield
    assert_healthy(server)
    wait_for(lambda: metric(server, "speech_sessions_held") == 0, "no session held once its client is gone")


async def held_session(server):
    """A session speaking LONG_TEXT whose client read one second of audio, then stopped; returns once
    the server holds it and no synthesis is running anywhere."""
    ws = await open_session(server.ws_url, small_buffers=True)
    configured = await configure(ws, CONFIG)
    await send_json(ws, {"type": "input.text", "text": LONG_TEXT})
    before = await collect(ws, until=audio_past(1.0))
    assert before.close_code is None, before.types()
    await asyncio.to_thread(held, server)
    await asyncio.to_thread(
        wait_for, lambda: metric(server, "speech_engine_queue_depth") == 0, "the held session's look-ahead synthesised"
    )
    return ws, configured["session_id"], before.items


async def test_a_held_session_sends_and_synthesises_nothing_while_others_are_served(server):
    ws, sid, items = await held_session(server)
    try:
        audio_before, synthesised_before = metric(server, AUDIO_BYTES), metric(server, SYNTHESISED)
        other = await run_session(server.ws_url, CONFIG, ["Meanwhile, another client is served. "])
        other_segments, problems = segments_of(other.items)
        assert problems == [] and other.close_code == 1000 and len(other_segments) == 1
        # Everything the server sent and synthesised meanwhile was the other session's.
        assert metric(server, AUDIO_BYTES) - audio_before == len(other_segments[0].audio)
        assert metric(server, SYNTHESISED) - synthesised_before == 1
        assert metric(server, "speech_sessions_held") == 1

        # The client reads again: every sentence arrives, in order, whole.
        await send_json(ws, {"type": "input.done"})
        rest = await collect(ws)
    finally:
        await ws.close()
    assert rest.close_code == 1000
    segments, problems = segments_of(items + rest.items)
    assert problems == []
    assert [s.start["sentence_text"] for s in segments] == SENTENCES
    assert all(s.done["total_bytes"] == len(s.audio) > 0 and not s.done["cancelled"] for s in segments)
    assert rest.events[-1] == {"type": "session.done", "session_id": sid, "total_sentences": len(SENTENCES)}


async def test_a_cancel_while_held_stops_the_segment_and_drops_the_rest(server):
    ws, sid, items = await held_session(server)
    try:
        await send_json(ws, {"type": "input.cancel"})
        after = await collect(ws, until=is_event("input.cancelled"))
        assert after.close_code is None
        # The segment being sent when the cancel came: cut, with exactly the bytes the client got.
        _, cut = cancelled_segments(items + after.items, sid)
        assert 0 < len(cut.audio)
        assert without_heard(after.events[-1]) == {
            "type": "input.cancelled",
            "session_id": sid,
            "cancelled_sentences": len(SENTENCES) - cut.index,
            "total_sentences": cut.index + 1,
            "origin": "client",
        }
        # Nothing more of the dropped speech; the session goes on with the next free index.
        await send_json(ws, {"type": "input.text", "text": "Sure. "})
        await send_json(ws, {"type": "input.done"})
        rest = await collect(ws)
    finally:
        await ws.close()
    (segment,), problems = segments_of(rest.items)
    assert problems == [] and rest.close_code == 1000
    assert segment.start["sentence_index"] == cut.index + 1 and segment.start["sentence_text"] == "Sure."


async def read_like_a_player(url, texts, buffer_s=0.5):
    """A client that plays at real time: it reads only while less than `buffer_s` is buffered."""
    ws = await open_session(url)
    try:
        await configure(ws, CONFIG)
        for text in texts:
            await send_json(ws, {"type": "input.text", "text": text})
        await send_json(ws, {"type": "input.done"})
        started, played = None, 0.0

        def pace(item):
            nonlocal started, played
            if item.kind == "audio":
                started = started or time.monotonic()
                played += len(item.data) / 2 / RATE
            return False

        result = None
        while result is None or result.close_code is None:
            result = await collect(ws, result, until=lambda item: pace(item) or item.kind == "audio")
            ahead = played - (time.monotonic() - started) if started else 0.0
            if ahead > buffer_s:
                await asyncio.sleep(ahead - buffer_s)  # the player's own clock, as a real one would
        return result
    finally:
        await ws.close()


async def test_a_client_reading_at_real_time_gets_every_frame_in_order(server):
    texts = ["A reader that plays as it reads. ", "It never falls behind, and it never gets a gap."]
    slow = await read_like_a_player(server.ws_url, texts)
    fast = await run_session(server.ws_url, CONFIG, texts)
    assert slow.close_code == fast.close_code == 1000
    slow_segments, problems = segments_of(slow.items)
    assert problems == []
    fast_segments, _ = segments_of(fast.items)
    assert [s.done["total_bytes"] for s in slow_segments] == [len(s.audio) for s in slow_segments]
    # Same seed: the slow reader got exactly the fast reader's audio, every byte, in order.
    assert [s.audio for s in slow_segments] == [s.audio for s in fast_segments]
    assert sum(len(s.audio) for s in slow_segments) / 2 / RATE > 2.0
    # Each segment starts with a 40 ms frame; a fast reader's window (loopback, a default receive
    # buffer) takes more than 200 ms at once, and frames grow to what it takes, up to 1 s.
    for segments in (slow_segments, fast_segments):
        assert all(len(s.frames[0]) == int(RATE * FIRST_FRAME_S) * 2 for s in segments)
        assert all(len(frame) <= int(RATE * MAX_FRAME_S) * 2 for s in segments for frame in s.frames)
    assert max(len(frame) for s in fast_segments for frame in s.frames) > int(RATE * FRAME_S) * 2
