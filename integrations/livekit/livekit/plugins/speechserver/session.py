"""One WebSocket session of the speech server, shared by the streams that use it one after another.

The protocol (docs/protocol.md, "Voice-agent extensions") speaks several contexts on one socket:
every event about a context carries its `context_id`, and binary frames belong to the last
`audio.start`. A reader task hands each context's events and audio to that context's queue; a
context that was cancelled or finished has no queue, so anything still in flight for it is
dropped: no stale audio reaches the next stream on the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from .log import logger

# The server closes a session after 30 s (its limits.idle_timeout_s) without a client frame while
# nothing is generating; keep-alives go every third of that, at most every 10 s.
KEEPALIVE_INTERVAL_S = 10.0


class SessionClosed(Exception):
    """The socket ended; every open context gets this."""


@dataclass(frozen=True)
class Audio:
    data: bytes


class Session:
    """A configured session: `open(context_id)` gives the context's queue of events (dicts), Audio
    and, if the socket ends, a SessionClosed."""

    def __init__(
        self,
        ws: aiohttp.ClientWebSocketResponse,
        configured: dict[str, Any],
        on_cancelled: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.ws = ws
        self.configured = configured
        self.on_cancelled = on_cancelled  # the server's input.cancelled for a context already let go
        idle_timeout_s = configured.get("limits", {}).get("idle_timeout_s") or 3 * KEEPALIVE_INTERVAL_S
        self.keepalive_every = min(KEEPALIVE_INTERVAL_S, idle_timeout_s / 3)
        self._queues: dict[str, asyncio.Queue[dict[str, Any] | Audio | SessionClosed]] = {}
        self._current: str | None = None  # the context of the last audio.start
        self._reader = asyncio.create_task(self._read(), name="speechserver.read")
        self._keepalive = asyncio.create_task(self._keep_alive(), name="speechserver.keepalive")

    @classmethod
    async def open_session(
        cls,
        http: aiohttp.ClientSession,
        url: str,
        config: dict[str, Any],
        *,
        headers: dict[str, str],
        timeout: float,
        on_cancelled: Callable[[dict[str, Any]], None] | None = None,
    ) -> Session:
        ws = await asyncio.wait_for(http.ws_connect(url, headers=headers), timeout)
        try:
            await ws.send_str(json.dumps({"type": "session.config", "session": config}))
            reply = await ws.receive(timeout=timeout)
            event = json.loads(reply.data) if reply.type == aiohttp.WSMsgType.TEXT else {}
            if event.get("type") != "session.configured":
                raise ConnectionError(event.get("message") or f"the server refused the session ({reply.type})")
        except BaseException:
            await ws.close()
            raise
        return cls(ws, event, on_cancelled)

    @property
    def alive(self) -> bool:
        return not self.ws.closed and not self._reader.done()

    def open(self, context_id: str) -> asyncio.Queue[dict[str, Any] | Audio | SessionClosed]:
        queue: asyncio.Queue[dict[str, Any] | Audio | SessionClosed] = asyncio.Queue()
        self._queues[context_id] = queue
        return queue

    def forget(self, context_id: str) -> None:
        """Nothing more of this context is wanted: what still arrives for it is dropped."""
        self._queues.pop(context_id, None)

    async def send(self, message: dict[str, Any]) -> None:
        await self.ws.send_str(json.dumps(message))

    async def aclose(self) -> None:
        self._keepalive.cancel()
        await self.ws.close()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        with contextlib.suppress(asyncio.CancelledError):
            await self._keepalive

    async def _read(self) -> None:
        try:
            async for message in self.ws:
                if message.type == aiohttp.WSMsgType.BINARY:
                    queue = self._queues.get(self._current) if self._current else None
                    if queue is not None:
                        queue.put_nowait(Audio(message.data))
                elif message.type == aiohttp.WSMsgType.TEXT:
                    self._dispatch(json.loads(message.data))
        finally:
            closed = SessionClosed(f"the speech server closed the session ({self.ws.close_code})")
            for queue in self._queues.values():
                queue.put_nowait(closed)

    def _dispatch(self, event: dict[str, Any]) -> None:
        context_id = event.get("context_id")
        if event["type"] == "audio.start":
            self._current = context_id
        elif event["type"] == "audio.done":
            self._current = None
        queue = self._queues.get(context_id) if context_id else None
        if queue is not None:
            queue.put_nowait(event)
        elif event["type"] == "input.cancelled" and self.on_cancelled is not None:
            self.on_cancelled(event)
        elif event["type"] == "error" and not context_id:
            logger.warning("speech server error: %s", event.get("message"))

    async def _keep_alive(self) -> None:
        while not self.ws.closed:
            await asyncio.sleep(self.keepalive_every)
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self.send({"type": "session.keepalive"})
