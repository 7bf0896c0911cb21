"""The frames a client waits on go out at once (speech/web/wsprotocol.py): `send_now` on a real TCP
transport over a real socket pair, and which of daphne's replies use it."""

from __future__ import annotations

import socket

import pytest
from daphne.ws_protocol import WebSocketProtocol
from twisted.internet.protocol import Protocol
from twisted.internet.tcp import Connection
from twisted.internet.testing import MemoryReactor

from speech.web import wsprotocol
from speech.web.wsprotocol import BudgetedWebSocketProtocol, send_now, tcp_transport


@pytest.fixture
def wire():
    """A Twisted TCP transport on one end of a socket pair (its reactor never runs) and the other end."""
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    theirs.setblocking(False)
    reactor = MemoryReactor()
    tcp = Connection(ours, Protocol(), reactor)
    tcp.connected = True
    yield tcp, theirs, reactor
    ours.close()
    theirs.close()


def received(sock):
    try:
        return sock.recv(65536)
    except BlockingIOError:
        return b""


def test_a_write_waits_for_the_reactor_and_send_now_sends_it_at_once(wire):
    tcp, theirs, reactor = wire
    tcp.write(b"session.configured")
    assert received(theirs) == b"" and tcp in reactor.getWriters()  # what Twisted does by itself
    send_now(tcp)
    assert received(theirs) == b"session.configured"
    assert tcp not in reactor.getWriters()  # nothing left for the reactor to write


def test_a_closing_transport_is_left_to_the_reactor(wire):
    tcp, theirs, reactor = wire
    tcp.write(b"last words")
    tcp.loseConnection()  # the reactor closes it once everything is written
    send_now(tcp)
    assert received(theirs) == b"" and tcp in reactor.getWriters()
    send_now(None)  # a connection without a TCP socket under it (a test double): nothing to do


def test_the_tcp_transport_is_found_under_a_wrapping_one(wire):
    tcp, _, _ = wire

    class Wrapper:  # what TLS does: a transport whose `transport` is the TCP one
        transport = tcp

    assert tcp_transport(Wrapper()) is tcp and tcp_transport(tcp) is tcp and tcp_transport(object()) is None


def test_events_and_the_first_audio_frame_after_one_are_sent_at_once(monkeypatch):
    monkeypatch.setattr(WebSocketProtocol, "handle_reply", lambda self, message: None)  # daphne writes the frame
    flushed = []
    monkeypatch.setattr(wsprotocol, "send_now", lambda tcp: flushed.append(tcp))
    protocol = BudgetedWebSocketProtocol()
    protocol.speech_tcp = "tcp"
    replies = [
        ("text", "session.configured"),
        ("text", "audio.start"),
        ("bytes", b"first frame"),
        ("bytes", b"second frame"),
        ("bytes", b"third frame"),
        ("text", "audio.done"),
        ("bytes", b"next utterance"),
    ]
    sent_now = []
    for kind, data in replies:
        before = len(flushed)
        protocol.handle_reply({"type": "websocket.send", kind: data})
        sent_now.append(len(flushed) > before)
    assert sent_now == [True, True, True, False, False, True, True]
    protocol.handle_reply({"type": "websocket.close", "code": 1000})
    assert len(flushed) == 5 and set(flushed) == {"tcp"}
