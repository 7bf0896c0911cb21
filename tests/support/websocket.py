"""daphne's WebSocket protocol as the server runs it (speech/server/websocket.py), opened by autobahn's own
handshake with no daphne application behind it: for tests of what it writes."""

from __future__ import annotations

import base64

from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from twisted.internet.testing import StringTransport

from speech.server.websocket import SpeechWebSocket


class OpenedProtocol(SpeechWebSocket):
    """The server's protocol once autobahn's own handshake has opened it, with no daphne application behind it."""

    onConnect = WebSocketServerProtocol.onConnect
    onOpen = WebSocketServerProtocol.onOpen


def opened(protocol_class=OpenedProtocol, **options):
    """A protocol of `protocol_class` built by autobahn's server factory with `options`, after autobahn's own
    handshake over a StringTransport, which is returned with it, emptied of the handshake's answer."""
    factory = WebSocketServerFactory("ws://127.0.0.1:9/")
    factory.protocol = protocol_class
    for debugging in ("logFrames", "trackTimings"):  # the factory's attributes, not protocol options
        if debugging in options:
            setattr(factory, debugging, options.pop(debugging))
    factory.setProtocolOptions(**options)
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
    assert transport.value().startswith(b"HTTP/1.1 101") and protocol.state == protocol.STATE_OPEN
    transport.clear()
    return protocol, transport
