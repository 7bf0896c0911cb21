"""daphne's WebSocket protocol, as speech/web/server.py runs it: large frames are metered against the
process's memory budget (speech/web/budget.py) from their header on, before their payload is read, and
the frames a client waits on go out at once instead of at the reactor's next turn."""

import json
import logging
import socket
import sys
import time

from daphne.ws_protocol import WebSocketProtocol

from .budget import frame_cost, get_budget, over_budget_error

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
    _event_sent = False  # a text frame went out since the last binary frame

    def handle_reply(self, message):
        """daphne writes each frame the application sends to the transport, which sends it at the
        reactor's next turn, after every callback already due in this one. When several sessions are
        due together (handshakes arriving at once, sessions whose audio is ready), each one's frames
        then wait for all the others' work. The frames a client waits on are sent at once: events,
        and the first audio frame after an event (an utterance's first audio). Audio frames after it
        still go out together, one write per turn."""
        super().handle_reply(message)
        if message["type"] != "websocket.send":
            return
        if message.get("text") is not None:
            self._event_sent = True
        elif not self._event_sent:
            return
        else:
            self._event_sent = False
        send_now(self.speech_tcp)

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


def send_now(tcp):
    """Write what a TCP transport holds to its socket now, as the reactor would at its next turn.

    A failed write leaves the data buffered and the transport waiting to write, so the reactor's next
    attempt meets the same failure and ends the connection as usual. A transport that is closing is
    left to the reactor, which finishes the close once everything is written."""
    if tcp is not None and tcp.connected and not tcp.disconnecting:
        tcp.doWrite()
