"""A client that vanishes at the wrong moment (speech/server/patches/uvloop_closed_handle.py): the frame written to
it neither raises into daphne nor into a session's task, and the connection ends as a disconnect.

The moment is made for real, on uvloop's loop and Twisted's asyncio reactor as `manage.py serve` runs them:
the client's last frame and its reset both arrive before the loop polls, epoll reports an error, and uvloop
runs the reader once and closes the socket's poll handle. The server's checks still see an open connection
(nobody has told daphne), and the next write meets the closed handle."""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import pytest
import uvloop
from autobahn.exception import Disconnected
from twisted.internet import tcp
from twisted.internet.asyncioreactor import AsyncioSelectorReactor

from speech.engines.fake import FakeEngine
from speech.server.connection import Connection
from speech.stream.outcomes import OUTCOME_FAILED
from speech.stream.session import SpeechSession

from .conftest import limits
from .support.websocket import OpenedProtocol, opened

TCP_CLOSE = 7  # tcpi_state once the reset has arrived (linux/tcp_states.h)
WAIT_S = 5.0


class Watched(OpenedProtocol):
    """The server's protocol, recording how its connection ended instead of telling a daphne behind it."""

    ended = None

    def onClose(self, wasClean, code, reason):
        self.ended = (wasClean, code)


@pytest.fixture
def vanished():
    """A protocol whose TCP transport's poll handle uvloop closed when the client reset the connection right
    after sending its last bytes; with the loop that serves it."""
    loop = uvloop.new_event_loop()
    reactor = AsyncioSelectorReactor(loop)
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    server.setblocking(False)
    protocol, _ = opened(Watched)
    transport = tcp.Connection(server, protocol, reactor)
    transport.connected = True
    protocol.transport = protocol.tcp = transport
    protocol.dataReceived = lambda data: None  # its last frame: session.config, say
    transport.startReading()
    client.send(b"the last frame")
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()  # a reset, not a close handshake
    deadline = time.monotonic() + WAIT_S
    while server.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] != TCP_CLOSE:
        assert time.monotonic() < deadline, "the reset never arrived"
        time.sleep(0.001)
    loop.run_until_complete(asyncio.sleep(0))  # the poll reports the error: uvloop reads once, closes the handle
    with pytest.raises(RuntimeError, match="handler is closed"):
        loop.add_writer(server.fileno(), lambda: None)  # the state the tracebacks came from
    assert protocol.state == protocol.STATE_OPEN and protocol.ended is None  # every check still passes
    yield protocol, loop
    for selectable in (transport, reactor.waker):
        reactor.removeReader(selectable)
    reactor.waker.connectionLost(None)
    server.close()
    listener.close()
    loop.close()


def settle(loop):
    loop.run_until_complete(asyncio.sleep(0.01))


def until_ended(loop, protocol):
    """Run the loop until daphne hears of the disconnect (a lost connection's teardown is deferred:
    speech/server/websocket.py TEARDOWN_DELAY_S), bounded."""

    async def ended():
        while protocol.ended is None:
            await asyncio.sleep(0.01)

    loop.run_until_complete(asyncio.wait_for(ended(), WAIT_S))


def test_a_frame_to_a_vanished_client_raises_disconnected_and_ends_the_connection(vanished):
    protocol, loop = vanished
    with pytest.raises(Disconnected):
        protocol.send_data_message(b'{"type":"session.configured"}', False)
    with pytest.raises(Disconnected):  # and so does every later one, before it touches the transport
        protocol.send_data_message(b"audio", True)
    until_ended(loop, protocol)
    assert protocol.ended[0] is False  # daphne hears of a disconnect


def test_autobahns_own_frames_to_a_vanished_client_end_the_connection_without_raising(vanished):
    """A ping from daphne's timer, or the close frame a session ends with (daphne's handle_reply)."""
    protocol, loop = vanished
    protocol.sendClose(code=1000)
    settle(loop)
    assert protocol.ended is not None


def test_a_session_that_expires_on_a_vanished_client_ends_with_no_exception_left_in_a_task(vanished):
    """SpeechSession._expire -> _end -> send_json (the error event) -> the connection's send: the traceback
    "Task exception was never retrieved" came from there."""
    protocol, loop = vanished
    unhandled = []
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    closes = []
    protocol.serverClose = lambda code=None: closes.append(code)  # daphne's close, for the session's close

    async def run():
        session = SpeechSession(Connection(protocol), FakeEngine(), limits(config_timeout_s=0.01))
        session.start()
        await asyncio.wait_for(session.closed.wait(), WAIT_S)
        await asyncio.sleep(0.01)
        return session

    session = loop.run_until_complete(run())
    assert session.outcome == OUTCOME_FAILED and protocol.gone
    assert closes == []  # nothing more is sent once the connection is known to be gone
    until_ended(loop, protocol)
    assert unhandled == []
