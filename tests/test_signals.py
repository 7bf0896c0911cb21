"""Control signals in-process: the buses (speech/signals.py) and a session's `handle_signal`.

* LocalBus: delivery to the registered session only, on the registering loop, from any thread.
* RedisBus against the machine's real Redis (DB 7; pub/sub channels are global to a Redis server,
  every test uses fresh session ids so nothing else can collide with them): subscribe, publish from
  a thread, unregister, an unreachable Redis. Garbage on the channel goes to a private
  `redis-server` instead: every listener on a Redis server receives every `speech:signal:*`
  message, and a malformed one used to kill listeners -- other people's servers on the shared
  Redis must not get it.
* SpeechSession.handle_signal with FakeEngine(hold=True) (the `speech` fixture): cancel mid-segment,
  cancel when idle or stale, terminate, and the session's outcome for the registry.

Ordering proofs instead of sleeps: a second message on the same Redis connection (pub/sub delivers
in order) or the session's barrier (input.commit -> input.committed) shows that nothing else came
first. Timeouts are hang guards only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid

import pytest
import redis

from speech import signals
from speech.engines.fake import FakeEngine
from speech.session import OUTCOME_CANCELLED, OUTCOME_COMPLETED, OUTCOME_FAILED, OUTCOME_TERMINATED, TERMINATED_MESSAGE

from .conftest import CHUNK_BYTES, limits, other_tasks
from .recorder import HANG_GUARD_S
from .test_redis_faults import RedisServer

REDIS_URL = "redis://127.0.0.1:6379/7"
UNREACHABLE_URL = "redis://127.0.0.1:1"


def new_id():
    return f"speech_ws_{uuid.uuid4().hex}"


class Inbox:
    """A handler that records (message, thread id) and lets a test await the next delivery."""

    def __init__(self):
        self.messages = []
        self.threads = []
        self.queue = asyncio.Queue()

    def __call__(self, message):
        self.messages.append(message)
        self.threads.append(threading.get_ident())
        self.queue.put_nowait(message)

    async def next(self):
        return await asyncio.wait_for(self.queue.get(), HANG_GUARD_S)


# -- LocalBus ------------------------------------------------------------------------------------------

async def test_local_bus_delivers_to_the_registered_session_only():
    bus = signals.LocalBus()
    first, second = Inbox(), Inbox()
    a, b = new_id(), new_id()
    await bus.subscribe(a, first)
    bus.register(b, second)
    message = signals.signal(signals.CANCEL, a)
    bus.publish(message)
    assert await first.next() == message
    # A signal for a session nobody holds goes nowhere and raises nothing.
    bus.publish(signals.signal(signals.TERMINATE, new_id()))
    bus.publish(signals.signal(signals.TERMINATE, b))
    assert (await second.next())["kind"] == "terminate"
    assert first.messages == [message] and len(second.messages) == 1


async def test_local_bus_publish_from_another_thread_runs_the_handler_on_the_loop():
    bus = signals.LocalBus()
    inbox = Inbox()
    sid = new_id()
    bus.register(sid, inbox)
    message = signals.signal(signals.CANCEL, sid, "operator")
    publisher = []
    await asyncio.to_thread(lambda: (publisher.append(threading.get_ident()), bus.publish(message)))
    assert await inbox.next() == message
    assert inbox.threads == [threading.get_ident()] != publisher


async def test_local_bus_unregister_stops_delivery():
    bus = signals.LocalBus()
    gone, kept = Inbox(), Inbox()
    a, b = new_id(), new_id()
    bus.register(a, gone)
    bus.register(b, kept)
    bus.unregister(a)
    bus.unregister(new_id())  # unknown: no error
    await asyncio.to_thread(bus.publish, signals.signal(signals.CANCEL, a))
    await asyncio.to_thread(bus.publish, signals.signal(signals.CANCEL, b))
    # call_soon_threadsafe keeps the order: once b's handler ran, a's would have run before it.
    assert (await kept.next())["session_id"] == b
    assert gone.messages == []


def test_signal_message_shape():
    before = time.time()
    message = signals.signal(signals.TERMINATE, "speech_ws_x", "why")
    assert message["kind"] == "terminate" and message["session_id"] == "speech_ws_x" and message["reason"] == "why"
    assert before <= message["issued_at"] <= time.time()
    assert json.loads(json.dumps(message)) == message


# -- RedisBus (real Redis) -----------------------------------------------------------------------------

async def bus_on(url):
    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:  # Redis is part of the test environment
        pytest.fail(f"Redis at {url} is not reachable: {exc}")
    return signals.RedisBus(url)


async def stop_bus(bus):
    await bus.stop()
    bus._publisher.close()
    assert not [t for t in other_tasks() if t.get_name() == "speech-signal-listener"], "listener left running"


@pytest.fixture
async def redis_bus():
    """A RedisBus on the machine's Redis."""
    bus = await bus_on(REDIS_URL)
    yield bus
    await stop_bus(bus)


@pytest.fixture(scope="module")
def private_redis():
    with RedisServer() as server:
        yield server


@pytest.fixture
async def private_bus(private_redis):
    """A RedisBus on a private redis-server: for messages nobody else may receive."""
    bus = await bus_on(private_redis.url(7))
    bus.raw = private_redis.client()
    yield bus
    bus.raw.close()
    await stop_bus(bus)


async def subscribed(bus, session_id, handler):
    """subscribe, and (hang guard) make sure this loop's listener holds its pattern subscription."""
    await bus.subscribe(session_id, handler, wait_s=HANG_GUARD_S)
    assert bus.listening(), "the listener did not subscribe within the hang guard"


async def test_redis_bus_delivers_a_message_published_from_a_thread(redis_bus):
    inbox = Inbox()
    sid = new_id()
    await subscribed(redis_bus, sid, inbox)
    message = signals.signal(signals.TERMINATE, sid, "voice removed")
    await asyncio.to_thread(redis_bus.publish, message)
    assert await inbox.next() == message
    assert inbox.threads == [threading.get_ident()]


async def test_redis_bus_cross_bus_delivery_and_only_to_the_target(redis_bus):
    """Two buses (two 'instances'): what one publishes reaches the session the other holds, nothing else."""
    other = signals.RedisBus(REDIS_URL)
    try:
        mine, theirs = Inbox(), Inbox()
        a, b = new_id(), new_id()
        await subscribed(redis_bus, a, mine)
        await subscribed(other, b, theirs)
        message = signals.signal(signals.CANCEL, b)
        await asyncio.to_thread(redis_bus.publish, message)
        assert await theirs.next() == message
        marker = signals.signal(signals.CANCEL, a)
        await asyncio.to_thread(other.publish, marker)
        assert await mine.next() == marker
        assert mine.messages == [marker] and theirs.messages == [message]
    finally:
        await other.stop()
        other._publisher.close()


async def test_redis_bus_unregister_stops_delivery(redis_bus):
    gone, kept = Inbox(), Inbox()
    a, b = new_id(), new_id()
    await subscribed(redis_bus, a, gone)
    await subscribed(redis_bus, b, kept)
    redis_bus.unregister(a)
    await asyncio.to_thread(redis_bus.publish, signals.signal(signals.CANCEL, a))
    await asyncio.to_thread(redis_bus.publish, signals.signal(signals.CANCEL, b))
    # One pattern subscription, one connection: messages arrive in publish order.
    assert (await kept.next())["session_id"] == b
    assert gone.messages == []


async def test_redis_bus_ignores_garbage_on_the_channel(private_bus, caplog):
    inbox = Inbox()
    sid = new_id()
    await subscribed(private_bus, sid, inbox)
    channel = signals.CHANNEL_PREFIX + sid
    with caplog.at_level(logging.WARNING, logger="speech.signals"):
        for garbage in (b"not json at all", b"\xff\xfe\x00", b"[1, 2, 3]", b"42", b'"a string"', b"{}",
                        json.dumps({"kind": "cancel", "session_id": new_id()}).encode()):
            await asyncio.to_thread(private_bus.raw.publish, channel, garbage)
        message = signals.signal(signals.CANCEL, sid)
        await asyncio.to_thread(private_bus.raw.publish, channel, json.dumps(message))
        # Same connection, publish order: everything before the real message was handled by now.
        assert await inbox.next() == message
    assert inbox.messages == [message]
    assert private_bus.listening()
    assert "ignored a message that is not JSON" in caplog.text


async def listener_survives(bus, poison):
    """Publish `poison` then a real signal on one channel: the listener must live and deliver the signal."""
    inbox = Inbox()
    sid = new_id()
    await subscribed(bus, sid, inbox)
    channel = signals.CHANNEL_PREFIX + sid
    listener = next(t for t in other_tasks() if t.get_name() == "speech-signal-listener")
    await asyncio.to_thread(bus.raw.publish, channel, poison)
    message = signals.signal(signals.CANCEL, sid)
    await asyncio.to_thread(bus.raw.publish, channel, json.dumps(message))
    delivered = asyncio.ensure_future(inbox.queue.get())
    await asyncio.wait([delivered, listener], timeout=HANG_GUARD_S, return_when=asyncio.FIRST_COMPLETED)
    if not delivered.done():
        delivered.cancel()
    assert not listener.done(), f"the signal listener died: {listener.exception()!r}"
    assert delivered.result() == message


@pytest.mark.parametrize("session_id", [["x"], {"a": 1}, 5, None], ids=["list", "object", "number", "null"])
async def test_redis_bus_survives_json_with_a_session_id_that_is_not_a_string(private_bus, session_id):
    """(Failed before speech/signals.py checked the type: a list or object killed the listener.)"""
    await listener_survives(private_bus, json.dumps({"kind": "cancel", "session_id": session_id}))


async def test_redis_bus_survives_deeply_nested_json(private_bus):
    """(Failed before speech/signals.py caught RecursionError from json.loads: the listener died.)"""
    await listener_survives(private_bus, b"[" * 200000 + b"]" * 200000)


def test_redis_bus_publish_to_unreachable_redis_raises_signals_unavailable():
    bus = signals.RedisBus(UNREACHABLE_URL)
    outcome = {}

    def attempt():
        try:
            bus.publish(signals.signal(signals.CANCEL, new_id()))
        except Exception as exc:  # noqa: BLE001 - recorded and checked below
            outcome["error"] = exc

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(HANG_GUARD_S)  # hang guard: "quickly" means it does not hang on the dead address
    assert not worker.is_alive(), "publish to an unreachable Redis hung"
    assert isinstance(outcome.get("error"), signals.SignalsUnavailable), outcome
    assert "signals are unavailable" in str(outcome["error"])


async def test_redis_bus_subscribe_with_redis_unreachable_does_not_block_the_session():
    """The session goes on without signals: subscribe returns after its short wait, the listener retries."""
    bus = signals.RedisBus(UNREACHABLE_URL)
    inbox = Inbox()
    try:
        await asyncio.wait_for(bus.subscribe(new_id(), inbox, wait_s=0.05), HANG_GUARD_S)
        assert not bus.listening()
        listeners = [t for t in other_tasks() if t.get_name() == "speech-signal-listener"]
        assert len(listeners) == 1 and not listeners[0].done()
    finally:
        await bus.stop()
    assert not [t for t in other_tasks() if t.get_name() == "speech-signal-listener"]


# -- the session's side: handle_signal --------------------------------------------------------------------

def audio_done(session_id, index, total_bytes, *, cancelled=False):
    return {"type": "audio.done", "id": f"{session_id}-{index}", "sentence_index": index,
            "total_bytes": total_bytes, "error": False, "cancelled": cancelled}


async def speaking(speech, text="First one. Second one. Third one. "):
    """A streaming session whose segment 0 has sent its first chunk (two frames); the rest is held."""
    engine = FakeEngine(chunks=3, hold=True)
    s = await speech(engine, stream_audio=True)
    await s.text(text)
    await s.t.event("audio.start", sentence_index=0)
    sent = len(await s.t.binary()) + len(await s.t.binary())
    assert sent == CHUNK_BYTES
    await s.barrier()
    return s, engine, s.configured["session_id"], sent


async def test_server_cancel_mid_segment(speech):
    s, engine, sid, sent = await speaking(speech)
    assert engine.running == 2  # segment 0 and its look-ahead
    await s.session.handle_signal(signals.signal(signals.CANCEL, sid))
    assert await s.t.event() == audio_done(sid, 0, sent, cancelled=True)
    assert await s.t.event() == {"type": "input.cancelled", "session_id": sid, "cancelled_sentences": 3,
                                 "total_sentences": 1, "origin": "server"}
    await s.barrier()  # nothing else: queued segments dropped without events
    assert engine.running == 0 and engine.aborted == 2
    # The session goes on: new text takes the next free index.
    await s.text("Next one. ")
    await s.t.event("audio.start", sentence_index=1, id=f"{sid}-1", sentence_text="Next one.")
    engine.allow(2)
    await s.send({"type": "input.done"})
    items = await s.t.until_closed()
    assert items[-3][1] == audio_done(sid, 1, 3 * CHUNK_BYTES)
    assert items[-2][1] == {"type": "session.done", "session_id": sid, "total_sentences": 2}
    assert items[-1] == ("close", 1000)
    assert s.session.outcome == OUTCOME_COMPLETED
    await s.finish()


async def test_server_cancel_through_a_local_bus_published_from_a_thread(speech):
    """The consumer's wiring, without Channels: bus handler -> task -> handle_signal."""
    s, engine, sid, sent = await speaking(speech)
    bus = signals.LocalBus()
    tasks = set()
    bus.register(sid, lambda m: tasks.add(asyncio.create_task(s.session.handle_signal(m))))
    bus.register(new_id(), lambda m: pytest.fail("delivered to the wrong session"))
    await asyncio.to_thread(bus.publish, signals.signal(signals.CANCEL, sid))
    assert await s.t.event() == audio_done(sid, 0, sent, cancelled=True)
    assert (await s.t.event("input.cancelled"))["origin"] == "server"
    await asyncio.gather(*tasks)
    await s.barrier()
    await s.finish()


async def test_server_cancel_when_idle_does_nothing(speech):
    engine = FakeEngine(chunks=1)
    s = await speech(engine, stream_audio=True)
    sid = s.configured["session_id"]
    await s.session.handle_signal(signals.signal(signals.CANCEL, sid))  # nothing ever spoken
    await s.barrier()
    await s.text("Only one. ")
    await s.t.until("audio.done")
    await s.session.handle_signal(signals.signal(signals.CANCEL, sid))  # spoken and finished
    await s.barrier()
    await s.text("Again. ")
    done = (await s.t.until("audio.done"))[-1][1]
    assert done["sentence_index"] == 1 and done["cancelled"] is False
    await s.finish()


async def test_server_cancel_issued_before_the_current_speech_is_ignored(speech):
    engine = FakeEngine(chunks=3, hold=True)
    s = await speech(engine, stream_audio=True)
    sid = s.configured["session_id"]
    await s.text("First. ")
    await s.t.event("audio.start", sentence_index=0)
    stale = signals.signal(signals.CANCEL, sid)  # meant for utterance 0
    engine.allow(2)
    await s.t.until("audio.done")
    # Utterance 1 begins after the signal was issued: the late signal must not cut it.
    await s.text("Second. ")
    await s.t.event("audio.start", sentence_index=1)
    await s.t.binary()
    await s.t.binary()  # the first chunk is two frames; the rest is held
    await s.session.handle_signal(stale)
    await s.barrier()
    older = dict(signals.signal(signals.CANCEL, sid), issued_at=stale["issued_at"] - 3600)
    await s.session.handle_signal(older)
    await s.barrier()
    engine.allow(2)
    items = await s.t.until("audio.done")
    assert items[-1][1] == audio_done(sid, 1, 3 * CHUNK_BYTES)
    # A fresh signal for the speech under way still works.
    await s.text("Third. ")
    await s.t.event("audio.start", sentence_index=2)
    await s.t.binary()
    await s.t.binary()
    await s.barrier()
    await s.session.handle_signal(signals.signal(signals.CANCEL, sid))
    done = (await s.t.until("audio.done"))[-1][1]
    assert done["sentence_index"] == 2 and done["cancelled"] is True
    assert (await s.t.event("input.cancelled"))["origin"] == "server"
    await s.finish()


async def test_late_cancel_does_not_clear_new_buffered_text(speech):
    """(Failed while only a complete segment started a new utterance: text still buffered counted as
    part of the finished one, and a late cancel cleared it.)"""
    engine = FakeEngine(chunks=1)
    s = await speech(engine, stream_audio=True)
    sid = s.configured["session_id"]
    await s.text("First. ")
    await s.t.event("audio.start", sentence_index=0)
    stale = signals.signal(signals.CANCEL, sid)  # meant for utterance 0, delivered late
    await s.t.until("audio.done")
    await s.text("The next answer is still stream")  # utterance 1 starts: buffered, no segment yet
    await s.session.handle_signal(stale)
    await s.send({"type": "input.commit"})
    items = await s.t.until("input.committed")
    assert [v.get("type") for k, v in items] == ["input.committed"], items
    assert items[-1][1]["segment_sentences"] == 1
    await s.t.event("audio.start", sentence_text="The next answer is still stream")
    await s.finish()


@pytest.mark.parametrize("issued_at", [None, "2026-01-01"], ids=["null", "string"])
async def test_malformed_issued_at_does_not_raise(speech, issued_at):
    """(Raised TypeError before speech/session.py checked the type.) Ignored: nothing is cut."""
    s, engine, sid, sent = await speaking(speech)
    await s.session.handle_signal({"kind": "cancel", "session_id": sid, "issued_at": issued_at})
    await s.barrier()
    await s.finish()


async def test_server_cancel_after_input_done_ends_the_session_normally(speech):
    """While draining: the cut segment, input.cancelled (server), then session.done and 1000."""
    s, engine, sid, sent = await speaking(speech)
    await s.send({"type": "input.done"})
    await s.session.handle_signal(signals.signal(signals.CANCEL, sid))
    assert await s.t.event() == audio_done(sid, 0, sent, cancelled=True)
    assert await s.t.event() == {"type": "input.cancelled", "session_id": sid, "cancelled_sentences": 3,
                                 "total_sentences": 1, "origin": "server"}
    assert await s.t.event() == {"type": "session.done", "session_id": sid, "total_sentences": 1}
    await s.t.closed(1000)
    assert s.session.outcome == OUTCOME_COMPLETED
    assert engine.running == 0
    await s.finish()


async def test_server_terminate_ends_the_session_with_4001(speech):
    s, engine, sid, sent = await speaking(speech)
    await s.session.handle_signal(signals.signal(signals.TERMINATE, sid))
    assert await s.t.event() == {"type": "error", "message": TERMINATED_MESSAGE, "error_type": "server_error"}
    await s.t.closed(4001)
    assert s.t.pending() == [] and s.t.after_close == []
    assert s.session.outcome == OUTCOME_TERMINATED
    assert s.session.closed.is_set()
    assert engine.running == 0 and engine.aborted == 2 and engine.completed == 0
    assert other_tasks() == set()
    # Frames and further signals after the end change nothing.
    await s.send({"type": "input.text", "text": "Too late. "})
    await s.session.handle_signal(signals.signal(signals.CANCEL, sid))
    await s.session.handle_signal(signals.signal(signals.TERMINATE, sid))
    assert s.t.pending() == [] and s.t.after_close == []
    assert s.session.outcome == OUTCOME_TERMINATED
    await s.finish()


async def test_server_terminate_with_a_reason_and_when_idle(speech):
    s = await speech(FakeEngine(), stream_audio=True)
    sid = s.configured["session_id"]
    reason = "speech session terminated: its voice 'fake' was removed"
    await s.session.handle_signal(signals.signal(signals.TERMINATE, sid, reason))
    assert await s.t.event() == {"type": "error", "message": reason, "error_type": "server_error"}
    await s.t.closed(4001)
    assert s.session.outcome == OUTCOME_TERMINATED
    await s.finish()


async def test_signals_before_the_handshake_are_ignored(speech):
    s = await speech(FakeEngine(), configure=False)
    await s.session.handle_signal(signals.signal(signals.TERMINATE, s.session.session_id))
    await s.session.handle_signal(signals.signal(signals.CANCEL, s.session.session_id))
    assert s.t.pending() == []
    configured = await s.configure(stream_audio=True)
    assert configured["session_id"] == s.session.session_id
    await s.barrier()
    await s.finish()


async def test_unknown_signal_kind_is_ignored(speech):
    s, engine, sid, sent = await speaking(speech)
    await s.session.handle_signal({"kind": "explode", "session_id": sid, "issued_at": time.time()})
    await s.barrier()
    engine.allow(6)  # two held chunks for each of the three segments
    await s.send({"type": "input.done"})
    items = await s.t.until_closed()
    assert items[-1] == ("close", 1000)
    assert [v["cancelled"] for k, v in items if k == "json" and v["type"] == "audio.done"] == [False] * 3
    await s.finish()


# -- outcomes (what the registry records at the end) -------------------------------------------------------

async def test_outcome_completed_after_input_done(speech):
    s = await speech(FakeEngine(chunks=2), stream_audio=True)
    assert s.session.outcome is None
    await s.text("All of it. ")
    await s.send({"type": "input.done"})
    items = await s.t.until_closed()
    assert items[-1] == ("close", 1000)
    assert s.session.outcome == OUTCOME_COMPLETED
    pipeline = s.session.pipeline
    assert pipeline.sentences == 1 and pipeline.bytes_sent == 2 * CHUNK_BYTES
    assert pipeline.first_audio_s is not None and pipeline.first_audio_s >= 0
    await s.finish()
    assert s.session.outcome == OUTCOME_COMPLETED  # aclose after the end does not rewrite it


async def test_outcome_cancelled_when_the_client_leaves_mid_session(speech):
    s, engine, sid, sent = await speaking(speech)
    await s.finish()  # aclose: the client disconnected
    assert s.session.outcome == OUTCOME_CANCELLED
    assert engine.aborted == 2
    assert s.t.close_code is None and s.t.pending() == []
    assert s.session.pipeline.bytes_sent == sent and s.session.pipeline.sentences == 1


async def test_outcome_failed_after_a_fatal_error(speech):
    s = await speech(FakeEngine(), limits(max_pending_chars=10), stream_audio=True)
    await s.text("x" * 11)
    event = await s.t.event("error")
    assert event["message"] == "buffered speech text exceeds 10 characters"
    await s.t.closed(4008)
    assert s.session.outcome == OUTCOME_FAILED
    await s.finish()
    assert s.session.outcome == OUTCOME_FAILED
