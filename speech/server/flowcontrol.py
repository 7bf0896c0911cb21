"""When a WebSocket's audio may be written: the client is reading, and what it said has been handled.

ASGI gives an application no way to see that a client has stopped reading (daphne#170): `send`
returns at once and daphne buffers without limit. The information lives in Twisted. A transport
whose outgoing buffer passes its `bufferSize` (64 KiB) asks its registered streaming producer to
`pauseProducing()`, and asks it to `resumeProducing()` once the buffer has drained into the
kernel. `FlowControl` is that producer for one connection (speech/server/connection.py registers it).
A client that stops reading therefore holds its session after about 64 KiB plus the kernel's socket
buffers, and delivery resumes when it reads again; daphne's ping timeout still ends a client that is gone.

Audio never overtakes what the client said: the application reads the connection's messages from its
`InputQueue`, which counts a client message as unhandled from when daphne queues it until the
application asks for its next message, and `writable()` also waits while one is unhandled. A cancel
that the server has read therefore stops the audio before another frame goes out, however fast the
client reads.
"""

from __future__ import annotations

import asyncio

from twisted.internet.interfaces import IPushProducer
from zope.interface import implementer

RESUME_YIELDS = 4  # loop turns after a resume for daphne to read what the client sent before reading again


class InputQueue(asyncio.Queue):
    """The application's input from one connection (daphne puts, the application gets).

    The rule: a client message (`websocket.receive`) is unhandled from `put_nowait` until the
    application calls `get` again after taking it; `handled()` waits until none is."""

    def __init__(self) -> None:
        super().__init__()
        self._unhandled = 0
        self._taken = False  # the application holds a client message it took
        self._all_handled = asyncio.Event()
        self._all_handled.set()

    def put_nowait(self, message):
        if message["type"] == "websocket.receive":
            self._unhandled += 1
            self._all_handled.clear()
        super().put_nowait(message)

    async def get(self):
        if self._taken:  # the application asks for the next message: it is done with the last one
            self._taken = False
            self._unhandled -= 1
            if not self._unhandled:
                self._all_handled.set()
        message = await super().get()
        self._taken = message["type"] == "websocket.receive"
        return message

    async def handled(self) -> None:
        while self._unhandled:
            await self._all_handled.wait()


@implementer(IPushProducer)
class FlowControl:
    held = 0  # connections of this process whose client is not keeping up right now (a metric)

    def __init__(self) -> None:
        self.input = InputQueue()
        self._writable = asyncio.Event()
        self._writable.set()
        self.pauses = 0  # how often the client fell behind: for tests and metrics
        self.on_lost = None  # called when the connection is gone, before the application hears of it

    @property
    def paused(self) -> bool:
        return not self._writable.is_set()

    async def writable(self) -> None:
        """Return once the connection's outgoing buffer has room and every client message daphne has
        read is handled."""
        if not self._writable.is_set():
            await self._writable.wait()
            # The client read again, and frames it sent before reading (a cancel, typically) arrive
            # with the same wake-up: let daphne read them before more audio goes out.
            for _ in range(RESUME_YIELDS):
                await asyncio.sleep(0)
        await self.input.handled()

    # IPushProducer, called by the transport on the reactor's (daphne's) event loop
    def pauseProducing(self) -> None:
        if self._writable.is_set():
            self.pauses += 1
            FlowControl.held += 1
            self._writable.clear()

    def resumeProducing(self) -> None:
        if not self._writable.is_set():
            FlowControl.held -= 1
            self._writable.set()

    def stopProducing(self) -> None:
        """The connection is gone: never hold a sender; the disconnect ends the session. `on_lost` runs
        first, in this turn of the loop: a hang-up stops the session's engine work before anything
        queued behind the disconnect (another client's text, typically) is handled."""
        if self.on_lost is not None:
            self.on_lost()
        self.resumeProducing()
