"""The per-connection object (speech/server/connection.py) is the session's Transport: what it sends
goes straight to daphne's protocol, audio waits for its FlowControl, and its close waits for a client
that may still be playing."""

from __future__ import annotations

import inspect

from speech.server.connection import CLOSE_HANDSHAKE_TIMEOUT_S, AsgiConnection, Connection
from speech.stream.session import Transport


def transport_members():
    return {name: member for name, member in vars(Transport).items() if inspect.isfunction(member) and not name.startswith("_")}


def test_both_connections_implement_the_transport_of_the_session_core():
    members = transport_members()
    assert set(members) == {"send_json", "send_bytes", "close", "send_room"}
    for implementation in (Connection, AsgiConnection):
        for name, member in members.items():
            ours = getattr(implementation, name)
            assert inspect.iscoroutinefunction(ours) == inspect.iscoroutinefunction(member), (implementation, name)
            assert list(inspect.signature(ours).parameters) == list(inspect.signature(member).parameters), (implementation, name)


def test_the_transport_check_sees_a_missing_parameter():
    class Short:
        async def close(self, code):
            pass

    assert list(inspect.signature(Short.close).parameters) != list(inspect.signature(transport_members()["close"]).parameters)


class _Transport:
    def registerProducer(self, producer, streaming):
        self.producer = producer

    def unregisterProducer(self):
        pass


class _Protocol:
    """What a Connection uses of daphne's protocol (speech/server/websocket.py)."""

    STATE_OPEN, STATE_CLOSING = 3, 4
    closeHandshakeTimeout = 1  # autobahn's default
    tcp = None  # not TCP: no send room known
    gone = False

    def __init__(self):
        self.transport = _Transport()
        self.state = self.STATE_OPEN
        self.sent = []
        self.closes = []

    def send_data_message(self, payload, binary):
        self.sent.append((payload, binary))

    def serverClose(self, code=None):
        self.closes.append(code)
        self.state = self.STATE_CLOSING


async def test_the_close_reply_is_awaited_as_long_as_the_client_may_still_be_playing():
    protocol = _Protocol()
    connection = Connection.attach(protocol)
    assert protocol.transport.producer is connection.flow
    assert protocol.closeHandshakeTimeout == CLOSE_HANDSHAKE_TIMEOUT_S
    await connection.close(1000, 42.5)
    assert protocol.closeHandshakeTimeout == CLOSE_HANDSHAKE_TIMEOUT_S + 42.5 and protocol.closes == [1000]
    await connection.close(4001)  # already closing: nothing more
    assert protocol.closes == [1000]
    protocol = _Protocol()
    await Connection.attach(protocol).close(1000)
    assert protocol.closeHandshakeTimeout == CLOSE_HANDSHAKE_TIMEOUT_S


async def test_events_go_as_utf8_text_and_audio_as_binary_straight_to_the_protocol():
    protocol = _Protocol()
    connection = Connection.attach(protocol)
    await connection.send_json({"text": "été"})
    await connection.send_bytes(b"\x00\x01")
    assert protocol.sent == [('{"text":"été"}'.encode(), False), (b"\x00\x01", True)]
    assert connection.send_room() == 0  # not TCP


async def test_without_the_launcher_the_session_speaks_asgi():
    sent = []

    async def send(message):
        sent.append(message)

    connection = AsgiConnection(send)
    await connection.send_json({"type": "session.configured"})
    await connection.send_bytes(b"\x00")
    await connection.close(1000, 3.0)
    await connection.send_json({"type": "late"})  # nothing after the close
    assert sent == [
        {"type": "websocket.send", "text": '{"type":"session.configured"}'},
        {"type": "websocket.send", "bytes": b"\x00"},
        {"type": "websocket.close", "code": 1000},
    ]
