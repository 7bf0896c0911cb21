"""speech.stream.pipeline limits: look-ahead (after the utterance's first frame), pending-text
accounting and backpressure, driven directly with the recording transport and a FakeEngine."""

from __future__ import annotations

import asyncio

import pytest

from speech.audio.codecs import RawEncoder
from speech.engines.fake import FakeEngine
from speech.stream.frames import FIRST_FRAME_S, FRAME_S, MAX_FRAME_S
from speech.stream.messages import SessionConfig
from speech.stream.pipeline import LOOKAHEAD, Pipeline

from .conftest import CHUNK_BYTES, other_tasks
from .support.recorder import Recorder, check_segment_order


async def guard(awaitable):
    """A hang guard only: a regression fails in 5 s instead of hanging the run."""
    return await asyncio.wait_for(awaitable, 5)


# -- Pipeline: look-ahead and pending-text accounting -------------------------------------------------


async def until(condition):
    """Let the loop run until `condition()` holds (with a hang guard)."""

    async def poll():
        while not condition():
            await asyncio.sleep(0)

    await guard(poll())


class IdleCalls:
    """The pipeline's on_idle callback: counts calls and lets a test await the next one."""

    def __init__(self):
        self.count = 0
        self.event = asyncio.Event()

    def __call__(self):
        self.count += 1
        self.event.set()

    async def wait(self):
        await guard(self.event.wait())
        self.event.clear()


def make_pipeline(engine, transport, *, stream=True, max_segment_chars=4096, fmt="pcm"):
    idle = IdleCalls()
    pipeline = Pipeline(
        engine=engine,
        config=SessionConfig(voice="fake", stream_audio=stream, response_format=fmt),
        transport=transport,
        session_id="speech_ws_" + "0" * 32,
        max_segment_chars=max_segment_chars,
        on_idle=idle,
        on_crash=lambda: pytest.fail("delivery crashed"),
    )
    return pipeline, idle


async def test_lookahead_constant():
    assert LOOKAHEAD == 1  # the contract's "the next segment may be synthesised while the current one is sent"


class RecordedStream:
    """An engine stream that tells its engine when it is closed."""

    def __init__(self, engine, text, chunks):
        self.engine, self.text, self.chunks = engine, text, chunks

    def __aiter__(self):
        return self

    def __anext__(self):
        return self.chunks.__anext__()

    async def aclose(self):
        self.engine.closed.append(self.text)
        await self.chunks.aclose()


class StartedStreams(FakeEngine):
    """A FakeEngine that records, in the call itself, each stream asked of it, and each one closed."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.started = []
        self.closed = []

    def stream(self, request):
        self.started.append(request.text)
        return RecordedStream(self, request.text, super().stream(request))


async def test_the_current_segments_engine_stream_starts_in_the_step_that_queues_its_text():
    """An engine that queues work when asked (Hibari) then has the segment's first job in its queue before
    the loop goes on to other sessions' messages, not when it reaches this segment's producer task."""
    engine = StartedStreams()
    pipeline, idle = make_pipeline(engine, Recorder())
    pipeline.enqueue("First.")
    pipeline.enqueue("Second.")
    assert engine.started == ["First."]  # no await yet: the look-ahead waits for the first frame
    await idle.wait()
    assert engine.started == ["First.", "Second."]
    assert engine.closed == ["First.", "Second."]


async def test_a_stream_started_for_a_segment_cancelled_before_its_producer_ran_is_closed():
    engine = StartedStreams(hold=True)
    pipeline, _ = make_pipeline(engine, Recorder())
    pipeline.enqueue("Never heard.")
    assert await pipeline.cancel() == 1  # awaited in this task, so in the same step: the producer never ran
    assert engine.started == engine.closed == ["Never heard."]


async def test_text_over_the_segment_limit_starts_no_engine_stream():
    engine = StartedStreams()
    t = Recorder()
    pipeline, idle = make_pipeline(engine, t, max_segment_chars=5)
    pipeline.enqueue("Far too long.")
    await idle.wait()
    assert engine.started == []
    assert [value["type"] for kind, value in t.log if kind == "json"] == ["error", "audio.done"]


async def test_queued_chars_count_only_segments_not_started():
    engine = FakeEngine(hold=True)
    t = Recorder()
    pipeline, idle = make_pipeline(engine, t)
    assert not pipeline.busy
    texts = ["One.", "Two two.", "Three three.", "Four.", "Five five five."]
    for text in texts:
        pipeline.enqueue(text)
    # A producer exists for the current segment; the rest is pending text until it has audio.
    assert pipeline.queued_chars == sum(map(len, texts[1:]))
    assert pipeline.total_sentences == 5
    assert pipeline.busy
    await t.event("audio.start", sentence_index=0)
    await t.binary()
    # The current segment's first frame is out: the one ahead is being synthesised too.
    await until(lambda: len(engine.requests) == 2)
    assert pipeline.queued_chars == sum(map(len, texts[2:]))
    for k in range(5):
        engine.allow(1)
        await t.until("audio.done")
        assert pipeline.queued_chars == sum(map(len, texts[k + 3 :]))
    await idle.wait()
    assert idle.count == 1
    assert not pipeline.busy
    assert pipeline.queued_chars == 0 and pipeline.total_sentences == 5
    assert len(check_segment_order(t.log)) == 5
    await guard(pipeline.aclose())
    assert other_tasks() == set()
    assert engine.running == 0


async def test_cancel_resets_the_accounting_and_counts_undelivered_segments():
    engine = FakeEngine(chunks=3, hold=True)
    t = Recorder()
    pipeline, idle = make_pipeline(engine, t)
    for text in ["A one.", "B two.", "C three.", "D four."]:
        pipeline.enqueue(text)
    await t.event("audio.start", sentence_index=0)
    await t.binary()
    await t.binary()
    assert await guard(pipeline.cancel()) == 4
    assert await t.event() == {
        "type": "audio.done",
        "id": "speech_ws_" + "0" * 32 + "-0",
        "sentence_index": 0,
        "total_bytes": CHUNK_BYTES,
        "error": False,
        "cancelled": True,
    }
    assert pipeline.queued_chars == 0
    assert pipeline.total_sentences == 1
    assert not pipeline.busy
    assert engine.running == 0
    assert await guard(pipeline.cancel()) == 0  # nothing left
    assert t.pending() == []
    assert other_tasks() == set()


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
async def test_a_cancel_before_the_first_audio_starts_no_synthesis_behind_its_back(stream):
    """Regression: the producer that a cancel stops marks its segment started on the way out, which
    started the next segment's synthesis as the segments were being dropped: engine work for nobody."""
    engine = FakeEngine(delay_s=60.0)  # the first chunk never comes before the cancel
    t = Recorder()
    pipeline, idle = make_pipeline(engine, t, stream=stream)
    pipeline.enqueue("A one.")
    pipeline.enqueue("B two.")
    await until(lambda: engine.running == 1)
    assert await guard(pipeline.cancel()) == 2
    assert [request.text for request in engine.requests] == ["A one."]
    assert engine.running == 0 and not pipeline.busy
    assert other_tasks() == set()
    assert t.pending() == []


async def test_pipeline_restarts_after_going_idle():
    engine = FakeEngine()
    t = Recorder()
    pipeline, idle = make_pipeline(engine, t)
    pipeline.enqueue("First.")
    await t.until("audio.done")
    await idle.wait()
    pipeline.enqueue("Second.")  # a new delivery task must pick this up
    start = await t.event("audio.start")
    assert start["sentence_index"] == 1 and start["sentence_text"] == "Second."
    await t.until("audio.done")
    await idle.wait()
    assert idle.count == 2
    await guard(pipeline.aclose())
    assert other_tasks() == set()


# -- first audio first: the look-ahead waits for the current segment's first frame ---------------------


class GatedEngine(FakeEngine):
    """A FakeEngine whose every segment waits at its start until the test opens its gate."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.gates = {}

    def gate(self, text):
        return self.gates.setdefault(text, asyncio.Event())

    async def stream(self, request):
        await self.gate(request.text).wait()
        async for chunk in super().stream(request):
            yield chunk


def gated_pipeline(*texts, fmt="pcm"):
    engine, t = GatedEngine(), Recorder()
    pipeline, idle = make_pipeline(engine, t, fmt=fmt)
    for text in texts:
        pipeline.enqueue(text)
    return engine, t, pipeline, idle


async def test_a_segments_first_frame_goes_out_before_the_rest_of_its_chunk_is_encoded(monkeypatch):
    log = []
    encode = RawEncoder.encode

    def encoding(encoder, samples):
        log.append(("encode", samples.size))
        return encode(encoder, samples)

    monkeypatch.setattr(RawEncoder, "encode", encoding)
    engine, t = FakeEngine(chunk_s=0.5, chunks=2), Recorder()
    send_bytes = t.send_bytes

    async def sending(data):
        log.append(("send", len(data) // 2))
        await send_bytes(data)

    t.send_bytes = sending
    pipeline, idle = make_pipeline(engine, t)
    pipeline.enqueue("One.")
    await idle.wait()
    head, chunk = int(24000 * FIRST_FRAME_S), engine.chunk_samples
    assert log[:3] == [("encode", head), ("send", head), ("encode", chunk - head)]
    # The frames are the same as without the split: 40 ms, then FRAME_S from there.
    frames = [size for what, size in log if what == "send"]
    assert frames[0] == head and sum(frames) == 2 * chunk and max(frames) == int(24000 * FRAME_S)
    await guard(pipeline.aclose())


class Room(Recorder):
    """A connection whose window takes `room` bytes at once and closes by what each frame sends, the way a
    client that has stopped reading leaves it: send_room() is what is left."""

    def __init__(self, room):
        super().__init__()
        self.room = room
        self.asked = 0  # send_room() calls

    def send_room(self):
        self.asked += 1
        return super().send_room()

    async def send_bytes(self, data):
        await super().send_bytes(data)
        self.room = max(0, self.room - len(data))


def frame_ms(transport):
    ((_, frames, _),) = check_segment_order(transport.log).values()
    return [len(frame) * 1000 // 48000 for frame in frames]  # 24 kHz, 2 bytes a sample


@pytest.mark.parametrize(
    "room, expected",
    [
        (0, [40] + [200] * 14 + [160]),  # nothing known: 200 ms frames
        (9600, [40] + [200] * 14 + [160]),  # no more than a 200 ms frame at once: 200 ms frames
        (10_000_000, [40] + [1000] * 2 + [960]),  # a window wider than 1 s: 1 s frames
        # The window shrinks by each frame: frames as large as it allows, then 200 ms ones.
        (1920 + 30_000, [40, 30_000 * 1000 // 48000] + [200] * 11 + [135]),
    ],
)
async def test_frames_after_the_first_hold_what_the_connection_sends_at_once_up_to_one_second(room, expected):
    engine, t = FakeEngine(chunk_s=3.0, chunks=1), Room(room)
    pipeline, idle = make_pipeline(engine, t)
    pipeline.enqueue("A long one.")
    await idle.wait()
    assert frame_ms(t) == expected
    assert MAX_FRAME_S == 1.0 and FRAME_S == 0.2
    await guard(pipeline.aclose())


async def test_the_room_is_not_asked_for_a_rest_that_one_200_ms_frame_holds():
    engine, t = FakeEngine(chunk_s=FIRST_FRAME_S + FRAME_S, chunks=1), Room(10_000_000)
    pipeline, idle = make_pipeline(engine, t)
    pipeline.enqueue("Short.")
    await idle.wait()
    assert frame_ms(t) == [40, 200] and t.asked == 0
    await guard(pipeline.aclose())


async def test_frames_hold_whole_samples_whatever_the_room():
    engine, t = FakeEngine(chunk_s=1.0, chunks=1), Room(1920 + 20_001)  # an odd number of bytes after the first frame
    pipeline, idle = make_pipeline(engine, t)
    pipeline.enqueue("One.")
    await idle.wait()
    ((_, frames, _),) = check_segment_order(t.log).values()
    assert [len(frame) for frame in frames] == [1920, 20_000, 9600, 9600, 48_000 - 1920 - 20_000 - 2 * 9600]
    await guard(pipeline.aclose())


@pytest.mark.parametrize("fmt", ["pcm", "mp3"])  # streamed mp3: its first frame is its first MP3 frames
async def test_lookahead_starts_only_after_the_current_segment_sent_its_first_frame(fmt):
    engine, t, pipeline, idle = gated_pipeline("One.", "Two.", "Three.", fmt=fmt)
    await asyncio.sleep(0)
    assert [job.producer is not None for job in pipeline.jobs] == [True, False, False]
    assert [job.ticket.current for job in pipeline.jobs] == [True, False, False]
    t.writable.clear()  # the client is not reading: the first frame waits
    engine.gate("One.").set()
    await t.event("audio.start", sentence_index=0)
    await until(lambda: t.held_sends == 1)
    # The current segment has audio, but its first frame is not out: the next one still waits (its
    # synthesis would compete with the sending of that frame).
    assert [job.producer is not None for job in pipeline.jobs] == [True, False, False]
    one, two, three = pipeline.jobs
    t.writable.set()
    await t.binary()
    # The first frame is out: now (and only now) the next one may be synthesised. (Once "One." is
    # sent, "Two." is current and "Three." may start beside it: test_once_audio_flows_...)
    await until(lambda: two.producer is not None)
    await t.until("audio.done")
    # Segment 1 is now the one being delivered: its queued work moves to the front of the engine's queue.
    assert pipeline.jobs[0].text == "Two." and pipeline.jobs[0].ticket.current
    engine.gate("Two.").set()
    engine.gate("Three.").set()
    await idle.wait()
    assert [r.text for r in engine.requests] == ["One.", "Two.", "Three."]
    assert len(check_segment_order(t.log)) == 3
    await guard(pipeline.aclose())
    assert other_tasks() == set()


async def test_once_audio_flows_the_lookahead_starts_with_the_current_segment():
    engine, t, pipeline, idle = gated_pipeline("One.", "Two.", "Three.")
    engine.gate("One.").set()
    await t.until("audio.done")
    # "Two." is current and still synthesising (its gate is shut), and the client has had audio:
    # "Three." is synthesised beside it instead of after its first frame.
    two, three = pipeline.jobs
    assert two.ticket.current and not two.started
    await until(lambda: three.producer is not None)
    engine.gate("Two.").set()
    engine.gate("Three.").set()
    await idle.wait()
    # A new utterance after the delivery ran dry: its first audio goes first again.
    for text in ["Four.", "Five."]:
        pipeline.enqueue(text)
    await asyncio.sleep(0)
    four, five = pipeline.jobs
    assert four.producer is not None and five.producer is None
    engine.gate("Four.").set()
    engine.gate("Five.").set()
    await idle.wait()
    assert len(check_segment_order(t.log)) == 5
    await guard(pipeline.aclose())
    assert other_tasks() == set()


async def test_a_segment_that_fails_before_audio_still_lets_the_next_one_start():
    engine = FakeEngine(fail_on="FAIL")
    t = Recorder()
    pipeline, idle = make_pipeline(engine, t)
    pipeline.enqueue("FAIL now.")
    pipeline.enqueue("Fine.")
    await idle.wait()
    assert [r.text for r in engine.requests] == ["FAIL now.", "Fine."]
    await guard(pipeline.aclose())


# -- backpressure: a client that stops reading holds delivery and synthesis ---------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
async def test_a_client_that_stops_reading_holds_delivery_and_synthesis(stream):
    engine = FakeEngine(chunks=3)
    t = Recorder()
    t.writable.clear()
    pipeline, idle = make_pipeline(engine, t, stream=stream)
    for k in range(10):
        pipeline.enqueue(f"Segment {k}.")
    # Held: nothing beyond the look-ahead is synthesised, and nothing more is sent or queued. Streamed,
    # the look-ahead itself waits for the current segment's first frame, which waits for the client.
    synthesised = 1 if stream else 1 + LOOKAHEAD
    await t.event("audio.start", sentence_index=0)
    await until(lambda: len(engine.requests) == synthesised and not engine.running and t.held_sends == 1)
    for _ in range(50):  # loop turns (the fake engine needs none to make a segment): a wrong start would show
        await asyncio.sleep(0)
    assert [r.text for r in engine.requests] == [f"Segment {k}." for k in range(synthesised)]
    assert pipeline.queued_chars == sum(len(f"Segment {k}.") for k in range(synthesised, 10))
    assert t.pending() == []
    t.writable.set()  # the client reads again: everything is delivered, in order
    await idle.wait()
    assert len(check_segment_order(t.log)) == 10
    assert len(engine.requests) == 10
    await guard(pipeline.aclose())
    assert other_tasks() == set()


async def test_cancel_while_the_client_is_not_reading_stops_the_segment():
    engine = FakeEngine(chunks=3)
    t = Recorder()
    t.writable.clear()  # the client is not reading: the first frame waits
    pipeline, idle = make_pipeline(engine, t)
    for k in range(4):
        pipeline.enqueue(f"Segment {k}.")
    await t.event("audio.start", sentence_index=0)
    await until(lambda: t.held_sends == 1)
    assert await guard(pipeline.cancel()) == 4
    assert await t.event("audio.done", sentence_index=0, cancelled=True, error=False, total_bytes=0)
    t.writable.set()
    assert t.pending() == []  # the held frame was never sent
    assert engine.running == 0
    assert other_tasks() == set()


# -- what a client playing at real time may still have to read -------------------------------------


async def test_audio_ahead_is_what_was_sent_less_what_real_time_has_played():
    engine = FakeEngine(chunk_s=1.0, chunks=3)
    pipeline, idle = make_pipeline(engine, Recorder())
    assert pipeline.audio_ahead_s() == 0.0  # nothing sent yet
    started = asyncio.get_running_loop().time()
    pipeline.enqueue("Three seconds of audio, made at once.")
    await idle.wait()
    elapsed = asyncio.get_running_loop().time() - started
    ahead = pipeline.audio_ahead_s()
    assert 3.0 - elapsed <= ahead <= 3.0


class Clock:
    """The pipeline module's `time`, set by the test (the event loop keeps the real one)."""

    def __init__(self, now):
        self.now = now

    def monotonic(self):
        return self.now


async def test_audio_ahead_counts_from_after_a_pause_not_from_the_first_frame(monkeypatch):
    from speech.stream import pipeline as module

    clock = Clock(100.0)
    monkeypatch.setattr(module, "time", clock)
    pipeline, idle = make_pipeline(FakeEngine(chunk_s=1.0, chunks=1), Recorder())
    pipeline.enqueue("One second, then a long pause.")
    await idle.wait()
    assert pipeline.audio_ahead_s() == pytest.approx(1.0)
    clock.now = 200.0  # played long ago
    assert pipeline.audio_ahead_s() == 0.0
    pipeline.enqueue("Another second.")
    await idle.wait()
    clock.now = 200.25
    assert pipeline.audio_ahead_s() == pytest.approx(0.75)


async def test_the_segment_being_delivered_is_due_when_its_client_runs_out_of_audio(monkeypatch):
    """Its ticket's deadline orders the engine's queue (speech/engines/pool.py): a segment is due when
    the client will have played the audio sent before it, or when its text came if that is later, and
    every frame sent of it pushes its further jobs back by the frame's length."""
    from speech.stream import job, pipeline

    clock = Clock(100.0)
    monkeypatch.setattr(pipeline, "time", clock)
    monkeypatch.setattr(job, "time", clock)
    engine, t = GatedEngine(chunk_s=1.0, chunks=2), Recorder()
    pipeline, idle = make_pipeline(engine, t)
    pipeline.enqueue("One.")
    pipeline.enqueue("Two.")
    one, two = pipeline.jobs
    assert (one.ticket.current, one.ticket.deadline) == (True, 100.0)  # the first audio: due when its text came
    assert (two.ticket.current, two.ticket.deadline) == (False, None)  # look-ahead: behind every current segment
    clock.now = 100.5
    engine.gate("One.").set()
    await until(lambda: two.ticket.current)
    assert one.ticket.deadline == pytest.approx(102.5)  # 2 s of audio sent at 100.5
    assert two.ticket.deadline == pytest.approx(102.5)
    clock.now = 101.0
    engine.gate("Two.").set()
    await idle.wait()
    assert two.ticket.deadline == pytest.approx(104.5)
    clock.now = 200.0  # all played long ago: new text is due when it comes
    pipeline.enqueue("Three.")
    (three,) = pipeline.jobs
    assert three.ticket.deadline == 200.0
    engine.gate("Three.").set()
    await idle.wait()
    await guard(pipeline.aclose())
