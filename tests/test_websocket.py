"""What the WebSocket protocol sends goes straight to the socket when nothing is waiting before it
(speech/server/websocket.py): `write_through` on a real Twisted TCP transport over a real socket pair
(its reactor never runs, so whatever arrives was sent at once), and the protocol's use of it; the
application's data messages (`send_data_message`) are the frames autobahn's `sendMessage` makes.
A connection lost while open is torn down later, one closed properly at once. Also: autobahn's debug
log arguments are only formatted for a line that is rendered."""

from __future__ import annotations

import collections
import pprint
import socket

import click
import pytest
from autobahn import util as autobahn_util
from autobahn.exception import Disconnected, PayloadExceededError
from autobahn.twisted.websocket import WebSocketServerProtocol
from autobahn.websocket import protocol as autobahn_protocol
from autobahn.websocket.protocol import TrafficStats
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.protocol import Protocol
from twisted.internet.tcp import Connection
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure

from speech.server.connection import TEARDOWN_DELAY_S
from speech.server.flowcontrol import FlowControl
from speech.server.patches.autobahn_debug_log import LogArgument
from speech.server.tcpwindow import writes_through
from speech.server.websocket import SpeechWebSocket, frame_header, tcp_transport, write_through

from .support.websocket import OpenedProtocol, opened


@pytest.fixture
def wire():
    """A Twisted TCP transport on one end of a socket pair and the other end; both with small buffers."""
    ours, theirs = socket.socketpair()
    for sock in (ours, theirs):
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reactor = MemoryReactorClock()
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


def drain(tcp, theirs):
    """What the peer reads until the transport holds nothing more, letting it write as the peer reads (the
    reactor's turns)."""
    got = b""
    while True:
        got += received(theirs)
        if writes_through(tcp):  # nothing held: what it wrote is all in the peer's socket now
            return got + received(theirs)
        tcp.doWrite()


def test_with_nothing_waiting_the_data_goes_straight_to_the_socket(wire):
    tcp, theirs, reactor = wire
    assert write_through(tcp, (b"session.configured",)) == b""
    assert received(theirs) == b"session.configured"
    assert tcp not in reactor.getWriters()  # nothing for the reactor to do: no epoll change


def test_data_never_overtakes_what_the_transport_holds(wire):
    tcp, theirs, reactor = wire
    tcp.write(b"first")  # buffered by Twisted, for the reactor's next turn
    assert write_through(tcp, (b"second",)) == b"second"
    assert received(theirs) == b""
    tcp.write(b"second")
    tcp.doWrite()  # the reactor's turn
    assert received(theirs) == b"firstsecond"


def test_what_a_full_socket_does_not_take_is_returned_for_the_transport(wire):
    tcp, theirs, reactor = wire
    data = bytes(range(256)) * 4096  # 1 MiB, far more than the socket buffers hold
    rest = write_through(tcp, (data,))
    assert 0 < len(rest) < len(data)
    assert write_through(tcp, (b"more",)) == b"more"  # the socket is full now: EAGAIN, all of it returned
    tcp.write(rest)
    assert drain(tcp, theirs) == data


def test_a_closing_transport_is_left_to_the_reactor(wire):
    tcp, theirs, reactor = wire
    tcp.loseConnection()  # the reactor closes it once everything is written
    assert write_through(tcp, (b"late",)) == b"late"
    assert received(theirs) == b""


def test_the_tcp_transport_is_found_under_a_wrapping_one(wire):
    tcp, _, _ = wire

    class Wrapper:  # what TLS does: a transport whose `transport` is the TCP one
        transport = tcp

    assert tcp_transport(Wrapper()) is tcp and tcp_transport(tcp) is tcp and tcp_transport(object()) is None


def test_the_protocol_writes_through_the_tcp_transport_and_only_that(wire):
    tcp, theirs, reactor = wire
    protocol = SpeechWebSocket()
    protocol.state = protocol.STATE_OPEN
    protocol.send_queue = collections.deque()
    protocol.trafficStats = TrafficStats()
    protocol.logOctets = False  # as daphne's factory sets it
    protocol.transport = protocol.tcp = tcp
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


def test_parts_go_out_in_one_write_and_a_full_socket_leaves_the_rest_in_order(wire):
    tcp, theirs, reactor = wire
    header, payload = b"\x82\x7f" + (1 << 20).to_bytes(8, "big"), bytes(range(256)) * 4096
    rest = write_through(tcp, (header, payload))
    assert 0 < len(rest) < len(payload)  # the socket took the header and part of the payload
    tcp.write(rest)
    assert drain(tcp, theirs) == header + payload


class _CountingSocket:
    """A socket that takes `takes` bytes of whatever it is given."""

    def __init__(self, takes):
        self.takes = takes

    def sendmsg(self, parts):
        return self.takes


class _OpenTransport:
    connected, disconnecting, _tempDataLen, dataBuffer, offset = True, False, 0, b"", 0

    def __init__(self, sock):
        self.socket = sock


@pytest.mark.parametrize("takes", [1, 2, 3, 7])
def test_what_is_left_starts_where_the_socket_stopped_in_the_header_or_the_payload(takes):
    parts = (b"\x82\x05", b"audio")
    assert write_through(_OpenTransport(_CountingSocket(takes)), parts) == b"\x82\x05audio"[takes:]


# -- the application's data messages ---------------------------------------------------------------


def stats(protocol):
    return protocol.trafficStats.__json__()


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 70000])
@pytest.mark.parametrize("binary", [True, False])
def test_a_data_message_is_the_frame_autobahn_sends(size, binary):
    ours, our_wire = opened()
    autobahns, autobahn_wire = opened()
    payload = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    ours.send_data_message(payload, binary)
    autobahns.sendMessage(payload, binary)
    assert our_wire.value() == autobahn_wire.value()
    assert our_wire.value()[: -size or None] == frame_header(2 if binary else 1, size)
    assert stats(ours) == stats(autobahns)


@pytest.mark.parametrize("options", [{"autoFragmentSize": 100}, {"maskServerFrames": True}])
def test_frames_autobahn_is_set_to_make_differently_it_makes_itself(options, monkeypatch):
    monkeypatch.setattr(autobahn_protocol.random, "getrandbits", lambda bits: 0x01020304)  # the masking key
    ours, our_wire = opened(**options)
    autobahns, autobahn_wire = opened(**options)
    payload = b"x" * 300
    ours.send_data_message(payload, True)
    autobahns.sendMessage(payload, True)
    assert our_wire.value() == autobahn_wire.value() and our_wire.value() != frame_header(2, 300) + payload


def test_autobahns_frame_log_and_timings_still_see_every_message(monkeypatch):
    logged = []
    monkeypatch.setattr(OpenedProtocol, "logTxFrame", lambda self, header, *args: logged.append(header.length))
    protocol, _ = opened(logFrames=True)
    protocol.send_data_message(b"audio", True)
    assert logged == [5]
    protocol, _ = opened()
    protocol.trackedTimings = autobahn_protocol.Timings()  # what setTrackTimings(True) sets
    protocol.send_data_message(b"audio", True)
    assert "sendMessage" in protocol.trackedTimings._timings


def test_a_message_over_the_limit_fails_as_autobahn_fails_it():
    protocol, wire = opened(maxMessagePayloadSize=10)
    protocol.send_data_message(b"0123456789", True)
    with pytest.raises(PayloadExceededError):
        protocol.send_data_message(b"0123456789a", True)
    assert wire.value() == frame_header(2, 10) + b"0123456789"


def test_a_closed_connection_raises_disconnected():
    protocol, wire = opened()
    protocol.state = protocol.STATE_CLOSED
    with pytest.raises(Disconnected):
        protocol.send_data_message(b"late", True)
    assert wire.value() == b""


def test_a_data_message_goes_to_the_socket_in_one_write_and_never_overtakes_twisted(wire):
    tcp, theirs, reactor = wire
    protocol, _ = opened()
    protocol.transport = protocol.tcp = tcp
    protocol.send_data_message(b"audio", True)
    assert received(theirs) == b"\x82\x05audio" and tcp not in reactor.getWriters()
    tcp.write(b"held")  # Twisted holds bytes for the reactor's next turn: the message goes after them
    protocol.send_data_message("événement".encode(), False)
    assert received(theirs) == b""
    text = frame_header(1, len("événement".encode())) + "événement".encode()
    assert drain(tcp, theirs) == b"held" + text


# -- a connection lost ---------------------------------------------------------------------------------


class _Closes(OpenedProtocol):
    """Records autobahn's onClose (daphne's turns it into the application's disconnect message)."""

    def onClose(self, wasClean, code, reason):
        self.closes = [*getattr(self, "closes", []), (wasClean, code)]


def test_a_connection_lost_while_open_is_torn_down_later_and_written_to_no_more(wire):
    """A hang-up: the teardown (autobahn's, daphne's, the application's disconnect) waits TEARDOWN_DELAY_S on
    the connection's reactor, after the turns of the sessions still there; meanwhile nothing is written."""
    tcp, _, reactor = wire
    protocol, _ = opened(_Closes)
    protocol.transport = protocol.tcp = tcp
    tcp.protocol = protocol
    tcp.connectionLost(Failure(ConnectionLost()))  # the transport's loss, then the protocol's
    assert not hasattr(protocol, "closes") and protocol.gone
    with pytest.raises(Disconnected):
        protocol.send_data_message(b"late", True)
    protocol.sendPing()  # daphne's keep-alive timer may still fire: nothing reaches the transport
    assert tcp.dataBuffer == b"" and not tcp._tempDataBuffer
    reactor.advance(TEARDOWN_DELAY_S - 0.01)
    assert not hasattr(protocol, "closes")
    reactor.advance(0.01)
    assert protocol.closes == [(False, 1006)] and protocol.state == protocol.STATE_CLOSED


def test_a_connection_lost_after_its_close_handshake_is_torn_down_at_once(wire):
    tcp, _, reactor = wire
    protocol, sent = opened(_Closes)
    sent.registerProducer(FlowControl(), True)  # as the launcher's Connection does: autobahn unregisters it
    mask = b"\x01\x02\x03\x04"
    code = bytes(b ^ mask[i] for i, b in enumerate((1000).to_bytes(2, "big")))
    protocol.dataReceived(b"\x88\x82" + mask + code)  # the client's close frame, masked
    assert sent.value().startswith(b"\x88")  # autobahn's reply
    protocol.tcp = tcp
    protocol.connectionLost(Failure(ConnectionDone()))
    assert protocol.closes == [(True, 1000)] and not reactor.getDelayedCalls()


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

    protocol, transport = opened(Echo)
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
