"""daphne, as `manage.py serve` runs it: the stock server with backpressure and a shutdown that works.

Backpressure: each WebSocket's transport reports a full outgoing buffer to a FlowControl that the
application finds in its scope (speech/web/flowcontrol.py).

On SIGTERM daphne cancels every application before the reactor stops, so that sessions can end
cleanly. Its own `kill_all_applications` indexes `details["application_instance"]`, which is
missing for a connection whose application has finished or not started yet (an HTTP keep-alive,
a handshake in progress): it then raises KeyError, cancels nothing, and the process dies with
sessions still running. This version skips such connections, waits for every session to end
(each sends its error event and closes 4001, see consumers.py) and for its client to answer the
close (or SHUTDOWN_CLOSE_WAIT_S), marks any row of its own still active as terminated (a session
whose end could not be recorded), then stops the channel layer's heartbeat. From its start it sweeps
the registry of the rows of instances that are gone (speech/control/sweep.py).

Its WebSocket connections meter large frames against the process's budget from their header on
(speech/web/wsprotocol.py, speech/web/budget.py), and once no WebSocket has been open for a few
seconds, freed memory is returned if a burst left some (speech.memory).
"""

import asyncio
import logging
import socket
import sys

from daphne.cli import CommandLineInterface
from daphne.server import Server
from django.utils import timezone
from twisted.internet import defer, reactor

from .. import memory
from ..control import registry
from ..control import signals as control
from ..control.sweep import Sweeper
from .admission import Admission
from .collector import collector
from .database import on_database_thread
from .flowcontrol import SCOPE_KEY, FlowControl
from .wsprotocol import BudgetedWebSocketProtocol, tcp_transport

logger = logging.getLogger(__name__)

# What a WebSocket may have in flight beyond what the client has read. The kernel's send buffer
# autotunes up to megabytes (tcp_wmem), which for a client reading at real time is more than a
# minute of audio queued in front of every ping and close frame: daphne's ping timeout and
# autobahn's close handshake would then drop the connection with a reset, and a reset discards the
# audio the client has not read yet. 64 KiB (+ Twisted's 64 KiB) holds a few seconds of audio and still
# streams far faster than real time at internet round trips (docs/decisions.md#delivery-frames-and-writes).
SEND_BUFFER_BYTES = 64 * 1024

# How long a thread that wants the GIL waits before the thread holding it must let go (Python's
# default: 5 ms). A handshake or a frame that arrives while a synthesis thread runs Python (G2P) or
# the registry's writer builds its batch waited up to that long; shorter, handshakes are quicker and
# synthesis is no slower (docs/decisions.md#the-event-loop-kept-short).
GIL_SWITCH_INTERVAL_S = 0.0005

# On SIGTERM, how long the process waits for the clients of the sessions it ended to answer their close
# frames. Until a client has read the audio queued before the error event and the close frame, the
# connection is still open; a process that exited then reset it, and the client got 1006 and lost
# that audio. Well inside the 10 s a process manager (docker stop) allows before SIGKILL.
SHUTDOWN_CLOSE_WAIT_S = 5.0

_instance_stopped = on_database_thread(registry.instance_stopped)


class SpeechServer(Server):
    started = None  # when run() began: this process's registry rows are the ones started since
    _sweeping = None  # the registry sweep's task (speech/control/sweep.py)

    def run(self):
        # The application is imported and its engine warmed up by now: objects that live as long as the
        # process. A full collection of the garbage collector walks them all with the event loop stopped;
        # frozen, they are left out of every collection, and so are the sessions that stay open
        # (speech/web/collector.py; docs/decisions.md#the-event-loop-kept-short).
        # The event loop shares the GIL with the synthesis threads (G2P and numpy between onnxruntime
        # calls) and the registry's writer: see GIL_SWITCH_INTERVAL_S.
        collector.install()
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        self.started = timezone.now()
        reactor.callWhenRunning(self._sweep)
        super().run()

    def _sweep(self):
        self._sweeping = asyncio.ensure_future(Sweeper(self.started).run())

    @property
    def ws_factory(self):
        return self._ws_factory

    @ws_factory.setter
    def ws_factory(self, factory):
        # Server.run() builds daphne's factory; its connections use the budgeted protocol.
        factory.protocol = BudgetedWebSocketProtocol
        self._ws_factory = factory

    sockets = 0  # WebSocket connections open in this process
    opened = 0  # WebSocket connections opened since the start
    _all_closed = None  # while stopping: a future the last WebSocket to close resolves

    def protocol_disconnected(self, protocol):
        super().protocol_disconnected(protocol)
        collector.ended(getattr(protocol, "speech_gc_mark", collector.freezes))
        if getattr(protocol, "speech_socket", False):
            protocol.speech_socket = False
            self.sockets -= 1
            if self.sockets == 0:
                if self._all_closed is not None and not self._all_closed.done():
                    self._all_closed.set_result(None)
                # Not after every connection: a trim walks the heaps under their locks, slowing the
                # synthesis threads while it runs, and hands back their working memory (speech.memory).
                reactor.callLater(memory.QUIET_TRIM_AFTER_S, self._quiet, self.opened)

    def _quiet(self, opened):
        """No WebSocket was opened or open since the last one ended: give a burst's memory back."""
        if self.sockets == 0 and self.opened == opened:
            memory.release_after_growth()

    def create_application(self, protocol, scope):
        """Every WebSocket gets its backpressure signal (speech/web/flowcontrol.py) in its scope, and
        its protocol reports the client's messages to it."""
        protocol.speech_gc_mark = collector.opened()
        if scope["type"] == "websocket":
            protocol.speech_socket = True
            self.sockets += 1
            self.opened += 1
            scope[SCOPE_KEY] = protocol.speech_flow = FlowControl.attach(protocol)
            protocol.speech_tcp = tcp = tcp_transport(protocol.transport)
            if tcp is not None:
                tcp.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
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

    async def _stop(self, applications):
        await asyncio.gather(*applications, return_exceptions=True)
        # The registry rows and group memberships of the sessions that ended, and their close handshakes.
        await asyncio.gather(Admission.settle(), self._sockets_closed())
        if self._sweeping is not None:
            self._sweeping.cancel()
            await asyncio.gather(self._sweeping, return_exceptions=True)
        await self._record_stopped()
        await control.stop()  # no task may be left pending when the interpreter exits

    async def _record_stopped(self):
        if self.started is None:  # never ran
            return
        try:
            ended = await _instance_stopped(self.started)
        except Exception:
            logger.exception("could not record the end of this instance's sessions in the registry")
            return
        if ended:
            logger.warning("%i session(s) without a recorded end marked terminated", ended)

    async def _sockets_closed(self):
        if self.sockets == 0:
            return
        self._all_closed = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(self._all_closed, SHUTDOWN_CLOSE_WAIT_S)
        except TimeoutError:
            logger.warning("%i WebSocket client(s) did not answer the close within %g s", self.sockets, SHUTDOWN_CLOSE_WAIT_S)


class SpeechCommandLine(CommandLineInterface):
    server_class = SpeechServer
