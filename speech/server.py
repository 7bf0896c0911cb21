"""daphne, as `manage.py serve` runs it: the stock server with a shutdown that works.

On SIGTERM daphne cancels every application before the reactor stops, so that sessions can end
cleanly. Its own `kill_all_applications` indexes `details["application_instance"]`, which is
missing for a connection whose application has finished or not started yet (an HTTP keep-alive,
a handshake in progress): it then raises KeyError, cancels nothing, and the process dies with
sessions still running. This version skips such connections.
"""

import asyncio
import logging

from daphne.cli import CommandLineInterface
from daphne.server import Server
from twisted.internet import defer

logger = logging.getLogger(__name__)


class SpeechServer(Server):
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
        waiting = defer.Deferred.fromFuture(asyncio.gather(*live, return_exceptions=True))
        waiting.addErrback(lambda _failure: None)
        return waiting


class SpeechCommandLine(CommandLineInterface):
    server_class = SpeechServer
