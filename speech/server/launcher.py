"""daphne, as `manage.py serve` runs it: the stock server with backpressure and a shutdown that works.

Every WebSocket gets a Connection (speech/server/connection.py) in its scope: the session's transport,
whose FlowControl is its transport's producer and whose input queue the application reads
(speech/server/patches/daphne_backpressure.py).

On SIGTERM every running application is cancelled (speech/server/patches/daphne_shutdown.py); the
server waits for every session to end (each sends its error event and closes 4001) and, while their
clients answer the close (or SHUTDOWN_CLOSE_WAIT_S), for the project's own stop (`Lifecycle`, given by
`manage.py serve`: speech/web/lifecycle.py), which it also starts when the reactor runs.

daphne's timeout and keepalive check runs in passes (speech/server/patches/daphne_timeout_passes.py).
Its WebSocket connections meter large frames against the process's budget from their header on
(speech/server/websocket.py, speech/server/budget.py), and once no WebSocket has been open for a few
seconds, or the engine has had nothing to do for as long, freed memory is returned if a burst left
some (speech.memory).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import sys
import time
from typing import Protocol

from daphne.cli import CommandLineInterface
from daphne.server import Server
from twisted.internet import reactor
from twisted.internet.task import LoopingCall

from .. import memory
from ..engines import jobs
from .collector import collector
from .patches.daphne_backpressure import ConnectionInScope
from .patches.daphne_shutdown import CancelStartedApplications
from .patches.daphne_timeout_passes import TimeoutPasses
from .websocket import SpeechWebSocket

logger = logging.getLogger(__name__)

# How long a thread that wants the GIL waits before the thread holding it must let go (Python's
# default: 5 ms). A handshake or a frame that arrives while a synthesis thread runs Python (G2P) or
# the registry's writer builds its batch waited up to that long; at 0.5 ms handshakes are answered
# sooner and throughput is unchanged (docs/decisions.md).
GIL_SWITCH_INTERVAL_S = 0.0005

# On SIGTERM, how long the process waits for the clients of the sessions it ended to answer their close
# frames. Until a client has read the audio queued before the error event and the close frame, the
# connection is still open; a process that exited then reset it, and the client got 1006 and lost
# that audio. Well inside the 10 s a process manager (docker stop) allows before SIGKILL.
SHUTDOWN_CLOSE_WAIT_S = 5.0

# How often the memory watch looks at the engine (`SpeechServer._watch_engine`).
ENGINE_WATCH_S = 1.0


class Lifecycle(Protocol):
    def start(self) -> None:
        """The reactor runs (on its event loop)."""

    async def stop(self) -> None:
        """Every session has ended; runs while their clients answer the close."""


class SpeechServer(CancelStartedApplications, ConnectionInScope, TimeoutPasses, Server):
    def __init__(self, *args, lifecycle: Lifecycle, **kwargs):
        super().__init__(*args, **kwargs)
        self.lifecycle = lifecycle
        self._marks: dict = {}  # protocol -> its garbage-collector mark (speech/server/collector.py)
        self._sockets: set = set()  # the WebSocket connections open in this process
        self._engine_seen: tuple[int, float] | None = None  # (jobs submitted, when) the engine was last seen at work

    def run(self):
        # The application is imported and its engine warmed up by now: about 110,000 objects that live
        # as long as the process. Frozen, they are left out of every full collection of the garbage
        # collector (40-60 ms with the event loop stopped each), and so are the sessions that stay
        # open (speech/server/collector.py).
        # The event loop shares the GIL with the synthesis threads (G2P and numpy between onnxruntime
        # calls) and the registry's writer: see GIL_SWITCH_INTERVAL_S.
        collector.install()
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        reactor.callWhenRunning(self.lifecycle.start)
        reactor.callWhenRunning(LoopingCall(self._watch_engine).start, ENGINE_WATCH_S, False)  # (interval, now)
        super().run()

    @property
    def ws_factory(self):
        return self._ws_factory

    @ws_factory.setter
    def ws_factory(self, factory):
        # Server.run() builds daphne's factory; its connections use this project's protocol.
        factory.protocol = SpeechWebSocket
        self._ws_factory = factory

    opened = 0  # WebSocket connections opened since the start
    _all_closed = None  # while stopping: a future the last WebSocket to close resolves

    @property
    def sockets(self) -> int:
        """WebSocket connections open in this process."""
        return len(self._sockets)

    def protocol_disconnected(self, protocol):
        super().protocol_disconnected(protocol)
        collector.ended(self._marks.pop(protocol, collector.freezes))
        if protocol in self._sockets:
            self._sockets.discard(protocol)
            if not self._sockets:
                if self._all_closed is not None and not self._all_closed.done():
                    self._all_closed.set_result(None)
                # Not after every connection: a trim walks the heaps under their locks, slowing the
                # synthesis threads while it runs, and hands back their working memory (speech.memory).
                reactor.callLater(memory.QUIET_TRIM_AFTER_S, self._quiet, self.opened)

    def _quiet(self, opened):
        """No WebSocket was opened or open since the last one ended: give a burst's memory back."""
        if not self._sockets and self.opened == opened:
            memory.release_after_growth()

    def _watch_engine(self):
        """Sessions may stay open while the engine has nothing to do (readers that stopped reading, a
        pause in a conversation): once it has had no job for QUIET_TRIM_AFTER_S, a burst's memory goes
        back as after the last WebSocket (speech.memory: only if the process grew since the last trim),
        once for each such quiet. Stalled readers' heap after their first sentences: bench/RESULTS.md."""
        now, submitted = time.monotonic(), jobs.submitted()
        if jobs.pending() or self._engine_seen is None or self._engine_seen[0] != submitted:
            self._engine_seen = (submitted, now)
        elif now - self._engine_seen[1] >= memory.QUIET_TRIM_AFTER_S:
            self._engine_seen = (submitted, math.inf)
            memory.release_after_growth()

    def create_application(self, protocol, scope):
        """Every connection gets its garbage-collector mark, and a WebSocket is counted (its Connection:
        speech/server/patches/daphne_backpressure.py)."""
        self._marks[protocol] = collector.opened()
        if scope["type"] == "websocket":
            self._sockets.add(protocol)
            self.opened += 1
        return super().create_application(protocol, scope)

    async def _stop(self, applications):
        await asyncio.gather(*applications, return_exceptions=True)
        await asyncio.gather(self.lifecycle.stop(), self._sockets_closed())

    async def _sockets_closed(self):
        if not self._sockets:
            return
        self._all_closed = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(self._all_closed, SHUTDOWN_CLOSE_WAIT_S)
        except TimeoutError:
            logger.warning("%i WebSocket client(s) did not answer the close within %g s", self.sockets, SHUTDOWN_CLOSE_WAIT_S)


class SpeechCommandLine(CommandLineInterface):
    """daphne's command line, running a SpeechServer with `lifecycle`."""

    def __init__(self, lifecycle: Lifecycle):
        super().__init__()
        self.server_class = functools.partial(SpeechServer, lifecycle=lifecycle)
