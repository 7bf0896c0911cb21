"""daphne's WebSocket protocol with large frames metered against the process's memory budget
(speech/web/budget.py) from their header on, before their payload is read. speech/web/server.py uses it."""

import json
import logging
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
