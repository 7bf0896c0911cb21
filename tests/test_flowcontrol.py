"""Backpressure's second half (speech/server/flowcontrol.py): audio never overtakes a client message
that daphne has read and the application has not handled yet, so a cancel the server has read
stops the audio before another frame goes out, however fast the client reads. The rule has one
owner, the connection's InputQueue: a client message is unhandled from when daphne queues it until
the application asks for its next message."""

from __future__ import annotations

import asyncio

from speech.server.flowcontrol import FlowControl
from speech.server.websocket import SpeechWebSocket

TURNS = 10  # loop turns given to a waiter that could finish; it waits on an event, so none is enough


async def still_waiting(task):
    for _ in range(TURNS):
        await asyncio.sleep(0)
    return not task.done()


def client_message(text):
    return {"type": "websocket.receive", "text": text}


async def test_audio_waits_until_every_message_read_is_handled():
    flow = FlowControl()
    await flow.writable()
    flow.input.put_nowait(client_message("one"))
    flow.input.put_nowait(client_message("two"))
    waiter = asyncio.create_task(flow.writable())
    assert await still_waiting(waiter)
    assert (await flow.input.get())["text"] == "one"  # taken: still being handled
    assert await still_waiting(waiter)
    assert (await flow.input.get())["text"] == "two"  # the first is handled, the second is not
    assert await still_waiting(waiter)
    asking = asyncio.create_task(flow.input.get())  # the application asks for the next: both are handled
    await waiter
    asking.cancel()


async def test_the_connect_and_the_disconnect_never_hold_audio():
    """Only the client's messages count: a disconnect queued behind a session's last audio frees it."""
    flow = FlowControl()
    flow.input.put_nowait({"type": "websocket.connect"})
    await flow.writable()
    await flow.input.get()
    flow.input.put_nowait({"type": "websocket.disconnect", "code": 1006})
    await flow.writable()


async def test_a_paused_connection_still_holds_audio_once_its_messages_are_handled():
    flow = FlowControl()
    flow.pauseProducing()
    flow.input.put_nowait(client_message("cancel"))
    waiter = asyncio.create_task(flow.writable())
    await flow.input.get()
    asking = asyncio.create_task(flow.input.get())
    assert await still_waiting(waiter)
    flow.resumeProducing()
    await waiter
    asking.cancel()


def protocol_with(flow):
    protocol = SpeechWebSocket.__new__(SpeechWebSocket)
    protocol.muted, protocol.failedByMe = False, False
    protocol.client_addr = ("127.0.0.1", 50000)
    protocol.application_queue = flow.input  # what the launcher gives daphne for a WebSocket
    return protocol


async def test_each_message_daphne_queues_holds_audio_and_none_it_drops():
    flow = FlowControl()
    protocol = protocol_with(flow)
    protocol.onMessage(b'{"type": "input.cancel"}', False)
    assert flow.input.qsize() == 1
    waiter = asyncio.create_task(flow.writable())
    assert await still_waiting(waiter)
    protocol.muted = True  # daphne drops what a closing connection sends: nothing to wait for
    protocol.onMessage(b'{"type": "input.done"}', False)
    assert flow.input.qsize() == 1
    await flow.input.get()
    asking = asyncio.create_task(flow.input.get())
    await waiter
    asking.cancel()


async def test_a_lost_connection_tells_its_listener_before_it_frees_a_held_sender():
    """The transport stops its producer when the connection is lost, in the reactor's turn that saw
    it: `on_lost` (the consumer's: the engine drops the session's work) runs then, before the
    application's disconnect message is handled, and a sender held by a full buffer goes on."""
    flow = FlowControl()
    order = []
    flow.on_lost = lambda: order.append(("lost", flow.paused))
    flow.pauseProducing()
    waiter = asyncio.create_task(flow.writable())
    assert await still_waiting(waiter)
    flow.stopProducing()
    await waiter
    assert order == [("lost", True)] and not flow.paused
