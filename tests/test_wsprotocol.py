"""What the WebSocket protocol sends goes straight to the socket when nothing is waiting before it
(speech/web/wsprotocol.py): `write_through` on a real Twisted TCP transport over a real socket pair
(its reactor never runs, so whatever arrives was sent at once), and the protocol's use of it."""

from __future__ import annotations

import collections
import socket

import pytest
from autobahn.websocket.protocol import TrafficStats
from twisted.internet.protocol import Protocol
from twisted.internet.tcp import Connection
from twisted.internet.testing import MemoryReactor

from speech.web.wsprotocol import BudgetedWebSocketProtocol, tcp_transport, write_through


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
