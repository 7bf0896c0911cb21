"""A WebSocket's application gets its connection's backpressure, which ASGI cannot carry.

Upstream: daphne#170. An ASGI application's `send` returns at once and daphne buffers without limit;
the application cannot see that a client has stopped reading, nor when daphne has queued a message
for it. Here daphne's `Server.create_application` (daphne 4.2, server.py) gives a WebSocket's
application a Connection (speech/server/connection.py) in its scope, and the Connection's input
queue as its `receive`, so that audio waits for the socket and for the client's messages.
"""

import asyncio
import functools

from ..connection import SCOPE_KEY, Connection


class ConnectionInScope:
    """For a subclass of daphne's Server: daphne's `create_application`, with a Connection for a WebSocket."""

    def create_application(self, protocol, scope):
        assert "application_instance" not in self.connections[protocol]
        if scope["type"] == "websocket":
            connection = scope[SCOPE_KEY] = Connection.attach(protocol)
            input_queue = connection.input
        else:
            input_queue = asyncio.Queue()
        scope.setdefault("asgi", {"version": "3.0"})
        send = functools.partial(self.handle_reply, protocol)
        application_instance = self.application(scope=scope, receive=input_queue.get, send=send)
        if protocol not in self.connections:
            return None
        self.connections[protocol]["application_instance"] = asyncio.ensure_future(application_instance)
        return input_queue


def applied():
    """The server's `create_application` is this one, or an extension of it that comes before it."""
    from daphne.server import Server

    from ..launcher import SpeechServer

    mro = SpeechServer.__mro__
    if ConnectionInScope not in mro:
        return False
    definer = next(cls for cls in mro if "create_application" in vars(cls))
    return vars(definer)["create_application"] is not Server.create_application and mro.index(definer) <= mro.index(
        ConnectionInScope
    )
