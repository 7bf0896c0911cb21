"""daphne, as `manage.py serve` runs it: the stock server with backpressure and a shutdown that works.

Backpressure: each WebSocket's transport reports a full outgoing buffer to a FlowControl that the
application finds in its scope (speech/flowcontrol.py).

On SIGTERM daphne cancels every application before the reactor stops, so that sessions can end
cleanly. Its own `kill_all_applications` indexes `details["application_instance"]`, which is
missing for a connection whose application has finished or not started yet (an HTTP keep-alive,
a handshake in progress): it then raises KeyError, cancels nothing, and the process dies with
sessions still running. This version skips such connections, waits for every session to end
(each sends its error event and closes 4001, see consumers.py), then stops the signal listener.
"""

import asyncio
import logging

from daphne.cli import CommandLineInterface
from daphne.server import Server
from twisted.internet import defer

from .flowcontrol import SCOPE_KEY, FlowControl
from .signals import get_bus

logger = logging.getLogger(__name__)


class SpeechServer(Server):
    def create_application(self, protocol, scope):
        """Every WebSocket gets its backpressure signal (speech/flowcontrol.py) in its scope."""
        if scope["type"] == "websocket":
            scope[SCOPE_KEY] = FlowControl.attach(protocol)
        return super().create_application(protocol, scope)

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
