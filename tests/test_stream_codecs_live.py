"""Streamed mp3, opus and aac over real sockets: a real daphne (`manage.py serve`), Hibari.

Every binary frame holds whole codec frames (Ogg pages for opus, numbered on across the session), the
session's frames together decode with FFmpeg (PyAV) as one stream, as long as the pcm session of the
same text and seed within one codec frame per segment, and a cancel while the client is held stops
the audio within one frame and leaves the stream valid for the next utterance.
"""

from __future__ import annotations

import asyncio

import pytest

from speech.audio.streaming import SessionEncoder
from tests.support.live import (
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
from tests.support.streams import assert_whole_frames, decoded_by_libsndfile, decoded_samples

pytestmark = pytest.mark.live

SEED = 5
TEXT = ["The first sentence is short. ", "The second one, a little longer, takes its time. ", "And a third. "]
LONG_TEXT = " ".join(f"Sentence number {i} of a long answer that the client stops reading." for i in range(60)) + " "
AUDIO_BYTES = "speech_audio_sent_bytes_total"
RATES = {"mp3": 24000, "opus": 48000, "aac": 16000}


server = module_server()


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac"])
async def test_a_streamed_session_is_one_stream_as_long_as_pcm_within_a_frame_per_segment(server, fmt):
    rate = RATES[fmt]
    coded = await run_session(
        server.ws_url, {"response_format": fmt, "stream_audio": True, "sample_rate": rate, "seed": SEED}, TEXT
    )
    pcm = await run_session(
        server.ws_url, {"response_format": "pcm", "stream_audio": True, "sample_rate": rate, "seed": SEED}, TEXT
    )
    assert coded.close_code == pcm.close_code == 1000
    segments, problems = segments_of(coded.items)
    assert problems == [] and len(segments) == len(TEXT)
    assert all(s.start["format"] == fmt and s.done["total_bytes"] == len(s.audio) for s in segments)
    frames = coded.audio_frames
    assert_whole_frames(frames, fmt)
    pcm_samples = sum(len(frame) for frame in pcm.audio_frames) // 2
    frame_size = SessionEncoder(fmt, rate).frame_size
    assert 0 <= decoded_samples(b"".join(frames), fmt) - pcm_samples < len(segments) * frame_size
    if fmt != "aac":  # a decoder of another library than the encoder's: libsndfile (mpg123, libopus)
        samples, decoded_rate = decoded_by_libsndfile(b"".join(frames), fmt)
        assert decoded_rate == rate and 0 <= samples.size - pcm_samples < len(segments) * frame_size + (
            1105 if fmt == "mp3" else 0
        )


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac"])
async def test_a_cancel_while_held_stops_within_one_frame_and_the_stream_stays_valid(server, fmt):
    """The client stops reading until the server holds the session mid-segment (its frames wait for the
    socket), then cancels: the server's own audio counter says at most one frame went out after the
    cancel, and the session's frames, the cut and the next utterance included, are one stream."""
    ws = await open_session(server.ws_url, small_buffers=True)
    try:
        await configure(ws, {"response_format": fmt, "stream_audio": True, "seed": SEED})
        await send_json(ws, {"type": "input.text", "text": LONG_TEXT})
        before = await collect(ws, until=lambda item: item.kind == "audio")
        await asyncio.to_thread(held, server)
        sent_before = metric(server, AUDIO_BYTES)
        await send_json(ws, {"type": "input.cancel"})
        after = await collect(ws, until=is_event("input.cancelled"))
        sent_after = metric(server, AUDIO_BYTES)
        await send_json(ws, {"type": "input.text", "text": "A new answer. "})
        await send_json(ws, {"type": "input.done"})
        rest = await collect(ws)
    finally:
        await ws.close()
    assert rest.close_code == 1000
    items = before.items + after.items + rest.items
    segments, problems = segments_of(items)
    assert problems == []  # no frame of the cut speech after its audio.done
    assert segments[-2].done["cancelled"] and segments[-2].done["total_bytes"] == len(segments[-2].audio)
    assert segments[-1].start["sentence_text"] == "A new answer." and not segments[-1].done["cancelled"]
    frames = [item.data for item in items if item.kind == "audio"]
    assert sent_after - sent_before <= max(len(frame) for frame in frames)  # at most one frame after the cancel
    assert_whole_frames(frames, fmt)
    assert decoded_samples(b"".join(frames), fmt) > 0  # the whole session, the cut included, is one stream
    await asyncio.to_thread(wait_for, lambda: metric(server, "speech_sessions_held") == 0, "no session held")
