"""Control signals in-process: the channel layer (speech/control/layer.py, speech/control/signals.py) and a session's
`handle_signal`.

* SpeechChannelLayer against a private `redis-server` (tests/support/redis_server.py) that the
  tests kill and restart: delivery to the session's group only, `receive` outliving Redis (one warning
  when it goes, one line when it is back, no traceback), groups joined again after Redis restarted
  empty, a join while Redis is away, SignalsUnavailable from `control.send`, and two prefixes
  (deployments) on one Redis never seeing each other's groups, heartbeats or slots.
* The in-memory layer (no REDIS_URL): the consumer joins its group at the handshake, a signal reaches
  it through Channels' dispatch, and it leaves the group when it ends.
* SpeechSession.handle_signal with FakeEngine(hold=True) (the `speech` fixture): cancel mid-segment,
  cancel when idle or stale, terminate, and the session's outcome for the registry.

Ordering proofs instead of sleeps: the session's barrier (input.commit -> input.committed) shows that
nothing else came first; waits on a restarted Redis poll a condition, bounded. Timeouts are hang guards.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import override_settings

from speech.control import registry
from speech.control import signals as control
from speech.control.layer import SpeechChannelLayer
from speech.control.slots import RedisSlots
from speech.engines.fake import FakeEngine
from speech.models import SessionRecord
from speech.stream.outcomes import OUTCOME_COMPLETED, OUTCOME_DISCONNECTED, OUTCOME_FAILED, OUTCOME_TERMINATED
from speech.stream.session import TERMINATED_MESSAGE
from speech.stream.signal import ControlSignal
from speech.web.admission import Admission

from .conftest import CHUNK_BYTES, limits, other_tasks
from .support.communicator import HANG_GUARD_S, PATH, application, event, send
from .support.heard import without_heard
from .support.redis_server import RedisServer

pytestmark = pytest.mark.live

WAIT_S = 20.0  # bound on waiting for a layer to notice Redis came back (backoff caps at 2 s)


def new_id():
    return f"speech_ws_{uuid.uuid4().hex}"


async def eventually(condition, what, timeout=WAIT_S):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


# -- SpeechChannelLayer on a private redis-server --------------------------------------------------------


@pytest.fixture
def private_redis():
    with RedisServer() as server:
        yield server


@pytest.fixture
async def layers(private_redis):
    made = []

    def make(prefix="speech"):
        layer = SpeechChannelLayer(hosts=[private_redis.url(7)], prefix=prefix)
        made.append(layer)
        return layer

    yield make
    for layer in made:
        await layer.stop()
        await layer.flush() if private_redis.alive() else None
    assert not [t for t in other_tasks() if t.get_name() == "speech-layer-heartbeat"], "heartbeat left running"


async def joined(layer, session_id):
    channel = await layer.new_channel()
    await layer.group_add(control.group(session_id), channel)
    return channel


async def test_group_send_reaches_the_session_on_another_instance_only(layers, private_redis):
    a, b = layers(), layers()  # two instances: A holds the sessions, B sends
    sid, other = new_id(), new_id()
    mine, theirs = await joined(a, sid), await joined(a, other)
    assert private_redis.group_members(sid, db=7) == 1
    sent = control.message(control.CANCEL, sid)
    await b.group_send(control.group(sid), sent)
    assert await asyncio.wait_for(a.receive(mine), HANG_GUARD_S) == sent
    waiting = asyncio.ensure_future(a.receive(theirs))
    await b.group_send(control.group(other), control.message(control.TERMINATE, other, "why"))
    assert (await asyncio.wait_for(waiting, HANG_GUARD_S))["type"] == "speech.terminate"
    await a.group_discard(control.group(sid), mine)
    assert private_redis.group_members(sid, db=7) == 0 and a.memberships == {control.group(other): {theirs}}


async def test_receive_outlives_redis_and_groups_come_back_after_an_empty_restart(layers, private_redis, caplog):
    caplog.set_level(logging.INFO, logger="speech.control.layer")
    a, b = layers(), layers()
    sid = new_id()
    channel = await joined(a, sid)
    receiving = asyncio.ensure_future(a.receive(channel))
    private_redis.kill()
    await eventually(lambda: a.down, "A noticed Redis went away")
    await asyncio.sleep(1.0)  # several failed retries: still one warning and the receive still waiting
    assert not receiving.done()
    private_redis.start()  # same port, empty: the group is gone until A joins it again
    await eventually(lambda: private_redis.group_members(sid, db=7) == 1, "A rejoined its group")
    sent = control.message(control.CANCEL, sid)
    await b.group_send(control.group(sid), sent)
    assert await asyncio.wait_for(receiving, HANG_GUARD_S) == sent
    lines = [r.getMessage() for r in caplog.records if r.name == "speech.control.layer"]
    assert sum("Redis unavailable" in line for line in lines) == 1, lines
    assert sum("Redis is reachable again; 1 session group(s) joined" in line for line in lines) == 1, lines
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


async def test_connections_from_before_a_restart_are_closed_when_redis_answers_again(layers, private_redis):
    """Each idle pooled connection from before a restart failed once on its next use, and each failure
    took the layer down for another backoff (joins deferred, signals lost): when Redis answers again
    the layer closes them, so the next operations all get fresh connections."""
    a = layers()
    await asyncio.gather(*(joined(a, new_id()) for _ in range(8)))  # eight connections, now idle
    await a.stop()  # no heartbeat in this test: the restart goes unnoticed until the layer is told
    private_redis.kill()
    private_redis.start()
    await a._drop_idle_connections()  # what the heartbeat does when it finds Redis back
    sids = [new_id() for _ in range(8)]
    channels = [await a.new_channel() for _ in sids]
    await asyncio.gather(*(a._join(control.group(sid), channel) for sid, channel in zip(sids, channels)))
    assert [private_redis.group_members(sid, db=7) for sid in sids] == [1] * 8


async def test_memberships_asked_for_together_go_to_redis_together(layers, private_redis):
    """20 handshakes at once join their groups in one round trip on one connection (the stock layer took
    20 connections from its pool and made 40 round trips), and a join and a leave in one batch keep their
    order."""
    a = layers()
    a.start()
    await eventually(lambda: private_redis.has_key(f"speech:instance:{control.instance_id()}", db=7), "the first heartbeat")
    redis = private_redis.client()
    before = redis.info("stats")["total_connections_received"]
    sids = [new_id() for _ in range(20)]
    channels = [await a.new_channel() for _ in sids]
    await asyncio.gather(*(a.group_add(control.group(sid), channel) for sid, channel in zip(sids, channels)))
    assert redis.info("stats")["total_connections_received"] - before <= 1
    assert [private_redis.group_members(sid, db=7) for sid in sids] == [1] * 20
    gone = new_id()
    channel = await a.new_channel()
    await asyncio.gather(a.group_add(control.group(gone), channel), a.group_discard(control.group(gone), channel))
    assert private_redis.group_members(gone, db=7) == 0 and control.group(gone) not in a.memberships


async def test_a_join_while_redis_is_away_returns_at_once_and_happens_when_it_is_back(layers, private_redis):
    a = layers()
    receiving = asyncio.ensure_future(a.receive(await a.new_channel()))  # what a consumer does first
    private_redis.kill()
    await eventually(lambda: a.down, "A noticed Redis went away")
    sid = new_id()
    channel = await asyncio.wait_for(joined(a, sid), 0.5)  # no connection attempt in the handshake
    private_redis.start()
    await eventually(lambda: private_redis.group_members(sid, db=7) == 1, "the join made when Redis was back")
    assert a.memberships[control.group(sid)] == {channel}
    receiving.cancel()
    await asyncio.gather(receiving, return_exceptions=True)


async def test_a_cancelled_receive_ends_even_when_redis_py_loses_the_cancellation(layers, monkeypatch):
    """redis-py can turn a cancellation into a timeout that it retries, or into no message: the stock
    receive loop then polls BZPOPMIN for ever, and the consumer whose receive it was never ended (seen
    once in a full run, right after Redis came back)."""
    from channels_redis.core import RedisChannelLayer

    original = RedisChannelLayer._brpop_with_clean
    inside, swallowed = asyncio.Event(), []

    async def losing_the_cancellation(self, index, channel, timeout):
        inside.set()
        try:
            return await original(self, index, channel, timeout)
        except asyncio.CancelledError:
            swallowed.append(channel)
            return None  # as if BZPOPMIN had timed out

    monkeypatch.setattr(RedisChannelLayer, "_brpop_with_clean", losing_the_cancellation)
    a = layers()
    receiving = asyncio.ensure_future(a.receive(await a.new_channel()))
    await asyncio.wait_for(inside.wait(), HANG_GUARD_S)  # the receive is suspended inside redis-py now
    receiving.cancel()
    try:
        await asyncio.wait({receiving}, timeout=HANG_GUARD_S)  # a hang guard that does not cancel again
        assert swallowed, "the cancellation did not land inside redis-py"
        assert receiving.done() and receiving.cancelled()
    finally:
        monkeypatch.undo()  # a receive left running ends at a cancellation that lands in the stock code
        for _ in range(3):
            if receiving.done():
                break
            receiving.cancel()
            await asyncio.wait({receiving}, timeout=HANG_GUARD_S)


async def test_send_and_liveness_with_redis_away_raise_signals_unavailable(private_redis):
    config = {"default": {"BACKEND": "speech.control.layer.SpeechChannelLayer", "CONFIG": {"hosts": [private_redis.url(7)]}}}
    with override_settings(CHANNEL_LAYERS=config):
        sid = new_id()
        assert await control.has_members(sid) is False
        private_redis.kill()
        for attempt in (control.send(control.CANCEL, sid), control.has_members(sid), control.instance_alive("X")):
            with pytest.raises(control.SignalsUnavailable, match="^signals are unavailable: Redis cannot be reached"):
                await attempt


async def test_two_deployments_on_one_redis_never_see_each_others_signals_or_slots(layers, private_redis):
    one, two = layers("one"), layers("two")
    sid = new_id()  # the same session id in both: only the prefix tells them apart
    channel_one, channel_two = await joined(one, sid), await joined(two, sid)
    receiving_one = asyncio.ensure_future(one.receive(channel_one))
    sent = control.message(control.CANCEL, sid, "for two")
    await two.group_send(control.group(sid), sent)
    assert await asyncio.wait_for(two.receive(channel_two), HANG_GUARD_S) == sent
    await one.group_send(control.group(sid), control.message(control.CANCEL, sid, "for one"))
    assert (await asyncio.wait_for(receiving_one, HANG_GUARD_S))["reason"] == "for one"  # never "for two"
    assert private_redis.group_members(sid, db=7, prefix="one") == 1
    assert private_redis.group_members(sid, db=7, prefix="two") == 1
    await eventually(
        lambda: all(private_redis.has_key(f"{p}:instance:{control.instance_id()}", db=7) for p in ("one", "two")),
        "each deployment's heartbeat",
    )
    slots_one, slots_two = RedisSlots(private_redis.url(7), "one"), RedisSlots(private_redis.url(7), "two")
    assert await slots_one.acquire("key", new_id(), 1) and await slots_two.acquire("key", new_id(), 1)
    assert not await slots_one.acquire("key", new_id(), 1)


# -- the consumer on the in-memory layer (no REDIS_URL) ---------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_the_consumer_joins_its_group_takes_signals_through_dispatch_and_leaves():
    assert not isinstance(control._redis_layer(control.get_channel_layer()), SpeechChannelLayer)
    comm = WebsocketCommunicator(application(FakeEngine()), PATH)
    assert (await comm.connect(HANG_GUARD_S))[0]
    await send(comm, {"type": "session.config", "session": {"stream_audio": True}})
    sid = (await event(comm, "session.configured"))["session_id"]
    assert await control.has_members(sid)
    await control.send(control.CANCEL, sid)  # nothing speaking: answered like a client's input.cancel
    assert without_heard(await event(comm)) == {
        "type": "input.cancelled",
        "session_id": sid,
        "cancelled_sentences": 0,
        "total_sentences": 0,
        "origin": "server",
    }
    await control.send(control.TERMINATE, sid, "operator says so")
    assert await event(comm) == {"type": "error", "message": "operator says so", "error_type": "server_error"}
    closed = await comm.receive_output(HANG_GUARD_S)
    assert closed == {"type": "websocket.close", "code": 4001, "reason": ""} or closed["code"] == 4001
    await comm.disconnect()
    await Admission.settle()  # the session's end goes to the registry, then it leaves its group
    assert not await control.has_members(sid)
    assert (await database_sync_to_async(SessionRecord.objects.get)(session_id=sid)).status == "terminated"


@pytest.mark.django_db(transaction=True)
async def test_an_ended_session_leaves_its_group_only_once_its_end_is_in_the_registry(monkeypatch):
    """So that from the moment it has left, the registry says it is over (404) rather than live but
    unreachable (503); a signal sent before then still finds the consumer and does nothing."""
    gate, write_batch = threading.Event(), registry.write_batch
    monkeypatch.setattr(registry, "write_batch", lambda writes: gate.wait(HANG_GUARD_S) and write_batch(writes))
    comm = WebsocketCommunicator(application(FakeEngine()), PATH)
    assert (await comm.connect(HANG_GUARD_S))[0]
    await send(comm, {"type": "session.config", "session": {"stream_audio": True}})
    sid = (await event(comm, "session.configured"))["session_id"]
    await comm.disconnect()
    try:
        assert await control.has_members(sid)  # its end is not written yet
        await control.send(control.TERMINATE, sid)
    finally:
        gate.set()
    await Admission.settle()
    assert not await control.has_members(sid)
    assert (await database_sync_to_async(SessionRecord.objects.get)(session_id=sid)).status == SessionRecord.Status.DISCONNECTED


@pytest.mark.django_db(transaction=True)
async def test_the_group_is_joined_while_the_config_travels_and_configured_waits_for_the_join(monkeypatch):
    """With Redis a join is a round trip: it starts once the session is admitted, not when its
    session.config arrives, and session.configured still goes out only once it is done (a cancel sent
    from then on reaches the session). A session that ends during its join leaves the group after it."""
    layer = control.get_channel_layer()
    calls, called, gate = [], asyncio.Event(), asyncio.Event()
    group_add, group_discard = layer.group_add, layer.group_discard

    async def held_add(group, channel):
        calls.append(("add", group))
        called.set()
        await gate.wait()
        await group_add(group, channel)

    async def recorded_discard(group, channel):
        calls.append(("discard", group))
        await group_discard(group, channel)

    monkeypatch.setattr(layer, "group_add", held_add)
    monkeypatch.setattr(layer, "group_discard", recorded_discard)
    comm = WebsocketCommunicator(application(FakeEngine()), PATH)
    assert (await comm.connect(HANG_GUARD_S))[0]
    await asyncio.wait_for(called.wait(), HANG_GUARD_S)  # no session.config sent yet
    await send(comm, {"type": "session.config", "session": {}})
    assert await comm.receive_nothing()  # the join is not done: no session.configured
    gate.set()
    sid = (await event(comm, "session.configured"))["session_id"]
    assert calls == [("add", control.group(sid))] and await control.has_members(sid)
    await comm.disconnect()
    await Admission.settle()
    assert calls == [("add", control.group(sid)), ("discard", control.group(sid))]
    assert not await control.has_members(sid)

    gate.clear()  # a client that leaves before its join is done: the session leaves once it is
    calls.clear()
    called.clear()
    comm = WebsocketCommunicator(application(FakeEngine()), PATH)
    assert (await comm.connect(HANG_GUARD_S))[0]
    await asyncio.wait_for(called.wait(), HANG_GUARD_S)
    await comm.disconnect()
    leaving = asyncio.ensure_future(Admission.settle())
    await asyncio.wait({leaving}, timeout=0.1)  # a negative check, like receive_nothing()
    assert not leaving.done() and [kind for kind, _ in calls] == ["add"]  # not left before it has joined
    gate.set()
    await asyncio.wait_for(leaving, HANG_GUARD_S)
    group = calls[0][1]
    assert calls == [("add", group), ("discard", group)]
    assert not await control.has_members(group.removeprefix("speech.session."))


# -- SpeechSession.handle_signal ----------------------------------------------------------------------------


async def signal(session, message):
    """A channel-layer message as the consumer hands it to the session: read once (speech/stream/signal.py)."""
    await session.handle_signal(ControlSignal.read(message))


def audio_done(session_id, index, total_bytes, *, cancelled=False):
    return {
        "type": "audio.done",
        "id": f"{session_id}-{index}",
        "sentence_index": index,
        "total_bytes": total_bytes,
        "error": False,
        "cancelled": cancelled,
    }


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
    await signal(s.session, control.message(control.CANCEL, sid))
    assert await s.t.event() == audio_done(sid, 0, sent, cancelled=True)
    assert without_heard(await s.t.event()) == {
        "type": "input.cancelled",
        "session_id": sid,
        "cancelled_sentences": 3,
        "total_sentences": 1,
        "origin": "server",
    }
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


def cancelled_event(sid, cancelled, total):
    return {
        "type": "input.cancelled",
        "session_id": sid,
        "cancelled_sentences": cancelled,
        "total_sentences": total,
        "origin": "server",
    }


async def test_server_cancel_when_idle_is_answered_like_a_client_cancel(speech):
    """Contract §8: input.cancelled with cancelled_sentences 0 and origin "server". (Failed while a
    server cancel on a session that was not speaking was ignored.)"""
    engine = FakeEngine(chunks=1)
    s = await speech(engine, stream_audio=True)
    sid = s.configured["session_id"]
    await signal(s.session, control.message(control.CANCEL, sid))  # nothing ever spoken
    assert without_heard(await s.t.event()) == cancelled_event(sid, 0, 0)
    await s.text("Only one. ")
    await s.t.until("audio.done")
    await signal(s.session, control.message(control.CANCEL, sid))  # spoken and finished
    assert without_heard(await s.t.event()) == cancelled_event(sid, 0, 1)
    await s.text("Again. ")
    done = (await s.t.until("audio.done"))[-1][1]
    assert done["sentence_index"] == 1 and done["cancelled"] is False
    await s.finish()


async def test_server_cancel_issued_before_the_current_speech_cuts_nothing(speech):
    engine = FakeEngine(chunks=3, hold=True)
    s = await speech(engine, stream_audio=True)
    sid = s.configured["session_id"]
    await s.text("First. ")
    await s.t.event("audio.start", sentence_index=0)
    stale = control.message(control.CANCEL, sid)  # meant for utterance 0
    engine.allow(2)
    await s.t.until("audio.done")
    # Utterance 1 begins after the signal was issued: the late signal must not cut it.
    await s.text("Second. ")
    await s.t.event("audio.start", sentence_index=1)
    await s.t.binary()
    await s.t.binary()  # the first chunk is two frames; the rest is held
    await signal(s.session, stale)  # answered, cutting nothing
    assert without_heard(await s.t.event()) == cancelled_event(sid, 0, 2)
    older = dict(control.message(control.CANCEL, sid), issued_at=stale["issued_at"] - 3600)
    await signal(s.session, older)
    assert without_heard(await s.t.event()) == cancelled_event(sid, 0, 2)
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
    await signal(s.session, control.message(control.CANCEL, sid))
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
    stale = control.message(control.CANCEL, sid)  # meant for utterance 0, delivered late
    await s.t.until("audio.done")
    await s.text("The next answer is still stream")  # utterance 1 starts: buffered, no segment yet
    await signal(s.session, stale)
    await s.send({"type": "input.commit"})
    items = await s.t.until("input.committed")
    assert [v.get("type") for k, v in items] == ["input.cancelled", "input.committed"], items
    assert without_heard(items[0][1]) == cancelled_event(sid, 0, 1)
    assert items[-1][1]["segment_sentences"] == 1
    await s.t.event("audio.start", sentence_text="The next answer is still stream")
    await s.finish()


@pytest.mark.parametrize("issued_at", [None, "2026-01-01", True], ids=["null", "string", "bool"])
async def test_a_cancel_without_a_usable_issued_at_is_current(speech, issued_at):
    """(Raised TypeError before speech/stream/session.py checked the type.) Any Django code may send a cancel
    without `issued_at` (docs/operations.md): it cuts the speech under way."""
    s, engine, sid, sent = await speaking(speech)
    await signal(s.session, {"type": "speech.cancel", "session_id": sid, "issued_at": issued_at})
    assert await s.t.event() == audio_done(sid, 0, sent, cancelled=True)
    assert without_heard(await s.t.event()) == cancelled_event(sid, 3, 1)
    await s.barrier()
    await s.finish()


async def test_server_cancel_after_input_done_ends_the_session_normally(speech):
    """While draining: the cut segment, input.cancelled (server), then session.done and 1000."""
    s, engine, sid, sent = await speaking(speech)
    await s.send({"type": "input.done"})
    await signal(s.session, control.message(control.CANCEL, sid))
    assert await s.t.event() == audio_done(sid, 0, sent, cancelled=True)
    assert without_heard(await s.t.event()) == {
        "type": "input.cancelled",
        "session_id": sid,
        "cancelled_sentences": 3,
        "total_sentences": 1,
        "origin": "server",
    }
    assert await s.t.event() == {"type": "session.done", "session_id": sid, "total_sentences": 1}
    await s.t.closed(1000)
    assert s.session.outcome == OUTCOME_COMPLETED
    assert engine.running == 0
    await s.finish()


async def test_server_terminate_ends_the_session_with_4001(speech):
    s, engine, sid, sent = await speaking(speech)
    await signal(s.session, control.message(control.TERMINATE, sid))
    assert await s.t.event() == {"type": "error", "message": TERMINATED_MESSAGE, "error_type": "server_error"}
    await s.t.closed(4001)
    assert s.t.pending() == [] and s.t.after_close == []
    assert s.session.outcome == OUTCOME_TERMINATED
    assert s.session.closed.is_set()
    assert engine.running == 0 and engine.aborted == 2 and engine.completed == 0
    assert other_tasks() == set()
    # Frames and further signals after the end change nothing.
    await s.send({"type": "input.text", "text": "Too late. "})
    await signal(s.session, control.message(control.CANCEL, sid))
    await signal(s.session, control.message(control.TERMINATE, sid))
    assert s.t.pending() == [] and s.t.after_close == []
    assert s.session.outcome == OUTCOME_TERMINATED
    await s.finish()


async def test_server_terminate_with_a_reason_and_when_idle(speech):
    s = await speech(FakeEngine(), stream_audio=True)
    sid = s.configured["session_id"]
    reason = "speech session terminated: its voice 'fake' was removed"
    await signal(s.session, control.message(control.TERMINATE, sid, reason))
    assert await s.t.event() == {"type": "error", "message": reason, "error_type": "server_error"}
    await s.t.closed(4001)
    assert s.session.outcome == OUTCOME_TERMINATED
    await s.finish()


async def test_signals_before_the_handshake_are_ignored(speech):
    s = await speech(FakeEngine(), configure=False)
    await signal(s.session, control.message(control.TERMINATE, s.session.session_id))
    await signal(s.session, control.message(control.CANCEL, s.session.session_id))
    assert s.t.pending() == []
    configured = await s.configure(stream_audio=True)
    assert configured["session_id"] == s.session.session_id
    await s.barrier()
    await s.finish()


async def test_unknown_signal_kind_is_ignored(speech):
    s, engine, sid, sent = await speaking(speech)
    assert ControlSignal.read({"type": "speech.explode", "session_id": sid, "issued_at": time.time()}) is None
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


async def test_outcome_disconnected_when_the_client_leaves_mid_session(speech):
    s, engine, sid, sent = await speaking(speech)
    await s.finish()  # aclose: the client disconnected
    assert s.session.outcome == OUTCOME_DISCONNECTED
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
