"""On SIGTERM, daphne cancels every application before the reactor stops, so that sessions can end.

Upstream: daphne's `Server.kill_all_applications` (daphne 4.2, server.py) indexes
`details["application_instance"]`, which is missing for a connection whose application has finished
or not started yet (an HTTP keep-alive, a handshake in progress): it raises KeyError, cancels
nothing, and the process dies with sessions still running. No upstream issue is filed.
"""

import asyncio
import logging

from twisted.internet import defer

logger = logging.getLogger(__name__)


class CancelStartedApplications:
    """For a subclass of daphne's Server that defines `async _stop(applications)`: the applications
    that are running are cancelled, connections without one are skipped, and the reactor waits for
    `_stop` to return."""

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


def applied():
    from ..launcher import SpeechServer

    return SpeechServer.kill_all_applications is CancelStartedApplications.kill_all_applications
