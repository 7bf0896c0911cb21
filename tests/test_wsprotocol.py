"""What the WebSocket protocol sends goes straight to the socket when nothing is waiting before it
(speech/web/wsprotocol.py): `write_through` on a real Twisted TCP transport over a real socket pair
(its reactor never runs, so whatever arrives was sent at once), and the protocol's use of it. Also:
autobahn's debug log arguments are only formatted for a line that is rendered."""

from __future__ import annotations

import base64
import collections
import pprint
import socket

import click
import pytest
from autobahn import util as autobahn_util
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket import protocol as autobahn_protocol
from autobahn.websocket.protocol import TrafficStats
from twisted.internet.protocol import Protocol
from twisted.internet.tcp import Connection
from twisted.internet.testing import MemoryReactor, StringTransport

from speech.web.wsprotocol import BudgetedWebSocketProtocol, LogArgument, tcp_transport, write_through


@pytest.fixture
def wire():
    """A Twisted TCP transport on one end of a socket pair and the other end; both with small buffers."""
    ours, theirs = socket.socketpair()
    for sock in (ours, theirs):
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reactor = MemoryReactor()
    tcp = Connection(ours, Protocol(), reactor)
    tcp.connected = True
    yield tcp, theirs, reactor
    ours.close()
    theirs.close()


def received(sock):
    chunks = []
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except BlockingIOError:
            return b"".join(chunks)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def test_with_nothing_waiting_the_data_goes_straight_to_the_socket(wire):
    tcp, theirs, reactor = wire
    assert write_through(tcp, b"session.configured") == b""
    assert received(theirs) == b"session.configured"
    assert tcp not in reactor.getWriters()  # nothing for the reactor to do: no epoll change


def test_data_never_overtakes_what_the_transport_holds(wire):
    tcp, theirs, reactor = wire
    tcp.write(b"first")  # buffered by Twisted, for the reactor's next turn
    assert write_through(tcp, b"second") == b"second"
    assert received(theirs) == b""
    tcp.write(b"second")
    tcp.doWrite()  # the reactor's turn
    assert received(theirs) == b"firstsecond"


def test_what_a_full_socket_does_not_take_is_returned_for_the_transport(wire):
    tcp, theirs, reactor = wire
    data = bytes(range(256)) * 4096  # 1 MiB, far more than the socket buffers hold
    rest = write_through(tcp, data)
    assert 0 < len(rest) < len(data)
    assert write_through(tcp, b"more") == b"more"  # the socket is full now: EAGAIN, all of it returned
    tcp.write(rest)
    got = b""
    while len(got) < len(data):
        got += received(theirs)
        tcp.doWrite()
    assert got == data


def test_a_closing_transport_is_left_to_the_reactor(wire):
    tcp, theirs, reactor = wire
    tcp.loseConnection()  # the reactor closes it once everything is written
    assert write_through(tcp, b"late") == b"late"
    assert received(theirs) == b""


def test_the_tcp_transport_is_found_under_a_wrapping_one(wire):
    tcp, _, _ = wire

    class Wrapper:  # what TLS does: a transport whose `transport` is the TCP one
        transport = tcp

    assert tcp_transport(Wrapper()) is tcp and tcp_transport(tcp) is tcp and tcp_transport(object()) is None


def test_the_protocol_writes_through_the_tcp_transport_and_only_that(wire):
    tcp, theirs, reactor = wire
    protocol = BudgetedWebSocketProtocol()
    protocol.state = protocol.STATE_OPEN
    protocol.send_queue = collections.deque()
    protocol.trafficStats = TrafficStats()
    protocol.logOctets = False  # as daphne's factory sets it
    protocol.transport = protocol.speech_tcp = tcp
    protocol.sendData(b"\x82\x05audio")
    assert received(theirs) == b"\x82\x05audio" and tcp not in reactor.getWriters()
    assert protocol.trafficStats.outgoingOctetsWireLevel == 7

    class Wrapper:  # TLS: the bytes must go through the TLS layer, never straight to the socket
        written = []

        def write(self, data):
            self.written.append(data)

    protocol.transport = Wrapper()
    protocol.sendData(b"\x82\x05audio")
    assert Wrapper.written == [b"\x82\x05audio"] and received(theirs) == b""


# -- autobahn's debug log arguments ------------------------------------------------------------------


def test_a_connection_formats_no_debug_argument_while_debug_logging_is_off(monkeypatch):
    """A handshake, a text frame in and one out through autobahn's Twisted server protocol (the one
    daphne's derives from): no pprint and no click colouring, which autobahn ran for every new
    connection, every read and every write."""
    formatted = []
    monkeypatch.setattr(pprint.PrettyPrinter, "pformat", lambda *a: formatted.append("pformat") or "")
    monkeypatch.setattr(click, "style", lambda text, **kw: formatted.append("style") or text)
    messages = []

    class Echo(WebSocketServerProtocol):
        def onMessage(self, payload, isBinary):
            messages.append(payload)

    factory = WebSocketServerFactory("ws://127.0.0.1:9/")
    factory.protocol = Echo
    protocol = factory.buildProtocol(("127.0.0.1", 0))
    transport = StringTransport()
    protocol.makeConnection(transport)
    key = base64.b64encode(b"0123456789abcdef").decode()
    protocol.dataReceived(
        (
            "GET / HTTP/1.1\r\nHost: 127.0.0.1:9\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    assert transport.value().startswith(b"HTTP/1.1 101")
    mask = b"\x01\x02\x03\x04"
    payload = bytes(b ^ mask[i % 4] for i, b in enumerate(b"hello"))
    protocol.dataReceived(b"\x81\x85" + mask + payload)  # a masked text frame, as a client sends it
    protocol.sendMessage(b"world")
    assert messages == [b"hello"] and transport.value().endswith(b"\x81\x05world")
    assert formatted == []


def test_a_debug_argument_reads_as_autobahn_formats_it():
    settings = [("autoPingInterval", 0, "WebSocketServerFactory"), ("openHandshakeTimeout", 5, "Factory")]
    argument = autobahn_protocol.pformat(settings)
    assert isinstance(argument, LogArgument)
    assert str(argument) == f"{argument}" == pprint.pformat(settings)
    method = WebSocketServerProtocol.onConnect
    assert str(autobahn_protocol.hltype(method)) == autobahn_util.hltype(method)
    assert str(autobahn_protocol.hlval(42)) == autobahn_util.hlval(42)
    # pformat's one use outside a log line still returns text
    assert str(autobahn_protocol.Timings()) == "{}"
