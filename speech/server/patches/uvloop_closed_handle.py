"""A write to a connection whose socket uvloop has already given up aborts it instead of raising.

Upstream: uvloop closes a socket's poll handle when epoll reports an error (a client that sent its
last frame and then a reset), runs the reader once and keeps the closed handle, so Twisted's next
`add_writer` raises RuntimeError ("the handler is closed", the error of MagicStack/uvloop#506) and
the reader never runs again: daphne never hears of the disconnect. autobahn's `sendData` lets that
escape to its caller (daphne, a ping's timer, the session's tasks).
"""

import logging

from daphne.ws_protocol import WebSocketProtocol

logger = logging.getLogger(__name__)


class AbortWhenGone:
    """For a subclass of daphne's WebSocketProtocol: `_to_transport` is autobahn's `sendData`, except
    that a write that finds the connection gone aborts it, so that daphne reports the disconnect and
    the session ends as one, and nothing escapes to the caller. `gone` says it happened."""

    gone = False

    def _to_transport(self, data, sync=False, chopsize=None):
        if self.gone:
            return
        try:
            WebSocketProtocol.sendData(self, data, sync, chopsize)
        except (RuntimeError, OSError) as exc:
            self.gone = True
            logger.debug("connection from %s gone while writing to it (%s): aborted", self.peer, exc)
            self.transport.abortConnection()


def applied():
    from ..websocket import SpeechWebSocket

    return issubclass(SpeechWebSocket, AbortWhenGone) and SpeechWebSocket.sendData is not WebSocketProtocol.sendData
