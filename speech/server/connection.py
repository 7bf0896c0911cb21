"""One WebSocket of daphne's as the session's Transport (speech/stream/session.py).

The launcher (speech/server/launcher.py) makes one for every WebSocket and puts it in the scope
(`SCOPE_KEY`); the consumer hands it to its session. It writes to daphne's protocol directly
(speech/server/websocket.py `send_data_message`), not through Channels' `send` and daphne's
`handle_reply`, which add nothing for a connection that is already open. Audio waits for its
FlowControl (speech/server/flowcontrol.py): a client that reads, and no client message unhandled.
"""

from __future__ import annotations

import json
import socket

from autobahn.exception import Disconnected

from .flowcontrol import FlowControl
from .tcpwindow import send_room, writes_through

SCOPE_KEY = "speech.connection"

# autobahn waits 1 s by default for the client's reply to a close frame, then resets the connection,
# and the client gets no close code. The reply comes after the client has read everything in flight
# before the close frame: besides the server's buffers (SEND_BUFFER_BYTES), the client's own
# receive buffer, which the kernel grows to megabytes (tcp_rmem), i.e. minutes of audio for a client
# that reads at real time. So the wait is this much plus the audio the session sent beyond real time.
CLOSE_HANDSHAKE_TIMEOUT_S = 10.0

# A connection lost without a close frame (a hang-up, a reset) is torn down this long after the loss
# (speech/server/websocket.py `connectionLost`); its engine work stopped at the loss itself. The teardown
# is nobody's wait, and a newcomer's first sentence should not wait behind it (bench/hangup.py;
# docs/decisions.md, "Hang-ups").
TEARDOWN_DELAY_S = 0.25

# What a WebSocket may have in flight beyond what the client has read. The kernel's send buffer
# autotunes up to megabytes (tcp_wmem), which for a client reading at real time is more than a
# minute of audio queued in front of every ping and close frame: daphne's ping timeout and
# autobahn's close handshake would then drop the connection with a reset, and a reset discards the
# audio the client has not read yet. 64 KiB (+ Twisted's 64 KiB) holds a few seconds of audio and still
# streams far faster than real time at internet round trips (docs/decisions.md#delivery-frames-and-writes).
SEND_BUFFER_BYTES = 64 * 1024


def encode_json(event: dict) -> str:
    """An event as compact JSON, UTF-8 where it can be; a lone UTF-16 half echoed from the client is escaped."""
    text = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = json.dumps(event, separators=(",", ":"))
    return text


class Connection:
    """The Transport of one WebSocket: daphne's protocol (speech/server/websocket.py) and its FlowControl."""

    def __init__(self, protocol, flow: FlowControl | None = None) -> None:
        self._protocol = protocol
        self.flow = flow or FlowControl()

    @classmethod
    def attach(cls, protocol) -> Connection:
        """A Connection for `protocol`, its FlowControl the producer of the protocol's transport. The HTTP
        channel that upgraded the connection registered itself there and no longer writes to it."""
        connection = cls(protocol)
        protocol.closeHandshakeTimeout = CLOSE_HANDSHAKE_TIMEOUT_S
        protocol.transport.unregisterProducer()  # a no-op when none is registered (TCP and TLS alike)
        protocol.transport.registerProducer(connection.flow, True)
        if protocol.tcp is not None:
            protocol.tcp.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        return connection

    @property
    def input(self):
        """The application's input queue (speech/server/flowcontrol.py InputQueue)."""
        return self.flow.input

    async def send_json(self, event: dict) -> None:
        self._send(encode_json(event).encode(), False)

    async def send_bytes(self, data: bytes) -> None:
        await self.flow.writable()
        self._send(data, True)

    def send_room(self) -> int:
        """Bytes the next frame may hold and still leave for the client at once, whole (speech/server/tcpwindow.py).
        0 while the client is not keeping up (held, or Twisted holds bytes the socket did not take), and
        behind TLS, whose records Twisted writes from its own buffer."""
        protocol = self._protocol
        tcp = protocol.tcp
        if tcp is None or tcp is not protocol.transport or self.flow.paused or not writes_through(tcp):
            return 0
        return send_room(tcp.socket)

    async def close(self, code: int, audio_ahead_s: float = 0.0) -> None:
        """Send the close frame, and wait for the client's reply until it can have played the
        `audio_ahead_s` seconds it may still have to read, plus the usual wait."""
        protocol = self._protocol
        if protocol.state != protocol.STATE_OPEN or protocol.gone:
            return
        protocol.closeHandshakeTimeout = CLOSE_HANDSHAKE_TIMEOUT_S + max(0.0, audio_ahead_s)
        protocol.serverClose(code=code)

    def _send(self, payload: bytes, binary: bool) -> None:
        try:
            self._protocol.send_data_message(payload, binary)
        except Disconnected:
            pass  # the client closed while frames were going out; daphne's disconnect ends the session


class AsgiConnection:
    """The Transport of a WebSocket of a daphne that runs without this package's launcher (the `daphne`
    command, and tests that run the consumer alone): the session's messages go through the ASGI `send`,
    and audio goes out as fast as it is made (no backpressure, `send_room` unknown)."""

    def __init__(self, send) -> None:
        self._send = send
        self._closed = False

    async def send_json(self, event: dict) -> None:
        await self._message({"type": "websocket.send", "text": encode_json(event)})

    async def send_bytes(self, data: bytes) -> None:
        await self._message({"type": "websocket.send", "bytes": data})

    def send_room(self) -> int:
        return 0

    async def close(self, code: int, audio_ahead_s: float = 0.0) -> None:
        await self._message({"type": "websocket.close", "code": code})
        self._closed = True

    async def _message(self, message: dict) -> None:
        if self._closed:
            return
        try:
            await self._send(message)
        except Disconnected:  # the client closed while frames were going out; daphne's disconnect ends the session
            self._closed = True
