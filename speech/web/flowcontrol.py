"""Backpressure for a WebSocket: the application waits while the client is not reading.

ASGI gives an application no way to see that a client has stopped reading (daphne#170): `send`
returns at once and daphne buffers without limit. The information lives in Twisted. A transport
whose outgoing buffer passes its `bufferSize` (64 KiB) asks its registered streaming producer to
`pauseProducing()`, and asks it to `resumeProducing()` once the buffer has drained into the
kernel. `FlowControl` is that producer for one connection: `SpeechServer` attaches one to every
WebSocket and passes it to the application in the scope (`scope["speech.flow"]`), and the consumer
awaits `writable()` before each audio frame. A client that stops reading therefore holds its
session after about 64 KiB plus the kernel's socket buffers, and delivery resumes when it reads
again; daphne's ping timeout still ends a client that is gone.

Audio never overtakes what the client said: daphne tells the FlowControl when it queues a client
message for the application (`message_read`, speech/web/wsprotocol.py) and the consumer when it has
handled it (`message_handled`), and `writable()` also waits while one is in between. A cancel that
the server has read therefore stops the audio before another frame goes out, however fast the
client reads (otherwise the frames sent during the loop turns from daphne's read to the session's
handling of the cancel went out after it).

The consumer also sends its messages through it (`send`): straight to daphne's protocol, which writes
each frame to the socket itself (speech/web/wsprotocol.py), not through Channels' `send` and daphne's
`handle_reply`, which add nothing for a connection that is already open.
"""

from __future__ import annotations

import asyncio

from twisted.internet.interfaces import IPushProducer
from zope.interface import implementer

from .tcpwindow import send_room, writes_through

SCOPE_KEY = "speech.flow"
# autobahn waits 1 s by default for the client's reply to a close frame, then resets the connection,
# and the client gets no close code. The reply comes after the client has read everything in flight
# before the close frame: besides the server's buffers (speech/web/server.py), the client's own
# receive buffer, which the kernel grows to megabytes (tcp_rmem), i.e. minutes of audio for a client
# that reads at real time. So the wait is this much plus the audio the session sent beyond real time.
CLOSE_HANDSHAKE_TIMEOUT_S = 10.0
RESUME_YIELDS = 4  # loop turns after a resume for daphne to read what the client sent before reading again


@implementer(IPushProducer)
class FlowControl:
    held = 0  # connections of this process whose client is not keeping up right now (a metric)

    def __init__(self, protocol=None):
        self._protocol = protocol
        self._writable = asyncio.Event()
        self._writable.set()
        self._unhandled = 0  # client messages daphne has queued for the application and it has not handled yet
        self._input_handled = asyncio.Event()
        self._input_handled.set()
        self.pauses = 0  # how often the client fell behind: for tests and metrics
        self.on_lost = None  # called when the connection is gone, before the application hears of it

    @classmethod
    def attach(cls, protocol):
        """Register a new FlowControl as the producer of `protocol`'s transport. The HTTP channel
        that upgraded the connection registered itself there and no longer writes to it."""
        flow = cls(protocol)
        protocol.closeHandshakeTimeout = CLOSE_HANDSHAKE_TIMEOUT_S
        protocol.transport.unregisterProducer()  # a no-op when none is registered (TCP and TLS alike)
        protocol.transport.registerProducer(flow, True)
        return flow

    @property
    def attached(self):
        """It belongs to a connection of daphne's (`attach`), not to a test that stands in for daphne."""
        return self._protocol is not None

    @property
    def paused(self):
        return not self._writable.is_set()

    async def writable(self):
        """Return once the connection's outgoing buffer has room and every client message daphne has
        read is handled."""
        if not self._writable.is_set():
            await self._writable.wait()
            # The client read again, and frames it sent before reading (a cancel, typically) arrive
            # with the same wake-up: let daphne read them before more audio goes out.
            for _ in range(RESUME_YIELDS):
                await asyncio.sleep(0)
        while self._unhandled:
            await self._input_handled.wait()

    def send_room(self):
        """Bytes the next frame may hold and still leave for the client at once, whole (speech/web/tcpwindow.py).
        0 while the client is not keeping up (held, or Twisted holds bytes the socket did not take), and
        behind TLS, whose records Twisted writes from its own buffer."""
        protocol = self._protocol
        tcp = getattr(protocol, "speech_tcp", None)
        if tcp is None or tcp is not protocol.transport or not self._writable.is_set() or not writes_through(tcp):
            return 0
        return send_room(tcp.socket)

    def send(self, data):
        """Send `data` (str: a text message, bytes: a binary one) on the connection at once, straight to
        daphne's protocol (speech/web/wsprotocol.py, `send_data_message`). Raises autobahn's Disconnected
        once the connection is not open, or when the write finds it gone (it is then aborted, and daphne
        reports the disconnect)."""
        if isinstance(data, str):
            self._protocol.send_data_message(data.encode(), False)
        else:
            self._protocol.send_data_message(data, True)

    def closing(self, audio_ahead_s):
        """The application is about to close: wait for the client's reply to the close frame until it
        can have played the `audio_ahead_s` seconds it may still have to read, plus the usual wait."""
        if self._protocol is not None:
            self._protocol.closeHandshakeTimeout = CLOSE_HANDSHAKE_TIMEOUT_S + max(0.0, audio_ahead_s)

    # Client messages, from daphne's protocol and from the consumer
    def message_read(self):
        self._unhandled += 1
        self._input_handled.clear()

    def message_handled(self):
        self._unhandled = max(0, self._unhandled - 1)
        if not self._unhandled:
            self._input_handled.set()

    # IPushProducer, called by the transport on the reactor's (daphne's) event loop
    def pauseProducing(self):
        if self._writable.is_set():
            self.pauses += 1
            FlowControl.held += 1
            self._writable.clear()

    def resumeProducing(self):
        if not self._writable.is_set():
            FlowControl.held -= 1
            self._writable.set()

    def stopProducing(self):
        """The connection is gone: never hold a sender; the disconnect ends the session. `on_lost` runs
        first, in this turn of the loop: a hang-up stops the session's engine work before anything
        queued behind the disconnect (another client's text, typically) is handled."""
        if self.on_lost is not None:
            self.on_lost()
        self.resumeProducing()
