"""Backpressure's second half (speech/web/flowcontrol.py): audio never overtakes a client message
that daphne has read and the application has not handled yet, so a cancel the server has read
stops the audio before another frame goes out, however fast the client reads."""

from __future__ import annotations

import asyncio

from speech.web.flowcontrol import CLOSE_HANDSHAKE_TIMEOUT_S, FlowControl
from speech.web.wsprotocol import BudgetedWebSocketProtocol

TURNS = 10  # loop turns given to a waiter that could finish; it waits on an event, so none is enough


async def still_waiting(task):
    for _ in range(TURNS):
        await asyncio.sleep(0)
    return not task.done()


async def test_audio_waits_until_every_message_read_is_handled():
    flow = FlowControl()
    await flow.writable()
    flow.message_read()
    flow.message_read()
    waiter = asyncio.create_task(flow.writable())
    assert await still_waiting(waiter)
    flow.message_handled()
    assert await still_waiting(waiter)
    flow.message_handled()
    await waiter
    flow.message_handled()  # one more than was read (a frame from before the flow was attached) is harmless
    await flow.writable()


async def test_a_paused_connection_still_holds_audio_once_its_messages_are_handled():
    flow = FlowControl()
    flow.pauseProducing()
    flow.message_read()
    waiter = asyncio.create_task(flow.writable())
    flow.message_handled()
    assert await still_waiting(waiter)
    flow.resumeProducing()
    await waiter


def protocol_with(flow):
    protocol = BudgetedWebSocketProtocol.__new__(BudgetedWebSocketProtocol)
    protocol.speech_flow, protocol.muted, protocol.failedByMe = flow, False, False
    protocol.client_addr = ("127.0.0.1", 50000)
    protocol.application_queue = asyncio.Queue()
    return protocol


async def test_daphne_reports_each_message_it_queues_and_none_it_drops():
    flow = FlowControl()
    protocol = protocol_with(flow)
    protocol.onMessage(b'{"type": "input.cancel"}', False)
    assert protocol.application_queue.qsize() == 1
    waiter = asyncio.create_task(flow.writable())
    assert await still_waiting(waiter)
    protocol.muted = True  # daphne drops what a closing connection sends: nothing to wait for
    protocol.onMessage(b'{"type": "input.done"}', False)
    assert protocol.application_queue.qsize() == 1
    flow.message_handled()
    await waiter


class _Transport:
    def registerProducer(self, producer, streaming):
        self.producer = producer

    def unregisterProducer(self):
        pass


class _Protocol:
    closeHandshakeTimeout = 1  # autobahn's default

    def __init__(self):
        self.transport = _Transport()


async def test_the_close_reply_is_awaited_as_long_as_the_client_may_still_be_playing():
    protocol = _Protocol()
    flow = FlowControl.attach(protocol)
    assert protocol.transport.producer is flow
    assert protocol.closeHandshakeTimeout == CLOSE_HANDSHAKE_TIMEOUT_S
    flow.closing(42.5)
    assert protocol.closeHandshakeTimeout == CLOSE_HANDSHAKE_TIMEOUT_S + 42.5
    flow.closing(0.0)
    assert protocol.closeHandshakeTimeout == CLOSE_HANDSHAKE_TIMEOUT_S


class _Sender(_Protocol):
    def __init__(self):
        super().__init__()
        self.sent = []

    def send_data_message(self, payload, binary):
        self.sent.append((payload, binary))


def test_the_application_sends_text_as_utf8_and_bytes_as_binary_through_the_connection():
    protocol = _Sender()
    flow = FlowControl.attach(protocol)
    assert flow.attached and not FlowControl().attached  # a test's stand-in for daphne sends nothing itself
    flow.send('{"text":"été"}')
    flow.send(b"\x00\x01")
    assert protocol.sent == [('{"text":"été"}'.encode(), False), (b"\x00\x01", True)]


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
