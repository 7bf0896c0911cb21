"""daphne's WebSocket protocol, as speech/server/launcher.py runs it: large frames are metered against the
process's memory budget (speech/server/budget.py) from their header on, before their payload is read,
what it sends goes straight to the socket when nothing is waiting before it (write_through), and the
application's messages reach it without daphne's and Channels' layers (send_data_message, called by
speech/server/connection.py). A write that finds the connection gone aborts it
(speech/server/patches/uvloop_closed_handle.py), and autobahn's debug log lines cost nothing while
debug logging is off (speech/server/patches/autobahn_debug_log.py). A connection lost without a close
handshake is torn down TEARDOWN_DELAY_S later (`connectionLost`)."""

import json
import socket
import struct
import sys
import time

from autobahn.exception import Disconnected
from daphne.ws_protocol import WebSocketProtocol

from .. import metrics
from .budget import frame_cost, get_budget, over_budget_error
from .connection import TEARDOWN_DELAY_S
from .patches import autobahn_debug_log
from .patches.uvloop_closed_handle import AbortWhenGone
from .tcpwindow import writes_through

autobahn_debug_log.apply()


class SpeechWebSocket(AbortWhenGone, WebSocketProtocol):
    """daphne's protocol, with each large data frame's memory reserved before its payload is read.

    A frame the budget cannot take ends the connection with the capacity error and 4013; its
    payload is dropped as it arrives (autobahn skips a connection it has failed), never stored."""

    reservation = None
    tcp = None  # the TCP transport under the connection (TLS wraps it), found when it is made

    def connectionMade(self):
        self.tcp = tcp_transport(self.transport)
        super().connectionMade()

    def onMessageFrameBegin(self, length):
        super().onMessageFrameBegin(length)
        cost = frame_cost(length)
        if not cost or self.failedByMe:
            return
        # The frames of a fragmented message add up in one reservation.
        reservation = get_budget().try_reserve(cost, self.reservation)
        if reservation is None:
            self._refuse_over_budget()
            return
        self.reservation = reservation

    def _refuse_over_budget(self):
        metrics.refused(metrics.MEMORY_BUDGET, f"a {self.frame_length}-byte frame from {self.peer}: memory budget in use")
        error = over_budget_error()
        metrics.METER.error_sent(error.error_type, error.code)
        self.sendMessage(json.dumps(error.event()).encode(), isBinary=False)
        self.sendClose(code=error.close_code)
        # autobahn drops this frame's payload and every later frame; daphne still tells the
        # application of the disconnect, so the session ends at once.
        self.failedByMe = True

    def sendData(self, data, sync=False, chopsize=None):
        """Every frame (and the handshake and close) goes straight to the socket when nothing is waiting
        before it; only what the socket does not take is left to Twisted (write_through, below)."""
        if not sync and not chopsize:
            data = self._write_through((data,))
            if not data:
                return
        self._to_transport(data, sync, chopsize)

    def _write_through(self, parts):
        """Write `parts` to the socket now if nothing waits before them (write_through); return the bytes
        left for Twisted, all of them when the socket is not written directly."""
        tcp = self.tcp
        if tcp is None or tcp is not self.transport or self.logOctets or self.send_queue:  # logOctets: debugging only
            return b"".join(parts)
        rest = write_through(tcp, parts)
        if self.state == self.STATE_OPEN:
            self.trafficStats.outgoingOctetsWireLevel += sum(map(len, parts)) - len(rest)
        return rest

    def send_data_message(self, payload, binary):
        """Send one whole text or binary message, as autobahn's `sendMessage` does on this server: one
        unmasked frame, uncompressed, whose header and payload are written to the socket together
        (`sendmsg`) instead of being joined first. The application calls this through its Connection
        (speech/server/connection.py), not through Channels' `send`, daphne's `handle_reply` and
        `serverSend` and autobahn's `sendMessage` and `sendFrame`, which do nothing more for an open
        connection and cost the event loop CPU for every frame (docs/decisions.md#delivery-frames-and-writes).
        Raises autobahn's Disconnected once the connection is not open, as `sendMessage` does, and when it
        finds the connection gone (`_to_transport`)."""
        if self.state != self.STATE_OPEN or self.gone:
            raise Disconnected("Attempt to send on a closed protocol")
        size = len(payload)
        if (
            self._perMessageCompress is not None
            or self.maskServerFrames
            or self.autoFragmentSize
            or 0 < self.maxMessagePayloadSize < size
            or self.logFrames
            or self.trackedTimings
        ):
            self.sendMessage(payload, binary)  # autobahn's own way, whatever these ask for
        else:
            self._send_frame(payload, binary)
        if self.gone:
            raise Disconnected("the connection is gone")

    def _send_frame(self, payload, binary):
        size = len(payload)
        stats = self.trafficStats
        stats.outgoingWebSocketMessages += 1
        stats.outgoingWebSocketFrames += 1
        stats.outgoingOctetsAppLevel += size
        stats.outgoingOctetsWebSocketLevel += size
        rest = self._write_through((frame_header(OPCODE_BINARY if binary else OPCODE_TEXT, size), payload))
        if rest:
            self._to_transport(rest)

    def onMessage(self, payload, isBinary):
        reservation, self.reservation = self.reservation, None
        if reservation is None or self.muted or self.failedByMe:
            super().onMessage(payload, isBinary)
            return
        # The reservation rides in the ASGI message: it ends when the application drops the message,
        # which is when the data it carries is freed too. Once the chunks and the joined bytes are
        # gone (when autobahn's onMessageEnd returns, right after this)
        # only that data is left, so the reservation shrinks to its size.
        self.last_ping = time.time()
        data = payload if isBinary else payload.decode("utf8")
        self.application_queue.put_nowait(
            {"type": "websocket.receive", ("bytes" if isBinary else "text"): data, "speech.reservation": reservation}
        )
        reservation.shrink(sys.getsizeof(data))

    def connectionLost(self, reason):
        """A connection lost while open, with no close handshake (a hang-up, a reset), has already stopped
        its session's engine work: the transport stopped its producer first (FlowControl.on_lost). The
        rest, autobahn's and daphne's bookkeeping and the application's disconnect (1006), runs
        TEARDOWN_DELAY_S later, after the turns of the sessions still there; meanwhile the connection
        counts as `gone`, so that nothing is written to it. A large frame's reservation ends at once."""
        if self.reservation is not None:  # the client left in the middle of a large frame
            self.reservation.release()
            self.reservation = None
        if self.state == self.STATE_OPEN:  # `gone` may be set already: a write found the connection reset
            self.gone = True
            _reactor(self.tcp).callLater(TEARDOWN_DELAY_S, super().connectionLost, reason)
            return
        super().connectionLost(reason)


def _reactor(tcp):
    """The reactor of a TCP transport; the process's one for a connection that has none."""
    if tcp is not None:
        return tcp.reactor
    from twisted.internet import reactor

    return reactor


def tcp_transport(transport):
    """The TCP transport under a transport (TLS wraps the TCP transport in another), or None."""
    while transport is not None:
        if isinstance(getattr(transport, "socket", None), socket.socket):
            return transport
        transport = getattr(transport, "transport", None)
    return None


OPCODE_TEXT, OPCODE_BINARY = 0x1, 0x2


def frame_header(opcode, size):
    """The header of a final, unmasked WebSocket frame of `size` payload bytes (RFC 6455, 5.2)."""
    if size < 126:
        return bytes((0x80 | opcode, size))
    if size < 1 << 16:
        return struct.pack("!BBH", 0x80 | opcode, 126, size)
    return struct.pack("!BBQ", 0x80 | opcode, 127, size)


def write_through(tcp, parts):
    """Send the bytes of `parts` (a sequence of bytes-like objects) on a TCP transport's socket now if the
    transport holds nothing to send before them, and return the bytes the socket did not take (the caller
    gives those to the transport, as usual).

    Twisted's `write` buffers and registers the transport with the reactor, which sends at its next turn,
    after every callback already due (with 20 handshakes arriving at once, each answer waited for all 20),
    and then unregisters it: two epoll changes and their bookkeeping for every frame, a quarter of the
    event loop's time when it streams audio (bench/throughput.py). Backpressure is unchanged: data that
    the socket does not take fills Twisted's buffer, which pauses the connection's producer as before.
    A transport that is closing, or that failed (a send error leaves the data to the transport, whose
    own attempt then meets the error and ends the connection), is left to the reactor."""
    if not writes_through(tcp):
        return b"".join(parts)
    try:
        sent = tcp.socket.send(parts[0]) if len(parts) == 1 else tcp.socket.sendmsg(parts)
    except OSError:  # the socket is full (EAGAIN) or the connection failed: the transport takes it all
        return b"".join(parts)
    for at, part in enumerate(parts):  # what is left: the rest of the part the socket stopped in, and all after it
        if sent < len(part):
            return b"".join((part[sent:], *parts[at + 1 :]))
        sent -= len(part)
    return b""
