"""speech.pipeline limits: the LeadLimiter (on a fake clock) and the Pipeline's look-ahead and
pending-text accounting, driven directly with the recording transport and a held FakeEngine."""

from __future__ import annotations

import asyncio
import types

import pytest

from speech import pipeline as pipeline_module
from speech.engines.fake import FakeEngine
from speech.pipeline import LOOKAHEAD, LeadLimiter, Pipeline
from speech.protocol import SessionConfig

from .conftest import CHUNK_BYTES, other_tasks
from .recorder import Recorder, check_segment_order

FRAME_S = 0.04


async def guard(awaitable):
    """A hang guard only: a regression fails in 5 s instead of hanging the run."""
    return await asyncio.wait_for(awaitable, 5)


class FakeClock:
    """time.monotonic and asyncio.sleep for the limiter: sleeping advances the clock, nothing waits."""

    def __init__(self):
        self.now = 1000.0
        self.slept = []

    def monotonic(self):
        return self.now

    async def sleep(self, seconds):
        assert seconds > 0
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(pipeline_module, "time", types.SimpleNamespace(monotonic=fake.monotonic))
    monkeypatch.setattr(pipeline_module, "asyncio", types.SimpleNamespace(sleep=fake.sleep))
    return fake


async def test_lead_limiter_disabled_never_sleeps(clock):
    limiter = LeadLimiter(0)
    for _ in range(10_000):
        await limiter.spend(FRAME_S)
    assert clock.slept == []


@pytest.mark.parametrize("lead_s", [0.5, 1.0, 20.0])
async def test_lead_limiter_bounds_how_far_ahead_of_real_time(clock, lead_s):
    limiter = LeadLimiter(lead_s)
    start = clock.now
    sent = 0.0
    sent_before_first_sleep = None
    for _ in range(int(3 * lead_s / FRAME_S) + 10):
        await limiter.spend(FRAME_S)
        if clock.slept and sent_before_first_sleep is None:
            sent_before_first_sleep = sent
        sent += FRAME_S  # the frame goes out after spend() returns
        ahead = sent - (clock.now - start)
        assert ahead <= lead_s + FRAME_S + 1e-9
    assert clock.slept  # it did throttle...
    assert sent_before_first_sleep >= lead_s - 1e-9  # ...but only once the lead was used up


async def test_lead_limiter_does_not_throttle_within_the_lead(clock):
    limiter = LeadLimiter(1.0)
    for _ in range(25):  # exactly 1.0 s of audio at once
        await limiter.spend(FRAME_S)
    assert clock.slept == []


async def test_lead_limiter_credit_refills_only_up_to_the_lead(clock):
    limiter = LeadLimiter(1.0)
    clock.now += 100.0  # a long pause (no audio for 100 s) must not bank 100 s of credit
    sent = 0.0
    start = clock.now
    for _ in range(100):
        await limiter.spend(FRAME_S)
        sent += FRAME_S
        assert sent - (clock.now - start) <= 1.0 + FRAME_S + 1e-9
    assert clock.slept


async def test_lead_limiter_real_time_pacing_never_sleeps(clock):
    limiter = LeadLimiter(0.5)
    for _ in range(1000):
        await limiter.spend(FRAME_S)
        clock.now += FRAME_S  # a client reading exactly in real time
    assert clock.slept == []


# -- Pipeline: look-ahead and pending-text accounting -------------------------------------------------

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


def make_pipeline(engine, transport, *, stream=True, max_segment_chars=4096):
    idle = IdleCalls()
    pipeline = Pipeline(
        engine=engine,
        config=SessionConfig(voice="fake", stream_audio=stream),
        transport=transport,
        session_id="speech_ws_" + "0" * 32,
        max_segment_chars=max_segment_chars,
        lead_s=0,
        on_idle=idle,
        on_crash=lambda: pytest.fail("delivery crashed"),
    )
    return pipeline, idle


async def test_lookahead_constant():
    assert LOOKAHEAD == 1  # the contract's "the next segment may be synthesised while the current one is sent"


async def test_queued_chars_count_only_segments_not_started():
    engine = FakeEngine(hold=True)
    t = Recorder()
    pipeline, idle = make_pipeline(engine, t)
    assert not pipeline.busy
    texts = ["One.", "Two two.", "Three three.", "Four.", "Five five five."]
    for text in texts:
        pipeline.enqueue(text)
    # Producers exist for the current segment and one ahead; the rest is pending text.
    assert pipeline.queued_chars == sum(map(len, texts[2:]))
    assert pipeline.total_sentences == 5
    assert pipeline.busy
    await t.event("audio.start", sentence_index=0)
    assert len(engine.requests) == 2
    for k in range(5):
        engine.allow(1)
        await t.until("audio.done")
        assert pipeline.queued_chars == sum(map(len, texts[k + 3:]))
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
    assert await t.event() == {"type": "audio.done", "id": "speech_ws_" + "0" * 32 + "-0", "sentence_index": 0,
                               "total_bytes": CHUNK_BYTES, "error": False, "cancelled": True}
    assert pipeline.queued_chars == 0
    assert pipeline.total_sentences == 1
    assert not pipeline.busy
    assert engine.running == 0
    assert await guard(pipeline.cancel()) == 0  # nothing left
    assert t.pending() == []
    assert other_tasks() == set()


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


# -- the limiter inside a pipeline, on the fake clock ------------------------------------------------

class AsyncioWithFakeSleep:
    """The asyncio module as the pipeline sees it, except that a positive sleep advances the fake
    clock instead of waiting (and still yields once, as a sleep does)."""

    def __init__(self, clock):
        self._clock = clock

    def __getattr__(self, name):
        return getattr(asyncio, name)

    async def sleep(self, seconds):
        if seconds > 0:
            self._clock.slept.append(seconds)
            self._clock.now += seconds
        await asyncio.sleep(0)


@pytest.fixture
def paced(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(pipeline_module, "time", types.SimpleNamespace(monotonic=fake.monotonic))
    monkeypatch.setattr(pipeline_module, "asyncio", AsyncioWithFakeSleep(fake))
    return fake


def paced_pipeline(engine, transport, *, lead_s, stream):
    idle = IdleCalls()
    pipeline = Pipeline(engine=engine, config=SessionConfig(voice="fake", stream_audio=stream), transport=transport,
                        session_id="speech_ws_" + "1" * 32, max_segment_chars=4096, lead_s=lead_s, on_idle=idle,
                        on_crash=lambda: pytest.fail("delivery crashed"))
    return pipeline, idle


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
async def test_pipeline_delivery_is_paced_by_the_lead(paced, stream):
    engine = FakeEngine(chunks=2)  # 0.1 s of audio a segment
    t = Recorder()
    pipeline, idle = paced_pipeline(engine, t, lead_s=0.25, stream=stream)
    for k in range(10):
        pipeline.enqueue(f"Segment {k}.")
    await idle.wait()
    assert len(check_segment_order(t.log)) == 10
    # 1.0 s of audio with 0.25 s of lead: the rest went out at real time (fake clock), never further ahead.
    assert paced.now - 1000.0 == pytest.approx(1.0 - 0.25, abs=0.1 + 1e-9)
    await guard(pipeline.aclose())


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
async def test_cancel_clears_the_lead_debt(paced, stream):
    engine = FakeEngine(chunks=2)  # 0.1 s of audio a segment
    t = Recorder()
    pipeline, idle = paced_pipeline(engine, t, lead_s=0.25, stream=stream)
    for k in range(6):
        pipeline.enqueue(f"Segment {k}.")
    while (await t.next())[1] != {"type": "audio.start", "id": "speech_ws_" + "1" * 32 + "-3", "sentence_index": 3,
                                  "sentence_text": "Segment 3.", "format": "pcm", "sample_rate": 24000}:
        pass  # by segment 3 the lead is used up: delivery is paced
    assert paced.slept
    await guard(pipeline.cancel())  # barge-in: the client drops everything it had buffered
    before = len(paced.slept)
    pipeline.enqueue("The new answer.")
    await idle.wait()
    # The new answer starts at once and may use the whole lead again: no pacing sleep at all.
    assert paced.slept[before:] == []
    await guard(pipeline.aclose())
