"""speech/audio/streaming.py in process: one stream a session for mp3, opus and aac.

Segments of a test signal (a tone with fades, as the engine's segments begin and end quietly) go
through a SessionEncoder; the output must hold whole codec frames, decode as one stream as long as
the segments within one codec frame each, carry each segment's sound where it belongs (no priming in
front, no audio of a cut segment later), and stay one valid stream across a cancel, whether or not the
last bytes handed out reached the client.
"""

from __future__ import annotations

import asyncio
import io
import os
import threading

import av
import numpy as np
import pytest

from speech.audio.codecs import AHEAD_S, encode_file
from speech.audio.streaming import SessionEncoder, StreamedAudio, ogg_crc
from speech.threads import LOWEST_NICE, SYNTHESIS_NICE
from tests.support.streams import CONTAINERS, assert_whole_frames, decoded_samples, ogg_pages

CASES = [("mp3", 24000), ("mp3", 44100), ("mp3", 8000), ("opus", 48000), ("aac", 24000), ("aac", 16000)]


def tone(seconds, rate, freq=220.0):
    t = np.arange(int(seconds * rate)) / rate
    envelope = np.sin(np.pi * t / t[-1])  # silent at both ends, like a trimmed segment with its fades
    return (0.3 * np.sin(2 * np.pi * freq * t) * envelope).astype(np.float32)


def decode(data, fmt):
    with av.open(io.BytesIO(data), format=CONTAINERS[fmt]) as container:
        return np.concatenate([frame.to_ndarray().reshape(-1) for frame in container.decode(audio=0)]).astype(np.float32)


def speak(encoder, segments, rate, piece_s=0.2):
    """Each segment fed in pieces, then its tail; returns every chunk of bytes handed out, in order."""
    out = []
    for samples in segments:
        step = int(rate * piece_s)
        out += [encoder.encode(samples[at : at + step]) for at in range(0, samples.size, step)]
        out.append(encoder.end_segment())
    return [chunk for chunk in out if chunk]


@pytest.mark.parametrize("fmt,rate", CASES)
def test_segments_decode_as_one_stream_within_a_frame_each_with_no_priming_in_front(fmt, rate):
    encoder = SessionEncoder(fmt, rate)
    segments = [tone(0.9, rate), tone(0.37, rate, 330.0), tone(1.3, rate, 440.0)]
    chunks = speak(encoder, segments, rate)
    assert_whole_frames(chunks, fmt)
    decoded = decode(b"".join(chunks), fmt)
    pcm = sum(segment.size for segment in segments)
    assert 0 <= decoded.size - pcm < len(segments) * encoder.frame_size
    # The first segment starts at the stream's first sample: its tone's peak is where the input's is.
    first = segments[0]
    window = slice(first.size // 2 - rate // 100, first.size // 2 + rate // 100)
    assert np.corrcoef(decoded[window], first[window])[0, 1] > 0.9


@pytest.mark.parametrize("fmt,rate", CASES)
def test_each_encode_hands_out_whole_frames_and_the_first_comes_within_a_few_codec_frames(fmt, rate):
    encoder = SessionEncoder(fmt, rate)
    samples = tone(1.0, rate)
    step = int(rate * 0.04)
    fed, first_at = 0, None
    for at in range(0, samples.size, step):
        fed += samples[at : at + step].size
        if encoder.encode(samples[at : at + step]) and first_at is None:
            first_at = fed
    assert first_at is not None and first_at <= 5 * encoder.frame_size + step


@pytest.mark.parametrize("fmt,rate", CASES)
@pytest.mark.parametrize("lost", [False, True])
def test_after_a_cut_the_stream_goes_on_valid_and_holds_nothing_of_the_cut_segment(fmt, rate, lost):
    """A segment cut midway (a cancel): if its last bytes never reached the client (`lost`), they are
    left out; either way the next segment follows in the same stream, and nothing more of the cut one."""
    encoder = SessionEncoder(fmt, rate)
    sent = speak(encoder, [tone(0.5, rate)], rate)
    cut = [encoder.encode(tone(0.6, rate, 330.0)[: int(rate * 0.4)])]
    if lost:
        cut = []  # handed out, never sent
    encoder.cut(lost=lost)
    after = speak(encoder, [tone(0.5, rate, 440.0)], rate)
    frames = [chunk for chunk in sent + cut + after if chunk]
    assert_whole_frames(frames, fmt)
    decoded = decode(b"".join(frames), fmt).size
    whole = 2 * int(0.5 * rate)  # the two segments spoken to their end
    cut_part = 0 if lost else int(0.4 * rate)  # at most what was fed of the cut one, if its bytes went out
    assert whole - encoder.frame_size <= decoded < whole + cut_part + 3 * encoder.frame_size


def test_a_lost_ogg_page_is_numbered_again_so_the_stream_has_no_gap():
    encoder = SessionEncoder("opus", 48000)
    first = speak(encoder, [tone(0.3, 48000)], 48000)
    numbers = [n for chunk in first for n in ogg_pages(chunk)]
    assert encoder.encode(tone(0.5, 48000))  # handed out, then the client never gets it
    encoder.cut(lost=True)
    again = speak(encoder, [tone(0.3, 48000)], 48000)
    assert ogg_pages(again[0])[0] == numbers[-1] + 1


def test_the_ogg_crc_is_the_one_ffmpeg_writes():
    data = encode_file("opus", np.zeros(4800, np.float32), 48000)
    size = 27 + data[26] + sum(data[27 : 27 + data[26]])
    page = data[:size]
    assert ogg_crc(page[:22] + b"\0\0\0\0" + page[26:]) == int.from_bytes(page[22:26], "little")


async def test_a_cut_does_not_wait_for_the_encoding_thread_and_nothing_of_its_work_is_sent():
    """The delivery task is cancelled while a piece is being encoded off the loop (a spare thread may
    wait long for a core): `cut` returns at once, the stream goes on from the last page sent, and what
    the thread makes later is in no page."""
    streamed = StreamedAudio("opus", 48000, 0.04, 2.0)
    first = b""
    async for data, _ in streamed.frames(tone(0.04, 48000)):  # the segment's first bytes, in the loop
        first += data
        streamed.sent()
    assert first
    busy, release, ended = threading.Event(), threading.Event(), threading.Event()
    code = streamed.encoder.code

    def held(samples):
        busy.set()
        release.wait(5)
        ended.set()
        return code(samples)

    streamed.encoder.code = held

    async def rest():
        async for _ in streamed.frames(tone(3.0, 48000)):  # 2 s pieces, on an encoding thread
            pass

    task = asyncio.create_task(rest())
    await asyncio.to_thread(busy.wait, 10)  # the encoding thread has the piece
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await streamed.cut()
    assert not ended.is_set()  # the thread is still at work: cut did not wait for it
    after = b"".join([data async for data, _ in streamed.frames(tone(0.5, 48000))])
    release.set()
    after += (await streamed.end_segment())[0]
    assert ogg_pages(after)[0] == ogg_pages(first)[-1] + 1
    assert 0 < decoded_samples(first + after, "opus") < 48000


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="a thread's own niceness is Linux's")
async def test_a_segment_is_encoded_beside_synthesis_only_until_the_listener_has_audio_enough():
    """The first pieces in the loop (first audio waits for nothing); then, while the listener has less
    than AHEAD_S of audio to play, on a thread beside synthesis at its niceness; then at the lowest
    niceness, on what synthesis leaves free. After a cut the listener has nothing again."""
    streamed = StreamedAudio("mp3", 24000, 0.04, 0.2)
    calls = []
    code, finish = streamed.encoder.code, streamed.encoder.finish

    def where(method):
        def record(*args):
            thread = threading.get_native_id()
            calls.append((thread == loop, os.getpriority(os.PRIO_PROCESS, thread)))
            return method(*args)

        return record

    loop = threading.get_native_id()
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    in_loop, due, spare = (True, nice), (False, min(LOWEST_NICE, nice + SYNTHESIS_NICE)), (False, LOWEST_NICE)
    streamed.encoder.code, streamed.encoder.finish = where(code), where(finish)
    for _ in range(2):
        assert [data async for data, _ in streamed.frames(tone(2.0, 24000))]
        assert await streamed.end_segment()
        # 40 ms pieces in the loop until the first bytes, 200 ms ones beside synthesis until 1 s is ahead
        assert calls == sorted(calls, key=[in_loop, due, spare].index) and {in_loop, due, spare} == set(calls)
        assert calls.count(due) >= (AHEAD_S - 0.2) / 0.2
        await streamed.cut()
        calls.clear()


async def test_seconds_follow_the_audio_each_frame_completes():
    """Each handed-out frame says how much of the fed audio it completes: together, the segment's."""
    streamed = StreamedAudio("mp3", 24000, 0.04, 0.2)
    pieces = [item async for item in streamed.frames(tone(1.0, 24000))]
    pieces.append(await streamed.end_segment())
    assert sum(seconds for _, seconds in pieces) == pytest.approx(1.0)
    assert all(data for data, _ in pieces)
