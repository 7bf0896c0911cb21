"""daphne's WebSocket protocol, as speech/web/server.py runs it: large frames are metered against the
process's memory budget (speech/web/budget.py) from their header on, before their payload is read,
what it sends goes straight to the socket when nothing is waiting before it (write_through), and
autobahn's debug log lines cost nothing while debug logging is off (LogArgument)."""

import functools
import json
import logging
import pprint
import socket
import sys
import time

from autobahn.twisted import websocket as autobahn_twisted
from autobahn.websocket import protocol as autobahn_protocol
from daphne.ws_protocol import WebSocketProtocol

from .budget import frame_cost, get_budget, over_budget_error
from .tcpwindow import writes_through

logger = logging.getLogger(__name__)


class BudgetedWebSocketProtocol(WebSocketProtocol):
    """daphne's protocol, with each large data frame's memory reserved before its payload is read.

    A frame the budget cannot take ends the connection with the capacity error and 4013; its
    payload is dropped as it arrives (autobahn skips a connection it has failed), never stored."""

    reservation = None

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
        logger.info("refused a %s frame from %s: handshake memory budget in use", self.frame_length, self.client_addr)
        self.sendMessage(json.dumps(over_budget_error().event()).encode(), isBinary=False)
        self.sendClose(code=over_budget_error().close_code)
        # autobahn drops this frame's payload and every later frame; daphne still tells the
        # application of the disconnect, so the session ends at once.
        self.failedByMe = True

    speech_tcp = None  # the TCP transport under the connection (TLS wraps it), set by speech/web/server.py

    def sendData(self, data, sync=False, chopsize=None):
        """Every frame (and the handshake and close) goes straight to the socket when nothing is waiting
        before it; only what the socket does not take is left to Twisted (speech.web.wsprotocol.write_through)."""
        tcp = self.speech_tcp
        direct = tcp is not None and tcp is self.transport and not self.logOctets  # autobahn's octet log: debugging only
        if direct and not sync and not chopsize and not self.send_queue:
            rest = write_through(tcp, data)
            if self.state == self.STATE_OPEN:
                self.trafficStats.outgoingOctetsWireLevel += len(data) - len(rest)
            if not rest:
                return
            data = rest
        super().sendData(data, sync, chopsize)

    speech_flow = None  # the connection's FlowControl (speech/web/server.py), told of every message queued

    def onMessage(self, payload, isBinary):
        if self.speech_flow is not None and not self.muted:  # daphne queues it for the application
            self.speech_flow.message_read()
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

    def onClose(self, wasClean, code, reason):
        if self.reservation is not None:  # the client left in the middle of a large frame
            self.reservation.release()
            self.reservation = None
        super().onClose(wasClean, code, reason)


def tcp_transport(transport):
    """The TCP transport under a transport (TLS wraps the TCP transport in another), or None."""
    while transport is not None:
        if isinstance(getattr(transport, "socket", None), socket.socket):
            return transport
        transport = getattr(transport, "transport", None)
    return None


def write_through(tcp, data):
    """Send `data` on a TCP transport's socket now if the transport holds nothing to send before it, and
    return what the socket did not take (the caller gives that to the transport, as usual).

    Twisted's `write` buffers and registers the transport with the reactor, which sends at its next turn,
    after every callback already due (with 20 handshakes arriving at once, each answer waited for all 20),
    and then unregisters it: two epoll changes and their bookkeeping for every frame, a quarter of the
    event loop's time when it streams audio (bench/throughput.py). Backpressure is unchanged: data that
    the socket does not take fills Twisted's buffer, which pauses the connection's producer as before.
    A transport that is closing, or that failed (a send error leaves the data to the transport, whose
    own attempt then meets the error and ends the connection), is left to the reactor."""
    if not writes_through(tcp):
        return data
    try:
        sent = tcp.socket.send(data)
    except OSError:  # the socket is full (EAGAIN) or the connection failed: the transport takes it all
        return data
    return data[sent:]


class LogArgument:
    """An argument of one of autobahn's debug log lines, formatted only when the line is rendered.

    autobahn builds these arguments before it calls `log.debug`, which txaio has made a no-op at any
    level above debug: a `pformat` of its 29 settings for every new connection, and names coloured
    with click for every read. That was an eighth of the event loop's work for a session's handshake
    (`cProfile` of `manage.py serve`, 500 sessions). Wrapped in this, the work happens only if a log
    observer formats the line, and the text is the same."""

    __slots__ = ("_formatter", "_args")

    def __init__(self, formatter, *args):
        self._formatter = formatter
        self._args = args

    def __str__(self):
        return str(self._formatter(*self._args))

    __repr__ = __str__


def _defer_debug_arguments():
    """Every use of these names in the two autobahn modules daphne runs is an argument of a debug log
    line, except `Timings.__str__`'s pformat, which is given back its eager one."""
    for module, names in ((autobahn_protocol, ("pformat", "hltype", "hlval")), (autobahn_twisted, ("hltype", "hlval"))):
        for name in names:
            setattr(module, name, functools.partial(LogArgument, getattr(module, name)))
    autobahn_protocol.Timings.__str__ = lambda timings: pprint.pformat(timings._timings)


_defer_debug_arguments()
