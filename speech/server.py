"""daphne, as `manage.py serve` runs it: the stock server with a shutdown that works.

On SIGTERM daphne cancels every application before the reactor stops, so that sessions can end
cleanly. Its own `kill_all_applications` indexes `details["application_instance"]`, which is
missing for a connection whose application has finished or not started yet (an HTTP keep-alive,
a handshake in progress): it then raises KeyError, cancels nothing, and the process dies with
sessions still running. This version skips such connections, waits for every session to end
(each sends its error event and closes 4001, see consumers.py), then stops the signal listener.

Its WebSocket protocol meters large frames against the process's budget (speech.budget) from
their header on, and connections that end ask for freed memory to be returned (speech.memory).
"""

import asyncio
import json
import sys
import time
import logging

from daphne.cli import CommandLineInterface
from daphne.server import Server
from daphne.ws_protocol import WebSocketProtocol
from twisted.internet import defer

from . import memory
from .budget import frame_cost, get_budget, over_budget_error
from .signals import get_bus

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
        self.application_queue.put_nowait({
            "type": "websocket.receive", ("bytes" if isBinary else "text"): data, "speech.reservation": reservation})
        reservation.shrink(sys.getsizeof(data))

    def onClose(self, wasClean, code, reason):
        if self.reservation is not None:  # the client left in the middle of a large frame
            self.reservation.release()
            self.reservation = None
        super().onClose(wasClean, code, reason)


class SpeechServer(Server):
    @property
    def ws_factory(self):
        return self._ws_factory

    @ws_factory.setter
    def ws_factory(self, factory):
        # Server.run() builds daphne's factory; its connections use the budgeted protocol.
        factory.protocol = BudgetedWebSocketProtocol
        self._ws_factory = factory

    def run(self):
        memory.configure_allocator()
        super().run()

    def protocol_disconnected(self, protocol):
        super().protocol_disconnected(protocol)
        memory.release_free_memory()

    def kill_all_applications(self):
        instances = [
            details["application_instance"]
            for details in self.connections.values()
            if details.get("application_instance") is not None
        ]
        live = [instance for instance in instances if not instance.done()]
        for instance in live:
            instance.cancel()
        logger.info("Stopping %i application instances", len(live))
        waiting = defer.Deferred.fromFuture(asyncio.ensure_future(self._stop(live)))
        waiting.addErrback(lambda _failure: None)
        return waiting

    @staticmethod
    async def _stop(applications):
        await asyncio.gather(*applications, return_exceptions=True)
        await get_bus().stop()  # no task may be left pending when the interpreter exits


class SpeechCommandLine(CommandLineInterface):
    server_class = SpeechServer
