"""A session's one pending timeout (session.config's wait, then idleness): arming it again replaces
the last, and disarming voids it, also when it fired and the task it started has not run yet (a
frame handled in between wins)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from .errors import SpeechError


class Timeout:
    def __init__(
        self,
        expire: Callable[[SpeechError], Coroutine[Any, Any, None]],
        spawn: Callable[[Coroutine[Any, Any, None]], object],
    ) -> None:
        self._expire = expire  # run in a task of `spawn`'s with the armed error, unless disarmed first
        self._spawn = spawn
        self.handle: asyncio.TimerHandle | None = None

    def arm(self, seconds: float, error: SpeechError) -> None:
        self.disarm()
        handle: asyncio.TimerHandle  # the callback names its own handle, to know whether it is still armed
        handle = asyncio.get_running_loop().call_later(seconds, lambda: self._spawn(self._fire(error, handle)))
        self.handle = handle

    def disarm(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None

    async def _fire(self, error: SpeechError, handle: asyncio.TimerHandle) -> None:
        if handle is self.handle:
            await self._expire(error)
